"""Model config directories, installed as the data package ``parasweep_models`` (see vocab/assets.py)."""
