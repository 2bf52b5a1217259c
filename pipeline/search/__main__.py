"""`python -m pipeline.search`: one search, from the composed config to its plan (pipeline/search/run.py)."""

from pipeline import cli
from pipeline.search.run import execute

cli.main("search", execute)
