"""Read a vLLM release's own source and write down, as JSON, what a vLLM adapter relies on.

    python scripts/vllm_facts.py 0.34.0 0.19.1             # downloads each wheel (pip, no dependencies)
    python scripts/vllm_facts.py --wheel vllm-0.19.1-cp38-abi3-manylinux_2_31_x86_64.whl
    python scripts/vllm_facts.py --check 0.34.0            # regenerate and compare with the committed file

Nothing is installed or imported from the wheel (vLLM's argument code imports torch): its Python files are
parsed (``ast``) straight from the zip. What it extracts:

- ``flags``: every option ``vllm serve`` accepts, with its argparse ``dest``, whether it takes a value,
  its negation where it has one, and its ``choices``. vLLM declares most options as fields of its config
  dataclasses and turns each field into an option by the field's type (``get_kwargs``): a ``bool`` field
  becomes ``--x``/``--no-x`` (``BooleanOptionalAction``), a field that is ``bool | str | None`` takes an
  optional value, a ``Literal[...]`` field lists its choices, anything else takes a value. The reader
  follows each ``add_argument`` call of the engine's and the server's argument code to the field it
  names (``**model_kwargs["max_model_len"]``, or every field of a class whose kwargs a loop registers),
  resolves the field's annotation (type aliases across the config modules included) and applies the
  same rules; an explicit ``action``, ``choices`` or ``dest`` in the call wins.
- ``routes``: the HTTP paths and methods of the OpenAI-compatible server (route decorators,
  ``add_api_route`` and mounted apps such as ``/metrics`` under ``vllm/entrypoints/``, the old demo
  ``api_server.py`` left out).
- ``metrics``: the Prometheus metric names the engine registers (``vllm:...``, the speculative
  decoding counters beside the drafters included) and their type; a counter is exposed with ``_total``
  added.
- ``log_formats``: the format strings of the log lines a trial would read: the periodic stats line,
  which the engine assembles from parts ("Avg prompt throughput: %.1f tokens/s", "Running: %d reqs",
  "GPU KV cache usage: %.1f%%", ...), the speculative-decoding line ("SpecDecoding metrics: ..."), and
  the start-up facts (the KV cache's size in tokens, the concurrency it allows).
- ``speculative_methods``: the ``method`` values ``--speculative-config`` accepts (``SpeculativeConfig``).
- ``kv_transfer``: what ``--kv-transfer-config`` and the NIXL connector take and give: the ``kv_role``
  values (``KVTransferConfig``), the keys of the ``kv_transfer_params`` a prefill server answers with
  (``request_finished`` of the connector's scheduler side; the pull mode's from 0.34), and the defaults of
  ``VLLM_NIXL_SIDE_CHANNEL_PORT`` and ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` (``envs.py``).

Each file names the wheel and its SHA-256; the output is sorted, so the same wheel gives the same bytes.
The files land in ``orchestrator/engines/vllm_compat/releases/`` (docs/vllm-adapter.md).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "orchestrator" / "engines" / "vllm_compat" / "releases"
NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "help", "version"}
METRIC_KINDS = ("gauge", "counter", "histogram", "summary", "info")  # in the constructor's name, any case
METRIC_NAME = re.compile(r"^vllm:[a-z0-9_]+$")
# the log lines a trial would read: a format string is kept when it contains one of these
LOG_KEYWORDS = (
    "throughput:",
    " reqs",
    "KV cache usage",
    "cache hit rate",
    "Preemptions",
    "GPU KV cache size",
    "Maximum concurrency",
)
# the speculative-decoding line ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput:
# ...") and its counters live beside the drafters
SPEC_METRICS = "vllm/v1/spec_decode/metrics.py"
LOG_FILES = ("vllm/v1/metrics/loggers.py", "vllm/v1/core/kv_cache_utils.py", "vllm/engine/metrics.py",
             SPEC_METRICS)
ROUTE_METHODS = {"get", "post", "put", "delete", "patch", "api_route"}


class Sources:
    """The release's Python files under ``vllm/``, parsed on demand."""

    def __init__(self, wheel: zipfile.ZipFile) -> None:
        self.text = {
            n: wheel.read(n).decode("utf-8", "replace")
            for n in wheel.namelist()
            if n.startswith("vllm/") and n.endswith(".py")
        }
        self._trees: dict[str, ast.Module] = {}

    def tree(self, name: str) -> ast.Module:
        if name not in self._trees:
            self._trees[name] = ast.parse(self.text[name])
        return self._trees[name]

    def defining(self, needle: str) -> list[str]:
        """The files whose text contains ``needle``, sorted."""
        return sorted(n for n, t in self.text.items() if needle in t)


