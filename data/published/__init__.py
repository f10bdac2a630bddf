"""Published SGLang measurements (JSON lines), shipped as package data: see README.md."""
