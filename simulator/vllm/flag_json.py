"""The JSON object a vLLM config flag takes (``--compilation-config``, ``--speculative-config``,
``--kv-transfer-config``), read once for all of them, a refusal naming the flag where it is not one."""

from __future__ import annotations

import json
from typing import Any


def json_object(flag: str, text: str, error: type[ValueError]) -> dict[str, Any]:
    """``text``, the value of ``flag``, as a JSON object; ``error`` where it is not JSON or not an object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{flag} {text!r}: not JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise error(f"{flag} {text!r}: not a JSON object")
    return value