# ---------------------------------------------------------------------------------------------- types


def _config_files(src: Sources) -> list[str]:
    """Where vLLM's config dataclasses and type aliases live (a package from 0.10, one module before)."""
    return sorted(
        n
        for n in src.text
        if n.startswith("vllm/config")
        or n in ("vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py")
        or n.endswith("/cli_args.py")
    )


def _classes_and_aliases(
    src: Sources,
) -> tuple[dict[str, dict[str, ast.expr]], dict[str, list[str]], dict[str, ast.expr]]:
    """(class name -> {field: annotation} with its bases' fields, class name -> its bases, alias name -> the
    type it stands for) over the config files."""
    classes: dict[str, dict[str, ast.expr]] = {}
    bases: dict[str, list[str]] = {}
    aliases: dict[str, ast.expr] = {}
    for name in _config_files(src):
        for node in src.tree(name).body:
            if isinstance(node, ast.ClassDef):
                fields = {
                    s.target.id: s.annotation
                    for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                }
                classes.setdefault(node.name, fields)
                bases.setdefault(node.name, [_name(b) for b in node.bases])
            elif (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                aliases.setdefault(node.targets[0].id, node.value)
            elif (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.value is not None
            ):
                aliases.setdefault(node.target.id, node.value)  # X: TypeAlias = Literal[...]
            elif type(node).__name__ == "TypeAlias":  # `type X = ...` (3.12 syntax)
                aliases.setdefault(node.name.id, node.value)  # type: ignore[attr-defined]

    # a field may name an alias another module defines (the chat template's content format, the MoE
    # backends): every module's top-level Literal aliases, after the config files' own
    for name in sorted(src.text):
        if "Literal" not in src.text[name] or name in _config_files(src):
            continue
        try:
            body = src.tree(name).body
        except SyntaxError:
            continue
        for node in body:
            target = (
                node.targets[0]
                if isinstance(node, ast.Assign) and len(node.targets) == 1
                else node.target
                if isinstance(node, ast.AnnAssign)
                else None
            )
            if (
                isinstance(target, ast.Name)
                and node.value is not None
                and isinstance(node.value, ast.Subscript)
                and _name(node.value.value) == "Literal"
            ):
                aliases.setdefault(target.id, node.value)

    def inherited(cls: str, seen: frozenset[str] = frozenset()) -> dict[str, ast.expr]:
        fields: dict[str, ast.expr] = {}
        for base in bases.get(cls, []):  # a dataclass's fields begin with its bases'
            if base in classes and base not in seen:
                fields |= inherited(base, seen | {cls})
        return fields | classes.get(cls, {})

    return {cls: inherited(cls) for cls in classes}, bases, aliases


def _parts(
    node: ast.expr, aliases: dict[str, ast.expr], seen: frozenset[str] = frozenset()
) -> Iterator[object]:
    """The members of a field's type: "bool", "str", "None", ("Literal", values), or another name."""
    if isinstance(node, ast.Constant):
        if node.value is None:
            yield "None"
        elif isinstance(node.value, str):  # a string annotation
            try:
                yield from _parts(ast.parse(node.value, mode="eval").body, aliases, seen)
            except SyntaxError:
                yield node.value
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        yield from _parts(node.left, aliases, seen)
        yield from _parts(node.right, aliases, seen)
        return
    if isinstance(node, ast.Subscript):
        head = _name(node.value)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Literal":
            yield ("Literal", tuple(_literal_values(args, aliases, seen)))
        elif head in ("Optional",):
            yield "None"
            yield from _parts(args[0], aliases, seen)
        elif head == "Union":
            for a in args:
                yield from _parts(a, aliases, seen)
        elif head in ("Annotated", "SkipValidation") and _is_union(args[0]):
            # vLLM's type-hint reader does not open a union inside an annotation: the field takes a string
            yield "Union"
        elif head in ("Annotated", "ClassVar", "InitVar", "Final", "SkipValidation"):
            yield from _parts(args[0], aliases, seen)
        else:
            yield head
        return
    name = _name(node)
    if name in aliases and name not in seen:
        yield from _parts(aliases[name], aliases, seen | {name})
    elif name:
        yield name


def _is_union(node: ast.expr) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)) or (
        isinstance(node, ast.Subscript) and _name(node.value) in ("Optional", "Union")
    )


