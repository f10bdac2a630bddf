"""vLLM as a second engine: what each recorded release offers (its flags, routes and metrics, read from
its wheel by ``scripts/vllm_facts.py``) and the ``vllm serve`` command line a trial's config becomes,
checked against the release before anything launches (docs/vllm-adapter.md). Nothing here is SGLang's:
what both engines share is configured once and translated here; what only SGLang has is refused."""
