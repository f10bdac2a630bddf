"""Speculative decoding as SGLang runs it: the flags resolved the way SGLang resolves them
(``params.py``), the draft model's numbers (``drafts.py``), how many drafted tokens the target accepts
(``acceptance.py``) and what one draft-verify-extend iteration costs on the GPU (``iteration.py``).
docs/speculative.md describes the model and where each number comes from."""