def _literal_values(
    args: list[ast.expr], aliases: dict[str, ast.expr], seen: frozenset[str]
) -> Iterator[object]:
    """A Literal's values, a nested Literal's (``Literal["auto", RunnerType]``) flattened as typing does."""
    for a in args:
        if isinstance(a, ast.Constant):
            yield a.value
            continue
        for part in _parts(a, aliases, seen):
            if isinstance(part, tuple):
                yield from part[1]


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _field_kind(annotation: ast.expr | None, aliases: dict[str, ast.expr]) -> dict[str, object]:
    """How ``get_kwargs`` turns a field of this type into an option (module doc)."""
    if annotation is None:
        return {"value": True}
    parts = list(_parts(annotation, aliases))
    simple = {p for p in parts if isinstance(p, str)}
    literals = [v for p in parts if isinstance(p, tuple) for v in p[1]]
    if simple == {"bool", "str", "None"} and not literals:
        return {"value": "optional"}
    if "bool" in simple:
        return {"value": False, "negation": True}
    if literals and "str" not in simple:  # beside str, the values are only a hint (argparse metavar)
        choices = [v for v in literals if v is not None]
        if "None" in simple or None in literals:  # an optional field also accepts the word None
            choices.append("None")
        return {"value": True, "choices": choices}
    return {"value": True}


# ---------------------------------------------------------------------------------------------- flags


def _kwargs_class(call: ast.expr, owner: str) -> str | None:
    """``get_kwargs(X)`` -> "X" (``get_kwargs(cls)`` inside class ``owner`` -> "cls:owner": whichever
    subclass the method is called on)."""
    if isinstance(call, ast.Call) and _name(call.func) == "get_kwargs" and call.args:
        arg = _name(call.args[0])
        return f"cls:{owner}" if arg == "cls" else arg
    return None


def _registering(cls: str, called: set[str], bases: dict[str, list[str]]) -> list[str]:
    """The classes whose fields a ``get_kwargs`` of ``cls`` registers: a plain class itself; for
    "cls:C", every class the server's parser calls ``add_cli_args`` on that is C or derives from it."""
    if not cls.startswith("cls:"):
        return [cls]
    owner = cls[4:]

    def derives(c: str, seen: frozenset[str] = frozenset()) -> bool:
        return c == owner or any(derives(b, seen | {c}) for b in bases.get(c, []) if b not in seen)

    return sorted(c for c in called if derives(c)) or [owner]


def _literal_list(node: ast.expr) -> list | None:
    if isinstance(node, ast.List | ast.Tuple):
        values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        return values if len(values) == len(node.elts) else None
    return None


