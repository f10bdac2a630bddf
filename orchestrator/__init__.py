"""parasweep orchestrator: config schema and validation, trial lifecycle, engines, tracking."""
