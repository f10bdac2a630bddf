"""Log lines rendered from an SGLang release's own format strings (recorded by scripts/sglang_facts.py
in orchestrator/engines/sglang_compat/releases/), so a parser test reads what that release prints,
not a line someone wrote to match the parser.

A format string is the release's source text: an f-string (pieces joined), a plain string, or a
%-style string. ``render`` fills each placeholder with the value given for its expression, keyed by
the expression's source (``"num_tokens"``, ``"self.capture_bs"``), and applies the placeholder's
format spec and conversion as Python would; %-style strings take ``percent=(...)``. A placeholder
without a value is an error, so a release that changed its wording fails the test that renders it.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path

RELEASES = Path(__file__).resolve().parents[1] / "orchestrator" / "engines" / "sglang_compat" / "releases"
CONVERSIONS = {115: str, 114: repr, 97: ascii}


def format_strings(version: str, anchor: str, file_suffix: str = "", starts: bool = False) -> list[str]:
    """The release's recorded format strings (source text) whose fixed text contains ``anchor`` (begins
    with it, with ``starts``), in files whose path ends with ``file_suffix``."""
    data = release_record(version)
    def fits(source: str) -> bool:
        text = fixed_text(source)
        return text.startswith(anchor) if starts else anchor in text

    found = [f["source"] for f in data["log_formats"]
             if f["file"].endswith(file_suffix) and fits(f["source"])]
    return sorted(set(found), key=len, reverse=True)  # the whole string before its pieces


@functools.cache
def release_record(version: str) -> dict:
    return json.loads((RELEASES / f"sglang-{version}.json").read_text())


@functools.cache
def fixed_text(source: str) -> str:
    """A format string's fixed text, each placeholder as ``{}``."""
    node = _expr(source)
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def _expr(source: str) -> ast.expr:
    try:
        return ast.parse(source, mode="eval").body
    except SyntaxError:  # a docstring or a piece that is not an expression on its own
        return ast.Constant(value="")


def render(source: str, values: Mapping[str, object] | None = None, percent: tuple[object, ...] = ()
           ) -> str:
    node = _expr(source)
    values = values or {}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value % percent if percent else node.value
    if not isinstance(node, ast.JoinedStr):
        raise ValueError(f"not a format string: {source}")
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            out.append(str(part.value))
            continue
        assert isinstance(part, ast.FormattedValue)
        key = ast.unparse(part.value)
        if key not in values:
            raise KeyError(f"no value for placeholder {{{key}}} in {source}")
        value = values[key]
        if part.conversion in CONVERSIONS:
            value = CONVERSIONS[part.conversion](value)
        spec = render(ast.unparse(part.format_spec), values) if part.format_spec is not None else ""
        out.append(format(value, spec))
    return "".join(out)


def matches_a_format(version: str, message: str) -> bool:
    """Whether a whole log message could have come from one of the release's recorded format strings
    (each placeholder, or %-conversion, standing for any text)."""
    for entry in release_record(version)["log_formats"]:
        parts = re.split(r"\{\}|%(?:\.\d+)?[dsf]", fixed_text(entry["source"]))
        pattern = ".*?".join(re.escape(p) for p in parts)
        if (len(parts) > 1 or parts[0]) and re.fullmatch(pattern, message, flags=re.S):
            return True
    return False