def _flags_in(
    tree: ast.Module,
    classes: dict[str, dict[str, ast.expr]],
    bases: dict[str, list[str]],
    aliases: dict[str, ast.expr],
    called: set[str],
    flags: dict[str, dict],
) -> None:
    for owner_node in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)] + [tree]:
        owner = owner_node.name if isinstance(owner_node, ast.ClassDef) else ""
        funcs = [
            n
            for n in (owner_node.body if isinstance(owner_node, ast.ClassDef) else tree.body)
            if isinstance(n, ast.FunctionDef)
        ]
        for func in funcs:
            kwargs_of: dict[str, str] = {}  # variable -> config class whose get_kwargs it holds
            loop_of: dict[str, str] = {}  # loop variable -> config class (for key, value in X_kwargs.items())
            held: dict[str, ast.expr] = {}  # variable -> the X_kwargs["field"] it was given
            listed: dict[str, list[str]] = {}  # loop variable -> the option strings a literal list gives it
            for node in ast.walk(func):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                ):
                    cls = _kwargs_class(node.value, owner)
                    if cls:
                        kwargs_of[node.targets[0].id] = cls
                    elif isinstance(node.value, ast.Subscript):  # moe_kwargs = kernel_kwargs["moe_backend"]
                        held[node.targets[0].id] = node.value
                if (
                    isinstance(node, ast.For)
                    and isinstance(node.target, ast.Tuple)
                    and isinstance(node.iter, ast.Call)
                    and isinstance(node.iter.func, ast.Attribute)
                    and isinstance(node.iter.func.value, ast.Name)
                    and node.iter.func.value.id in kwargs_of
                    and len(node.target.elts) == 2
                ):
                    value_var = node.target.elts[1]
                    if isinstance(value_var, ast.Name):
                        loop_of[value_var.id] = kwargs_of[node.iter.func.value.id]
                # for arg, type in [("--guided-decoding-backend", str), ...]: add_argument(arg, type=type)
                if isinstance(node, ast.For) and isinstance(node.iter, ast.List | ast.Tuple):
                    first = node.target.elts[0] if isinstance(node.target, ast.Tuple) else node.target
                    heads = [e.elts[0] if isinstance(e, ast.Tuple) and e.elts else e for e in node.iter.elts]
                    options = [
                        h.value for h in heads if isinstance(h, ast.Constant) and isinstance(h.value, str)
                    ]
                    if isinstance(first, ast.Name) and options and all(o.startswith("-") for o in options):
                        listed[first.id] = options
            for var, cls in list(kwargs_of.items()):
                kwargs_of[var] = _registering(cls, called, bases)[0]
            loop_of = {var: ",".join(_registering(cls, called, bases)) for var, cls in loop_of.items()}
            for call in ast.walk(func):
                if not (isinstance(call, ast.Call) and _name(call.func) == "add_argument"):
                    continue
                for k in call.keywords:  # **moe_kwargs: the field it holds
                    if k.arg is None and isinstance(k.value, ast.Name) and k.value.id in held:
                        k.value = held[k.value.id]
                if call.args and isinstance(call.args[0], ast.Name) and call.args[0].id in listed:
                    for option in listed[call.args[0].id]:
                        one = ast.Call(call.func, [ast.Constant(option), *call.args[1:]], call.keywords)
                        _one_flag(one, kwargs_of, loop_of, classes, aliases, flags)
                    continue
                _one_flag(call, kwargs_of, loop_of, classes, aliases, flags)


def _unpacked(node: ast.expr) -> Iterator[ast.expr | tuple[str, ast.expr]]:
    """What a ``**`` argument holds: ``**{**kwargs["x"], "default": None}`` is the reference
    ``kwargs["x"]`` and the explicit key "default"."""
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                yield from _unpacked(value)
            elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                yield (key.value, value)
    else:
        yield node


