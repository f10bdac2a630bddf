"""Read an SGLang release's own source and write down, as JSON, what parasweep's adapter relies on.

    python scripts/sglang_facts.py 0.5.23 0.5.9            # downloads each wheel (pip, no dependencies)
    python scripts/sglang_facts.py --wheel sglang-0.5.9-py3-none-any.whl
    python scripts/sglang_facts.py --check 0.5.23 0.5.9    # regenerate and compare with the committed files

Nothing is installed or imported from the wheel: its Python files are parsed (``ast``) straight from the
zip, so this runs anywhere, without a GPU, torch or SGLang's dependencies. What it extracts:

- ``flags``: every option the server's argument parser accepts (``ServerArgs.add_cli_args``), with its
  argparse ``dest``, whether it takes a value and, where the source lists them, its ``choices`` (a
  literal list, a module-level list it names, or a ``Literal[...]`` field type). Up to 0.5.13 the
  release calls ``parser.add_argument``; 0.5.14 to 0.5.19 declare annotated fields (``A[type,
  Arg(...)]``) on ``ServerArgs`` itself, and from 0.5.20 in the namespace classes ``_INPUT_NAMESPACES``
  lists, which a helper turns into arguments; each is read the way the release itself registers it.
- ``routes``: the HTTP server's paths and methods (decorators, ``add_api_route``, the ``/metrics`` mount).
- ``metrics``: Prometheus metric names as exposed (a counter gains ``_total``), their type and literal
  label names, and the label keys the scheduler attaches to its metrics.
- ``log_formats``: the format strings of the log lines the adapter reads (batch lines, start-up facts),
  as they appear in the source.
- ``env``: the ``SGLANG_*`` environment variables the release reads.
- ``checks``: the assertions and raised errors of the server-argument code that constrain the flags the
  adapter sets (parallel sizes, the served model name, speculative decoding), as source text with their
  file.
- ``spec_auto_params``: the speculative-decoding steps, top-k and draft tokens the release chooses by
  itself, branch by branch.

Each file names the wheel and its SHA-256; the output is sorted, so the same wheel gives the same bytes.
The files land in ``orchestrator/engines/sglang_compat/releases/`` (docs/sglang-adapter.md).
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

OUT = Path(__file__).resolve().parents[1] / "orchestrator" / "engines" / "sglang_compat" / "releases"
SERVER_ARGS = "sglang/srt/server_args.py"
NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "help", "version"}
# log lines the adapter reads (orchestrator/telemetry/server_log.py): a format string is kept when it
# contains one of these
LOG_KEYWORDS = ("Decode batch", "Prefill batch", "KV Cache is allocated", "KV Cache VA upper bound",
                "max_running_requests", "max_total_num_tokens", "Capture cuda graph", "CUDA graph end",
                "cuda graph", "musa graph", "expert parallel size", "Attention backend not specified",
                "incompatible with overlap schedule", "breakable prefill", "fired up and ready to roll",
                "Load weight end", "token usage", "mamba usage",
                # lines assembled from placeholders ("{cache_name} {'...' if ... else 'is allocated'}.
                # dtype: ..., #tokens: ...", "Capture {name} {graph} end. bs=..."): their fixed parts
                "#tokens:", "end. bs=", "graph bs", " begin. backend=",
                # the pieces a batch line is assembled from (msg += ...)
                "#running-req", "#queue-req", "#new-seq", "gen throughput", "input throughput", "#token:",
                "mamba num", "#swa token", "#full token",
                # speculative decoding: the batch line's acceptance, and the defaults it changes
                "accept len: ", "accept rate: ", "Max running requests is reset",
                "speculative_num_draft_tokens is", "spec v2", "speculative decoding does not support",
                # prefill/decode disaggregation: the queues each role's batch line adds, the start-up
                # changes each role makes
                "#bootstrap-req", "#prealloc-req", "#transfer-req", "#inflight-req", "#optimistic-req",
                "pre-allocated usage",
                "#retracted-req", "forced as chunk cache", "Radix cache is disabled for decode",
                "Cuda graph is disabled for prefill")
# server-argument checks that constrain what the adapter sets: kept when their source mentions one
CHECK_WORDS = ("attn_dp_size", "dp_size", "tp_size", "pp_size", "ep_size", "moe_dp_size",
               "enable_dp_attention", "served_model_name", "pp_max_micro_batch_size", "pp_async_batch_depth",
               "speculative_algorithm", "speculative_eagle_topk", "speculative_num_draft_tokens",
               "speculative decoding", "SGLANG_ENABLE_PP_SPEC",
               "disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_decode_tp",
               "disaggregation_decode_dp", "disaggregation_prefill_pp",
               "disaggregation_decode_allocation_policy", "disaggregation_decode_enable_radix_cache",
               "smaller_tp",  # 0.5.9's prefill-against-decode TP check (validate_disagg_tp_size)
               # attention DP and expert parallelism
               "moe_a2a_backend", "deepep_mode", "enable_eplb", "ep_num_redundant_experts",
               "moe_dense_tp_size", "enable_dp_lm_head", "load_balance_method")
# prefill/decode disaggregation: the server fields whose defaults the adapter and the simulated roles rely on
PD_FIELDS = ("disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_bootstrap_port",
             "disaggregation_decode_polling_interval", "disaggregation_decode_allocation_policy",
             "num_reserved_decode_tokens", "disaggregation_decode_extra_slots", "optimistic_prefill_attempts")
CHECK_FILES = re.compile(r"^sglang/srt/(server_args\.py|arg_groups/[^/]+\.py)$")


# ---- reading the wheel -------------------------------------------------------------------------------

def sources(wheel: Path) -> dict[str, str]:
    """Every Python file of the ``sglang`` package in the wheel, by path inside it."""
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n).decode("utf-8", "replace") for n in sorted(z.namelist())
                if n.startswith("sglang/") and n.endswith(".py")}


def release_version(wheel: Path) -> str:
    """The version in the wheel's own metadata (``sglang/version.py`` of some releases is a placeholder
    their build fills in elsewhere)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        m = re.search(r"^Version:\s*(\S+)", z.read(meta).decode(), re.M) if meta else None
    if not m:
        raise SystemExit(f"sglang_facts: {wheel.name} has no METADATA with a Version")
    return m.group(1)


