"""A vLLM server's part in a disaggregated deployment (``pd.*``): its KV connector and its side channel.

Every server of the deployment runs vLLM's NIXL connector (``--kv-transfer-config``); vllm-router decides
per request which server prefills and which decodes, so the role is the request's, not the server's.
Up to 0.19 both roles run ``kv_role: kv_both``; 0.34 deprecates it for ``kv_producer`` (prefill) and
``kv_consumer`` (decode). Every recorded release takes all three (its choices are read from its wheel, and
a test holds these to them). Each server's NIXL side channel, where the decode servers read its KV, is
``VLLM_NIXL_SIDE_CHANNEL_HOST:PORT``: a free port per server, since two vLLM servers on one host would
otherwise both take the default 5600 (docs/vllm-adapter.md, "Disaggregation").
"""

from __future__ import annotations

import json

from packaging.version import Version

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.base import HOST
from orchestrator.engines.launch_args import Arg

FLAG = "--kv-transfer-config"
CONNECTOR = "NixlConnector"
SPLIT_ROLES_SINCE = Version("0.34")  # kv_both deprecated for kv_producer / kv_consumer


def kv_role(role: str, version: str) -> str:
    """The ``kv_role`` a server of ``role`` (prefill or decode) runs with on vLLM ``version``."""
    if Version(version) < SPLIT_ROLES_SINCE:
        return "kv_both"
    return "kv_producer" if role == "prefill" else "kv_consumer"


def kv_transfer_config(role: str, version: str) -> str:
    """``--kv-transfer-config``'s value for a server of ``role`` on vLLM ``version``."""
    return json.dumps({"kv_connector": CONNECTOR, "kv_role": kv_role(role, version)}, separators=(",", ":"))


def kv_transfer_args(cfg: ParasweepConf, version: str) -> list[Arg]:
    """``--kv-transfer-config`` for one server of a disaggregated deployment; none for any other server."""
    if not cfg.pd.enabled or not cfg.pd.role:
        return []
    return [Arg(FLAG, [kv_transfer_config(cfg.pd.role, version)], "pd.transfer_backend",
                cfg.pd.transfer_backend)]


def side_channel_env(port: int) -> dict[str, str]:
    """The environment that puts a server's NIXL side channel on ``port`` of this machine."""
    return {"VLLM_NIXL_SIDE_CHANNEL_HOST": HOST, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}