def _one_flag(
    call: ast.Call,
    kwargs_of: dict[str, str],
    loop_of: dict[str, str],
    classes: dict[str, dict[str, ast.expr]],
    aliases: dict[str, ast.expr],
    flags: dict[str, dict],
) -> None:
    names = [
        a.value
        for a in call.args
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
    ]
    explicit = {k.arg: k.value for k in call.keywords if k.arg}
    starred: list[ast.expr] = []
    for k in call.keywords:
        if k.arg is None:
            for part in _unpacked(k.value):
                if isinstance(part, tuple):
                    explicit[part[0]] = part[1]
                else:
                    starred.append(part)
    field_kind: dict[str, object] = {"value": True}
    for value in starred:
        # **model_kwargs["max_model_len"]: that field of the class model_kwargs holds the kwargs of
        if (
            isinstance(value, ast.Subscript)
            and isinstance(value.value, ast.Name)
            and value.value.id in kwargs_of
            and isinstance(value.slice, ast.Constant)
        ):
            cls, field = kwargs_of[value.value.id], value.slice.value
            field_kind = _field_kind(classes.get(cls, {}).get(field), aliases)
        # for key, value in frontend_kwargs.items(): add_argument(f"--{key...}", **value): every field
        elif isinstance(value, ast.Name) and value.id in loop_of and not names:
            for cls in loop_of[value.id].split(","):
                for field, annotation in classes.get(cls, {}).items():
                    if not field.startswith("_"):
                        _record(
                            flags, ["--" + field.replace("_", "-")], field, _field_kind(annotation, aliases)
                        )
            return
    if not names:
        return
    kind = dict(field_kind)
    action = explicit.get("action")
    action_name = action.value if isinstance(action, ast.Constant) else _name(action) if action else ""
    if action_name in NO_VALUE_ACTIONS:
        kind = {"value": False}
    elif action_name == "BooleanOptionalAction":
        kind = {"value": False, "negation": True}
    elif (
        "nargs" in explicit and isinstance(explicit["nargs"], ast.Constant) and explicit["nargs"].value == "?"
    ):
        kind["value"] = "optional"
    if "choices" in explicit:
        listed = _literal_list(explicit["choices"])
        if listed is not None:
            kind["choices"] = listed
    dest_node = explicit.get("dest")
    longs = [n for n in names if n.startswith("--")]
    dest = (
        dest_node.value
        if isinstance(dest_node, ast.Constant)
        else (longs[0] if longs else names[0]).lstrip("-").replace("-", "_")
    )
    _record(flags, names, dest, kind)


def _record(flags: dict[str, dict], names: list[str], dest: str, kind: dict[str, object]) -> None:
    entry: dict[str, object] = {"dest": dest, "value": kind.get("value", True)}
    if kind.get("choices"):
        entry["choices"] = sorted({str(c) for c in kind["choices"]})  # type: ignore[union-attr]
    for name in names:
        flags[name] = dict(entry)
        if kind.get("negation") and name.startswith("--"):
            flags[entry_negation(name)] = {"dest": dest, "value": False, "negates": name}


def entry_negation(name: str) -> str:
    return "--no-" + name[2:]


def read_flags(src: Sources) -> dict[str, dict]:
    classes, bases, aliases = _classes_and_aliases(src)
    flags: dict[str, dict] = {}
    files = sorted(
        n
        for n in {
            "vllm/engine/arg_utils.py",
            *src.defining("def make_arg_parser"),
            *src.defining("class FrontendArgs"),
            *src.defining("def subparser_init"),
        }
        # the batch runner's and the other subcommands' own parsers are not `vllm serve`'s
        if not (n.endswith("run_batch.py") or ("/cli/" in n and not n.endswith("serve.py")))
    )
    # the argument classes the server's parser registers (FrontendArgs.add_cli_args(parser), ...)
    called = {
        _name(c.func.value)
        for name in files
        for c in ast.walk(src.tree(name))
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "add_cli_args"
    }
    for name in files:
        _flags_in(src.tree(name), classes, bases, aliases, called, flags)
    return dict(sorted(flags.items()))


