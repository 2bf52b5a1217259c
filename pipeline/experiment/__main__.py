"""`python -m pipeline.experiment +experiment=NAME`: a thesis chapter-5 experiment (pipeline/experiment/run.py)."""

from pipeline import cli
from pipeline.experiment.run import task

cli.main("search", task)
