"""Slices of public LLM-serving traces, installed as the data package ``parasweep_traces`` (see
vocab/assets.py and README.md here)."""