# ---------------------------------------------------------------------------------------- routes, metrics


def read_routes(src: Sources) -> dict[str, list[str]]:
    routes: dict[str, set[str]] = {}
    for name in sorted(src.text):
        if not name.startswith("vllm/entrypoints/") or name == "vllm/entrypoints/api_server.py":
            continue
        if "router" not in src.text[name] and "add_api_route" not in src.text[name]:
            continue
        for node in ast.walk(src.tree(name)):
            if not isinstance(node, ast.Call):
                continue
            method = _name(node.func)
            if method in ("Mount", "mount"):  # an ASGI app under a path: the Prometheus /metrics
                method = "get"
            elif not isinstance(node.func, ast.Attribute) or method not in ROUTE_METHODS | {"add_api_route"}:
                continue
            if not (
                node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and node.args[0].value.startswith("/")
            ):
                continue
            path = node.args[0].value
            if method in ("api_route", "add_api_route"):
                methods = next((_literal_list(k.value) for k in node.keywords if k.arg == "methods"), None)
                routes.setdefault(path, set()).update(m.upper() for m in (methods or ["GET"]))
            else:
                routes.setdefault(path, set()).add(method.upper())
    return {p: sorted(m) for p, m in sorted(routes.items())}


def read_metrics(src: Sources) -> dict[str, str]:
    metrics: dict[str, str] = {}
    for name in sorted(src.text):
        if "vllm:" not in src.text[name] or not (
            name.startswith("vllm/v1/metrics/") or name in ("vllm/engine/metrics.py", SPEC_METRICS)
        ):
            continue
        for node in ast.walk(src.tree(name)):
            if not isinstance(node, ast.Call):
                continue
            callee = _name(node.func)
            kind = next((k for k in METRIC_KINDS if k in callee.lower()), None)
            given = next((k.value for k in node.keywords if k.arg == "name"), None)
            if given is None and node.args:
                given = node.args[0]
            if (
                kind
                and isinstance(given, ast.Constant)
                and isinstance(given.value, str)
                and METRIC_NAME.match(given.value)
            ):
                metrics.setdefault(given.value, kind)
        metrics |= {m: k for m, k in _looped_metrics(src.tree(name)).items() if m not in metrics}
    return dict(sorted(metrics.items()))


def _looped_metrics(tree: ast.Module) -> dict[str, str]:
    """Metrics a function registers in a loop (``for name, doc in (("vllm:x", "..."), ...):
    Counter(name=name, ...)``, 0.34's speculative counters): each (name, ...) tuple of a function whose
    metric constructor takes its name from a variable."""
    found: dict[str, str] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        kinds = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                kind = next((k for k in METRIC_KINDS if k in _name(node.func).lower()), None)
                given = next((k.value for k in node.keywords if k.arg == "name"), None)
                if kind and isinstance(given, ast.Name):
                    kinds.add(kind)
        if len(kinds) != 1:
            continue
        for node in ast.walk(fn):
            if (isinstance(node, ast.Tuple) and node.elts and isinstance(node.elts[0], ast.Constant)
                    and isinstance(node.elts[0].value, str) and METRIC_NAME.match(node.elts[0].value)):
                found[node.elts[0].value] = next(iter(kinds))
    return found


def read_log_formats(src: Sources) -> list[str]:
    found: set[str] = set()
    for name in LOG_FILES:
        if name not in src.text:
            continue
        for node in ast.walk(src.tree(name)):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "%" in node.value
                and any(k in node.value for k in LOG_KEYWORDS)
            ):
                found.add(node.value)
    return sorted(found)


