"""parasweep's simulated engine: an SGLang-compatible server whose timing comes from a discrete-event model.

Run it as ``python -m simulator <SGLang flags> --sim-hardware <name>``. See docs/simulator.md.
"""

__version__ = "0.1.0"

# The SGLang release whose flags, endpoints, metric names and log formats the simulator follows.
SGLANG_COMPAT_VERSION = "0.5.23"
