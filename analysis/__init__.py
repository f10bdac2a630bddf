"""Turning a trial's records and telemetry into summaries, findings, plots and sweep tables."""