def read_speculative_methods(src: Sources) -> list[str]:
    """The ``method`` values ``--speculative-config`` takes (``SpeculativeConfig.method``'s Literal, its
    nested aliases flattened)."""
    classes, _, aliases = _classes_and_aliases(src)
    annotation = classes.get("SpeculativeConfig", {}).get("method")
    if annotation is None:
        return []
    values = {str(v) for part in _parts(annotation, aliases) if isinstance(part, tuple) for v in part[1]}
    return sorted(values)


def read_kv_transfer(src: Sources) -> dict[str, object]:
    """``--kv-transfer-config``'s roles, the NIXL connector's answer keys and its environment defaults."""
    classes, _, aliases = _classes_and_aliases(src)
    annotation = classes.get("KVTransferConfig", {}).get("kv_role")
    roles = sorted({str(v) for part in (_parts(annotation, aliases) if annotation is not None else [])
                    if isinstance(part, tuple) for v in part[1]})
    base = "vllm/distributed/kv_transfer/kv_connector/v1/"
    where = [n for n in (base + "nixl/pull_scheduler.py", base + "nixl_connector.py") if n in src.text][:1]
    keys: list[str] = []
    for name in where:
        for fn in ast.walk(src.tree(name)):
            if isinstance(fn, ast.FunctionDef) and fn.name == "request_finished":
                for call in ast.walk(fn):
                    if isinstance(call, ast.Call) and _name(call.func) == "dict":
                        names = [k.arg for k in call.keywords if k.arg]
                        if "remote_engine_id" in names:
                            keys = names
    env = src.text.get("vllm/envs.py", "")
    defaults = {}
    for var in ("VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"):
        found = re.search(rf'os\.getenv\(\s*"{var}",\s*"(\d+)"', env)
        if found:
            defaults[var] = int(found.group(1))
    return {"kv_roles": roles, "nixl_params": keys, "env_defaults": defaults}


# ---------------------------------------------------------------------------------------------- driver


def facts(wheel_path: Path) -> dict:
    match = re.match(r"vllm-([^-]+)-", wheel_path.name)
    if not match:
        raise SystemExit(f"{wheel_path.name}: not a vLLM wheel name (vllm-<version>-...whl)")
    digest = hashlib.sha256(wheel_path.read_bytes()).hexdigest()
    with zipfile.ZipFile(wheel_path) as z:
        src = Sources(z)
    return {
        "vllm_version": match.group(1),
        "wheel": wheel_path.name,
        "wheel_sha256": digest,
        "flags": read_flags(src),
        "routes": read_routes(src),
        "metrics": read_metrics(src),
        "log_formats": read_log_formats(src),
        "speculative_methods": read_speculative_methods(src),
        "kv_transfer": read_kv_transfer(src),
    }


def download(version: str, into: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "-q", "-d", str(into)],
        check=True,
    )
    return next(into.glob(f"vllm-{version}-*.whl"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("versions", nargs="*", help="vLLM releases to download and read")
    p.add_argument("--wheel", action="append", default=[], help="a wheel already downloaded")
    p.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    args = p.parse_args()
    if not args.versions and not args.wheel:
        p.error("give a version or --wheel")
    with tempfile.TemporaryDirectory(prefix="vllm-facts-") as tmp:
        wheels = [Path(w) for w in args.wheel] + [download(v, Path(tmp)) for v in args.versions]
        differ = 0
        for wheel in wheels:
            data = facts(wheel)
            out = OUT / f"vllm-{data['vllm_version']}.json"
            text = json.dumps(data, indent=1, sort_keys=True) + "\n"
            if args.check:
                same = out.is_file() and out.read_text() == text
                differ += not same
                print(f"{out.name}: {'matches' if same else 'DIFFERS from'} {wheel.name}")
            else:
                OUT.mkdir(parents=True, exist_ok=True)
                out.write_text(text)
                print(
                    f"{out}: {len(data['flags'])} flags, {len(data['routes'])} routes, "
                    f"{len(data['metrics'])} metrics"
                )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