_PARSED: dict[str, ast.Module | None] = {}  # one wheel's files by path (cleared for each wheel)


def _tree(name: str, text: str) -> ast.Module | None:
    if name not in _PARSED:
        try:
            _PARSED[name] = ast.parse(text)
        except SyntaxError:  # a file for another Python version: not ours to read
            _PARSED[name] = None
    return _PARSED[name]


def _trees(files: dict[str, str], pattern: str) -> Iterator[tuple[str, ast.Module]]:
    rx = re.compile(pattern)
    for name, text in files.items():
        if rx.search(name) and (tree := _tree(name, text)) is not None:
            yield name, tree


_LINES: dict[int, list[str]] = {}


def _segment(text: str, node: ast.AST) -> str:
    """``ast.get_source_segment``, without splitting the whole file again for every node."""
    lines = _LINES.setdefault(id(text), text.splitlines(keepends=True))
    start, end = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined,operator]
    if start == end:
        return lines[start].encode()[node.col_offset:node.end_col_offset].decode()  # type: ignore[attr-defined]
    first = lines[start].encode()[node.col_offset:].decode()  # type: ignore[attr-defined]
    last = lines[end].encode()[:node.end_col_offset].decode()  # type: ignore[attr-defined]
    return first + "".join(lines[start + 1:end]) + last


def _literal(node: ast.AST | None) -> object:
    try:
        return ast.literal_eval(node) if node is not None else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _name(node: ast.AST | None) -> str:
    """``store_true`` for a string, ``DeprecatedAction`` for a name or ``x.DeprecatedAction``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


# ---- flags ---------------------------------------------------------------------------------------------

def _action_nargs_defaults(files: dict[str, str]) -> dict[str, object]:
    """Custom argparse actions of the release -> the ``nargs`` default of their ``__init__``."""
    found: dict[str, object] = {}
    for _, tree in _trees(files, r"^sglang/srt/"):
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"),
                        None)
            if init is None or not any(_name(b) == "Action" for b in cls.bases):
                continue
            args = init.args
            positional = args.posonlyargs + args.args
            defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]],
                                args.defaults, strict=True))
            defaults |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d}
            found[cls.name] = _literal(defaults["nargs"]) if "nargs" in defaults else None
    return found


def _takes_value(action: str, nargs: ast.AST | None, custom: dict[str, object]) -> bool:
    if nargs is not None:
        return _literal(nargs) != 0
    if action in NO_VALUE_ACTIONS or action == "BooleanOptionalAction":
        return False
    return custom.get(action) != 0


def _dest(options: list[str]) -> str:
    """argparse's rule: the first long option (else the first), without dashes, '-' -> '_'."""
    first = next((o for o in options if o.startswith("--")), options[0])
    return first.lstrip("-").replace("-", "_")


