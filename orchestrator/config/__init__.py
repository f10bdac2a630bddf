"""Structured config schema (Hydra/OmegaConf) and validation before anything launches."""
