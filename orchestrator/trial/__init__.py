"""One trial, as a short composition of stages with typed inputs and outputs:

* :mod:`.plan`: config -> engine, load points, request spec, identity (validated once per job);
* :mod:`.session`: a live engine (start, ready, resolved config, stop, GPU release) or a virtual one;
* :mod:`.load_driver`: load points -> point results, records streamed to disk;
* :mod:`.recorder`: the one door to the trial directory and MLflow (redaction happens there);
* :mod:`.summary`: diagnosis facts, timings and the run description from the results;
* :mod:`.run`: the composition; :mod:`.hydra_job`: the Hydra task function's body.
"""