def _constants(files: dict[str, str]) -> dict[str, list[object]]:
    """Module-level lists and tuples of literals in the release's server code (choice lists such as
    ``MOE_A2A_BACKEND_CHOICES``), by name; the first definition of a name wins."""
    found: dict[str, list[object]] = {}
    for _, tree in _trees(files, r"^sglang/srt/(server_args\.py|arg_groups/)"):
        for node in tree.body:
            named = isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name)
            if named:
                value = _literal(node.value)
                if isinstance(value, list | tuple) and value:
                    found.setdefault(node.targets[0].id, list(value))
    return found


def _choices(node: ast.AST | None, consts: dict[str, list[object]]) -> list[object] | None:
    """An argument's ``choices``: a literal list, or the name of a module-level one."""
    if node is None:
        return None
    value = _literal(node)
    if isinstance(value, list | tuple):
        return list(value)
    return consts.get(node.id) if isinstance(node, ast.Name) else None


def _literal_type(typ: ast.AST) -> list[object] | None:
    """The values of a ``Literal[...]`` annotation (inside ``Optional`` too), else None."""
    if isinstance(typ, ast.Subscript) and _name(typ.value) == "Optional":
        return _literal_type(typ.slice)
    if isinstance(typ, ast.Subscript) and _name(typ.value) == "Literal":
        elts = typ.slice.elts if isinstance(typ.slice, ast.Tuple) else [typ.slice]
        values = [_literal(e) for e in elts]
        return values if all(v is not None for v in values) else None
    return None


def _with_choices(flag: dict[str, object], choices: list[object] | None) -> dict[str, object]:
    return flag | {"choices": choices} if choices else flag


def _add_argument_flags(fn: ast.FunctionDef, custom: dict[str, object], consts: dict[str, list[object]]
                        ) -> list[dict[str, object]]:
    flags = []
    for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
            continue
        options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not options or len(options) != len(call.args):
            continue  # an option string computed at run time: not a flag the adapter can rely on
        action = _name(_kw(call, "action"))
        if action == "BooleanOptionalAction":
            options += [f"--no-{o[2:]}" for o in options if o.startswith("--")]
        dest = _literal(_kw(call, "dest")) or _dest(options)
        takes = _takes_value(action, _kw(call, "nargs"), custom)
        flags.append(_with_choices({"options": options, "dest": dest, "takes_value": takes},
                                   _choices(_kw(call, "choices"), consts)))
    return flags


def _namespace_classes(files: dict[str, str]) -> dict[str, ast.ClassDef]:
    return {cls.name: cls for _, tree in _trees(files, r"^sglang/srt/arg_groups/fields/")
            for cls in tree.body if isinstance(cls, ast.ClassDef)}


def _field_flags(cls: ast.ClassDef, classes: dict[str, ast.ClassDef], custom: dict[str, object],
                 consts: dict[str, list[object]]) -> list[dict[str, object]]:
    """The arguments a namespace class's ``A[T, "help"]`` / ``A[T, Arg(...)]`` fields register (bases
    first, as a struct inherits its bases' fields). A field declared twice is registered once, as
    declared last (0.5.16's ServerArgs declares ``dcp_size`` twice; the dataclass keeps the second)."""
    by_field: dict[str, dict[str, object] | None] = {}
    for base in cls.bases:
        if _name(base) in classes:
            inherited = _field_flags(classes[_name(base)], classes, custom, consts)
            by_field |= {str(f["dest"]): f for f in inherited}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            by_field[stmt.target.id] = _field_flag(stmt.target.id, stmt.annotation, custom, consts)
    return [f for f in by_field.values() if f is not None]


