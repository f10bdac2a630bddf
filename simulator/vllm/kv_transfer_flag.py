"""``--kv-transfer-config``, read as vLLM reads it: its own checks, then the one connector the simulated
engine plays (``simulator/vllm/nixl.py``). Apart from the connector so that checking a command line (the
parser, every CLI start) does not load the connector's HTTP side channel."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.vllm.flag_json import json_object

NIXL = "NixlConnector"
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


class KVTransferConfigError(ValueError):
    """A ``--kv-transfer-config`` vLLM refuses, or one the simulated engine does not model."""


@dataclass(frozen=True)
class KVTransferConf:
    connector: str
    role: str


def parse_kv_transfer_config(text: str) -> KVTransferConf:
    """``--kv-transfer-config``'s JSON: vLLM's own checks (``KVTransferConfig.__post_init__``), then the
    one connector the simulated engine plays."""
    raw = json_object("--kv-transfer-config", text, KVTransferConfigError)
    connector, role = raw.get("kv_connector"), raw.get("kv_role")
    if role is not None and role not in KV_ROLES:
        raise KVTransferConfigError(f"Unsupported kv_role: {role}. Supported roles are {list(KV_ROLES)}")
    if connector is not None and role is None:
        raise KVTransferConfigError("Please specify kv_role when kv_connector is set, supported roles are "
                                    f"{list(KV_ROLES)}")
    if connector != NIXL:
        raise KVTransferConfigError(f"kv_connector {connector!r} is not modelled by the simulated engine "
                                    f"(modelled: {NIXL})")
    return KVTransferConf(connector, role)
