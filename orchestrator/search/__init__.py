"""The search: a space of layouts and knobs (``search.space``) judged in prediction, each candidate at
the highest load it sustains within the SLOs, ranked by an objective (docs/search.md)."""