def _field_flag(field: str, ann: ast.expr, custom: dict[str, object], consts: dict[str, list[object]]
                ) -> dict[str, object] | None:
    """The argument one annotated field registers; None where it registers none."""
    if not (isinstance(ann, ast.Subscript) and _name(ann.value) == "A" and isinstance(ann.slice, ast.Tuple)):
        return None
    typ, meta = ann.slice.elts[0], ann.slice.elts[1]
    if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
        arg: ast.Call | None = None
    elif isinstance(meta, ast.Call) and _name(meta.func) == "Arg":
        arg = meta
    else:
        return None  # Derived(...) and the like: not a command-line input
    if arg is not None and _literal(_kw(arg, "no_cli")) is True:
        return None
    cli = (_literal(_kw(arg, "cli_name")) if arg is not None else None) or "--" + field.replace("_", "-")
    aliases = (_literal(_kw(arg, "aliases")) if arg is not None else None) or []
    action = _name(_kw(arg, "action")) if arg is not None else ""
    nargs = _kw(arg, "nargs") if arg is not None else None
    takes = _takes_value(action, nargs, custom) if action else not _is_bool(typ)
    options = [cli, *aliases]
    if action == "BooleanOptionalAction":  # argparse adds the --no- forms itself
        options += [f"--no-{o[2:]}" for o in options if o.startswith("--")]
    choices = (_choices(_kw(arg, "choices"), consts) if arg is not None else None) or _literal_type(typ)
    return _with_choices({"options": options, "dest": field, "takes_value": takes}, choices)


def _is_bool(typ: ast.AST) -> bool:
    """``bool`` or ``Optional[bool]`` (registered as store_true)."""
    if _name(typ) == "bool":
        return True
    if isinstance(typ, ast.Subscript) and _name(typ.value) == "Optional":
        return _name(typ.slice) == "bool"
    if isinstance(typ, ast.BinOp) and isinstance(typ.op, ast.BitOr):  # bool | None
        names = {_name(typ.left), _name(typ.right)}
        return names == {"bool", "None"} or (names == {"bool", ""} and _literal(typ.right) is None)
    return False


def flags(files: dict[str, str]) -> list[dict[str, object]]:
    tree = ast.parse(files[SERVER_ARGS])
    server_args = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    add_cli = next(f for f in server_args.body if isinstance(f, ast.FunctionDef) and f.name == "add_cli_args")
    custom = _action_nargs_defaults(files)
    consts = _constants(files)
    found = [{"options": ["-h", "--help"], "dest": "help", "takes_value": False}]  # argparse's own
    calls = [c for c in ast.walk(add_cli) if isinstance(c, ast.Call)]
    if any(_name(c.func) == "add_cli_args_from_dataclass" for c in calls):
        classes = _namespace_classes(files)
        listed = next((n.value for n in tree.body if isinstance(n, ast.Assign)
                       and any(_name(t) == "_INPUT_NAMESPACES" for t in n.targets)), None)
        if listed is None:  # 0.5.14 to 0.5.19: the annotated fields are ServerArgs's own
            found += _field_flags(server_args, classes, custom, consts)
        elif not isinstance(listed, ast.List):
            raise SystemExit("sglang_facts: ServerArgs is built from namespaces, "
                             "but _INPUT_NAMESPACES is not a list")
        else:
            for ns in listed.elts:
                found += _field_flags(classes[_name(ns)], classes, custom, consts)
    found += _add_argument_flags(add_cli, custom, consts)
    return sorted(found, key=lambda f: f["options"][0])  # type: ignore[index]


# ---- HTTP routes ---------------------------------------------------------------------------------------

def routes(files: dict[str, str]) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {}
    for _, tree in _trees(files, r"^sglang/srt/entrypoints/http_server\.py$"):
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            func = call.func
            if not (isinstance(func, ast.Attribute) and _name(func.value) in ("app", "router")):
                continue
            path = _literal(call.args[0]) if call.args else _literal(_kw(call, "path"))
            if not isinstance(path, str) or not path.startswith("/"):
                continue
            if func.attr in ("get", "post", "put", "delete", "patch"):
                methods = [func.attr.upper()]
            elif func.attr in ("api_route", "add_api_route"):
                methods = _literal(_kw(call, "methods")) or ["GET"]
            else:
                continue
            found.setdefault(path, set()).update(str(m).upper() for m in methods)  # type: ignore[union-attr]
    for _, tree in _trees(files, r"^sglang/srt/"):  # prometheus_client's app, mounted where it is set up
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            if _name(call.func) == "Mount" and call.args and _literal(call.args[0]) == "/metrics":
                found.setdefault("/metrics", set()).add("GET")
    return {path: sorted(methods) for path, methods in sorted(found.items())}


