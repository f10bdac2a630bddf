"""Entry point: ``python -m simulator <SGLang flags>``, or ``python -m simulator serve MODEL <vLLM flags>``
to play vLLM (``simulator/vllm/``)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        from simulator.vllm.cli import main as play_vllm

        sys.exit(play_vllm())
    from simulator.cli import main

    sys.exit(main())
