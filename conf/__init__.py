"""The Hydra config tree, installed as the data package ``parasweep_conf`` (see vocab/assets.py)."""