# ---- Prometheus metrics -----------------------------------------------------------------------------

def metrics(files: dict[str, str]) -> dict[str, object]:
    found: dict[str, dict[str, object]] = {}
    for _, tree in _trees(files, r"^sglang/srt/"):
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            kind = _name(call.func)
            if kind not in ("Gauge", "Counter", "Histogram", "Summary"):
                continue
            name = _literal(_kw(call, "name")) or (_literal(call.args[0]) if call.args else None)
            if not isinstance(name, str) or not name.startswith("sglang:"):
                continue
            exposed = name if kind != "Counter" or name.endswith("_total") else name + "_total"
            labels = _kw(call, "labelnames")
            literal = _literal(labels)
            entry = found.setdefault(exposed, {"type": kind.lower(), "labelnames": set()})
            entry["labelnames"].add(  # type: ignore[union-attr]
                ",".join(literal) if isinstance(literal, (list, tuple)) else
                (f"<{ast.unparse(labels)}>" if labels is not None else ""))
    return {"series": {n: {"type": e["type"], "labelnames": sorted(e["labelnames"])}  # type: ignore[arg-type]
                       for n, e in sorted(found.items())},
            **_scheduler_labels(files)}


def _scheduler_labels(files: dict[str, str]) -> dict[str, list[str]]:
    """The label keys of the scheduler's metrics (``labelnames=labels.keys()``): the dict literal with
    ``model_name`` and ``engine_type`` that also names a rank (the tokenizer's has no rank; releases
    whose only such dict has none label every series with those two alone), plus the keys its function
    adds under a condition (``labels["dp_rank"] = ...``)."""
    candidates: list[tuple[set[str], set[str]]] = []
    for _, tree in _trees(files, r"^sglang/srt/"):
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for d in (n for n in ast.walk(fn) if isinstance(n, ast.Dict)):
                keys = {k for k in (_literal(k) for k in d.keys) if isinstance(k, str)}
                if {"model_name", "engine_type"} <= keys:
                    added = {_literal(t.slice) for a in ast.walk(fn) if isinstance(a, ast.Assign)
                             for t in a.targets
                             if isinstance(t, ast.Subscript) and _name(t.value) == "labels"}
                    candidates.append((keys, {k for k in added if isinstance(k, str)} - keys))
    ranked = [c for c in candidates if "tp_rank" in c[0]] or candidates
    return {"scheduler_labels": sorted({k for keys, _ in ranked for k in keys}),
            "scheduler_labels_conditional": sorted({k for _, extra in ranked for k in extra})}



# ---- log format strings ------------------------------------------------------------------------------

def _skeleton(node: ast.AST) -> str:
    """A format string's fixed text, each placeholder as ``{}`` (implicitly joined pieces are one)."""
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def log_formats(files: dict[str, str]) -> list[dict[str, str]]:
    found = set()
    for path, text in files.items():
        if not path.startswith("sglang/srt/"):
            continue
        tree = _tree(path, text)
        if tree is None:
            continue
        for node in ast.walk(tree):
            skeleton = _skeleton(node)
            if not skeleton or len(skeleton) >= 2000:
                continue
            source = " ".join(_segment(text, node).split())
            # the device's graph label of a batch line ("cuda graph: True") is all placeholders
            if any(k in skeleton for k in LOG_KEYWORDS) or "graph_backend" in source:
                found.add((path, source))
    return [{"file": f, "source": s} for f, s in sorted(found)]


# ---- environment and checks ----------------------------------------------------------------------------

def env_vars(files: dict[str, str]) -> list[str]:
    names = set()
    for text in files.values():
        names.update(re.findall(r"\b(SGLANG_[A-Z0-9_]+)\b", text))
    return sorted(names)


def checks(files: dict[str, str]) -> list[dict[str, str]]:
    found = set()
    for path, tree in _trees(files, CHECK_FILES.pattern):
        text = files[path]
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert):
                segment = _segment(text, node)
            elif isinstance(node, ast.If) and any(isinstance(s, ast.Raise) for s in node.body):
                raise_ = next(s for s in node.body if isinstance(s, ast.Raise))
                segment = f"if {_segment(text, node.test)}: " \
                          f"{_segment(text, raise_)}"
            else:
                continue
            if any(re.search(rf"\b{w}\b", segment) for w in CHECK_WORDS):
                found.add((path, " ".join(segment.split())))
    return [{"file": f, "source": s} for f, s in sorted(found)]


