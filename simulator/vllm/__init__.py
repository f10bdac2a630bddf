"""The simulated engine playing vLLM (``python -m simulator serve MODEL <vLLM flags> --sim-*``).

The same model of the hardware and the same step costs as when it plays SGLang; what differs is what a
client and a scraper see, and how a step is scheduled:

    ``releases.py``   what differs between the vLLM releases it plays (defaults, log wording)
    ``cli.py``        ``vllm serve``'s flags (the subset parasweep builds) -> the simulator's configuration
    ``scheduler.py``  vLLM's scheduler: one token budget per step shared by decodes and prefill chunks,
                      ``--max-num-seqs``, preemption by recompute when the KV cache runs out
    ``reporter.py``   the replica's reports -> ``vllm:`` metrics and the periodic stats line
    ``metrics.py``    ``/metrics`` with vLLM's series
    ``logs.py``       vLLM-format log lines
    ``server.py``     the HTTP side: vLLM's OpenAI endpoints only

docs/simulator.md, "Playing vLLM", describes it.
"""
