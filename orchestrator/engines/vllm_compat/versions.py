"""The recorded vLLM releases and their facts (``releases/vllm-<version>.json``, written by
``scripts/vllm_facts.py`` from each release's wheel; docs/vllm-adapter.md)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

from orchestrator.errors import UserError

NEWEST_KNOWN = "0.34.0"
# the releases aiconfigurator-core's served vLLM rows ran (0.11.2 to 0.19.0) and the newest
RECORDED = ("0.11.2", "0.12.0", "0.15.1", "0.16.0", "0.17.0", "0.18.0", "0.19.0", "0.34.0")


@dataclass(frozen=True)
class Flag:
    """One option of ``vllm serve``: its argparse dest, whether it takes a value (True, False, or
    "optional"), and its choices where the release lists them."""

    name: str
    dest: str
    value: bool | str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class VLLMRelease:
    version: str
    wheel: str
    flags: dict[str, Flag]
    routes: dict[str, tuple[str, ...]]
    metrics: dict[str, str]  # name as registered -> gauge | counter | histogram | ...
    speculative_methods: tuple[str, ...] = ()  # what --speculative-config's "method" takes
    kv_roles: tuple[str, ...] = ()  # what --kv-transfer-config's "kv_role" takes
    nixl_params: tuple[str, ...] = ()  # the kv_transfer_params a NIXL prefill server answers with

    @property
    def source(self) -> str:
        return f"flags read from {self.wheel}"


class UnknownRelease(UserError):
    """A vLLM version parasweep has no record of; the message lists the recorded ones."""


@functools.cache
def release(version: str) -> VLLMRelease:
    """The recorded facts of vLLM ``version`` (one of RECORDED)."""
    if version not in RECORDED:
        raise UnknownRelease(f"vLLM {version}: no record of its flags; valid: {', '.join(RECORDED)}")
    path = resources.files("orchestrator.engines.vllm_compat.releases") / f"vllm-{version}.json"
    data = json.loads(path.read_text())
    flags = {name: Flag(name, f["dest"], f["value"], tuple(f.get("choices", ())))
             for name, f in data["flags"].items()}
    return VLLMRelease(data["vllm_version"], data["wheel"], flags,
                       {p: tuple(m) for p, m in data["routes"].items()}, data["metrics"],
                       tuple(data["speculative_methods"]), tuple(data["kv_transfer"]["kv_roles"]),
                       tuple(data["kv_transfer"]["nixl_params"]))