# ---- speculative decoding's automatic parameters -----------------------------------------------------------

def spec_auto_params(files: dict[str, str]) -> list[dict[str, object]]:
    """The (num_steps, eagle_topk, num_draft_tokens) SGLang picks when none is given: each branch of its
    ``auto_choose_speculative_params`` (a ``ServerArgs`` method up to 0.5.19, a hook function later) as the
    branch's condition, source text, and the tuple it returns; the final ``else`` as condition "else"."""
    found: list[dict[str, object]] = []
    for path, tree in _trees(files, CHECK_FILES.pattern):
        text = files[path]
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                   and n.name.lstrip("_") == "auto_choose_speculative_params"):
            for node in ast.walk(fn):
                if not isinstance(node, ast.If):
                    continue
                branches = [(node.test, node.body)]
                if node.orelse and not isinstance(node.orelse[0], ast.If):
                    branches.append((None, node.orelse))
                for test, body in branches:
                    returned = _literal(body[-1].value) if isinstance(body[-1], ast.Return) else None
                    if isinstance(returned, tuple):
                        found.append({"file": path, "when": "else" if test is None else
                                      " ".join(_segment(text, test).split()), "returns": list(returned)})
    return found


# ---- prefill/decode disaggregation ------------------------------------------------------------------------

def pd_facts(files: dict[str, str]) -> dict[str, object]:
    """The transfer backends ``--disaggregation-transfer-backend`` accepts (the release's module-level
    ``DISAGG_TRANSFER_BACKEND_CHOICES`` list) and the defaults of the PD fields in ``PD_FIELDS`` (class-level
    annotated assignments of ``ServerArgs`` or, from 0.5.20, its namespace classes)."""
    backends: list[object] = []
    defaults: dict[str, object] = {}
    # from 0.5.20 the fields live in the namespace classes of arg_groups/fields/
    for _, tree in _trees(files, r"^sglang/srt/(server_args\.py|arg_groups/.+\.py)$"):
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id ==
                                                    "DISAGG_TRANSFER_BACKEND_CHOICES" for t in node.targets):
                value = _literal(node.value)
                if isinstance(value, list):
                    backends = value
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                        and stmt.target.id in PD_FIELDS and stmt.value is not None:
                    defaults[stmt.target.id] = _literal(stmt.value)
    return {"transfer_backends": backends, "defaults": dict(sorted(defaults.items()))}


# ---- the whole record ------------------------------------------------------------------------------------

def facts(wheel: Path) -> dict[str, object]:
    files = sources(wheel)
    _PARSED.clear()
    _LINES.clear()
    return {
        "sglang_version": release_version(wheel),
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "how": "scripts/sglang_facts.py: the wheel's Python source parsed with ast, nothing imported",
        "flags": flags(files),
        "routes": routes(files),
        "metrics": metrics(files),
        "log_formats": log_formats(files),
        "env": env_vars(files),
        "checks": checks(files),
        "spec_auto_params": spec_auto_params(files),
        "pd": pd_facts(files),
    }


def render(data: dict[str, object]) -> str:
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def download(version: str, into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64", "--platform", "any",
                    f"sglang=={version}", "-d", str(into)], check=True)
    wheels = sorted(into.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        raise SystemExit(f"sglang_facts: pip found no wheel of sglang=={version}")
    return wheels[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", help="SGLang versions to download from the package index")
    parser.add_argument("--wheel", action="append", default=[], type=Path, help="a wheel already here")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the JSON files go (default {OUT})")
    parser.add_argument("--check", action="store_true", help="compare with the files in --out, write nothing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sglang-wheels-") as tmp:
        wheels = [*args.wheel, *(download(v, Path(tmp)) for v in args.versions)]
        if not wheels:
            parser.error("name at least one version or --wheel")
        differ = 0
        for wheel in wheels:
            data = facts(wheel)
            path = args.out / f"sglang-{data['sglang_version']}.json"
            text = render(data)
            if args.check:
                same = path.exists() and path.read_text() == text
                differ += not same
                print(f"{path.name}: {'same' if same else 'DIFFERS'} ({wheel.name})")
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                print(f"{path}: {len(data['flags'])} flags, {len(data['routes'])} routes, "  # type: ignore[arg-type]
                      f"{len(data['metrics']['series'])} metrics ({wheel.name})")  # type: ignore[index]
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
