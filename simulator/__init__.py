"""parasweep's simulated engine: an SGLang-compatible server whose timing comes from a discrete-event model.

Run it as ``python -m simulator <SGLang flags> --sim-hardware <name>``; predict without serving with
``simulator.predict.predict_trial``. Everything is described in docs/simulator.md. Where each part is:

Configuration (flags in, resolved numbers out)
    ``cli.py``         SGLang's launch flags plus ``--sim-*``; ``main()``
    ``resolve.py``     validation and SGLang's auto defaults (memory tiers, KV pool, request pool);
                       ``FlagError`` for a configuration SGLang would refuse
    ``sim_config.py``  ``SimConfig``, the resolved configuration, and the ``/server_info`` dict
    ``model_spec.py``  a model's ``config.json`` -> parameters, bytes, KV size
    ``costs.py``       cost of one forward step per PP stage (roofline, or a step-cost source), hops,
                       host time
    ``kernel_tables.py`` measured kernel latencies (aiconfigurator-core's SGLang tables) and their
                       interpolation
    ``measured_costs.py`` a stage's forward priced operator by operator from those tables, with
                       per-operator roofline fallback
    ``step_costs.py``  which source prices a run (``--sim-step-costs``) and what it says about it
    ``estimates.py``   analytic decode-step estimates for the diagnosis (communication share, the
                       memory-bound floor)
    ``calibration.py`` calibration profiles: fitted constants with their sources (``--sim-calibration``)
    ``fit_tables.py``  fitting the constants to operator-profile tables (Vidur's), with held-out errors

The discrete-event model of one engine replica
    ``replica.py``     THE PP LOOP: ``ReplicaModel`` (stage 0 visiting the micro-batch slots, launch
                       through the stages, emit and return events)
    ``admission.py``   what goes into a micro-batch: waiting queue, request pool, KV budget, chunked prefill
    ``entities.py``    requests, prefill items, batches, slots, per-stage busy time
    ``timebase.py``    the event queue (``Simulation``) and the wall-clock driver (``LiveDriver``)

Serving (live mode)
    ``server.py``      aiohttp app: routes, health/info/control endpoints, process lifecycle
    ``generation.py``  ``/generate`` and the OpenAI endpoints (request defaults, stream formats)
    ``frontend.py``    requests in and tokens out between HTTP and the replicas (the tokenizer manager)
    ``text.py``        prompt token counts and placeholder text (there is no tokenizer)
    ``observer.py``    ``Reporter``: the replica's reports -> log lines and metrics
    ``logs.py``        SGLang-format log lines
    ``prometheus.py``  ``/metrics``: SGLang's ``sglang:`` series and the ``parasweep_sim:`` series
    ``gpus.py``        simulated GPU telemetry (``GET /parasweep_sim/gpus``): the same columns as NVML
    ``faults.py``      fault injection (``--sim-fault-*``): crashes, start-up failures, a deadlocked
                       engine, stalled / cut / malformed streams, HTTP 500s

Prediction (virtual time)
    ``predict.py``     the same replica model driven by a virtual load-generator client
"""

__version__ = "0.1.0"

# The SGLang release whose flags, endpoints, metric names and log formats the simulator follows.
SGLANG_COMPAT_VERSION = "0.5.23"
