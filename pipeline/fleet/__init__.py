"""Several models planned on one inventory (`python -m pipeline.search +fleet=NAME`)."""
