"""Engines a trial can launch. Both speak SGLang's flags and HTTP API; only the executable differs."""
