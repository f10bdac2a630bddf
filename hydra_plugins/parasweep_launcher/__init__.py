"""Hydra launcher plugin: each trial becomes a Ray task sized by its own GPU demand."""
