"""Predictions held against published measurements: the corpus, its replay, the comparison."""
