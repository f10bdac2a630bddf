"""Keep secrets out of MLflow: params, tags, run names and uploaded artifacts.

A value is secret when its key or flag name says so (``api_key``, ``--api-key``, ``hf_token``,
``password``, ...), or when it is the password part of a URL (``http://user:pass@host``). Secrets are
replaced by ``***``; files that may echo them (the engine's log, its /server_info) are uploaded as
redacted copies. Local trial directories keep the originals: they are the user's own files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from itertools import pairwise
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
_SECRET_WORDS = {"token", "secret", "password", "passwd", "apikey", "credential", "credentials"}
_SECRET_PAIRS = {("api", "key"), ("auth", "key"), ("private", "key"), ("access", "key")}


def is_secret_name(name: str) -> bool:
    """By whole words, so ``hf_token`` and ``--api-key`` are secret but ``--skip-tokenizer-init`` and
    ``max_total_tokens`` are not."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return any(w in _SECRET_WORDS for w in words) or any(p in _SECRET_PAIRS for p in pairwise(words))


def redact_url(text: str) -> str:
    """``scheme://user:pass@host/...`` -> ``scheme://user:***@host/...`` (anything else unchanged)."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if not parts.password:
        return text
    netloc = parts.netloc.replace(f":{parts.password}@", f":{MASK}@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def redact_mapping(data: Any) -> Any:
    """A copy of nested dicts/lists with secret-named keys masked and URL passwords removed."""
    if isinstance(data, Mapping):
        return {k: (MASK if is_secret_name(str(k)) and v not in (None, "", False) else redact_mapping(v))
                for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact_mapping(v) for v in data]
    if isinstance(data, str):
        return redact_url(data)
    return data


def redact_argv(argv: Iterable[str]) -> list[str]:
    """Mask the value after (or in ``--flag=value``) a secret-named flag, and URL passwords."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
        elif arg.startswith("-") and is_secret_name(arg.split("=", 1)[0]):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + MASK)
            else:
                out.append(arg)
                hide_next = True
        else:
            out.append(redact_override(arg))
    return out


def redact_override(override: str) -> str:
    """A Hydra override ``+server.extra_args.api_key=X`` -> ``...api_key=***``."""
    key, sep, _ = override.partition("=")
    if sep and is_secret_name(key.rsplit(".", 1)[-1]):
        return f"{key}={MASK}"
    return redact_url(override)


def secret_values(data: Any) -> set[str]:
    """The secret values in a config, to scrub from free text such as a server log."""
    found: set[str] = set()
    if isinstance(data, Mapping):
        for k, v in data.items():
            if is_secret_name(str(k)) and isinstance(v, str | int) and len(str(v)) >= 4:
                found.add(str(v))
            else:
                found |= secret_values(v)
    elif isinstance(data, list | tuple):
        for v in data:
            found |= secret_values(v)
    elif isinstance(data, str):
        password = urlsplit(data).password if "://" in data else None
        if password and len(password) >= 4:
            found.add(password)
    return found


def redact_text(text: str, secrets: Iterable[str]) -> str:
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text
