"""``pd.*`` -> the flags of one prefill or decode server of a disaggregated trial, for one SGLang release,
and what that release refuses.

A role's server gets ``--disaggregation-mode``, the transfer backend, and on a prefill server the port of
its bootstrap server (the decode servers learn it from the router with each request). SGLang 0.5.9 alone
needs each side told the other's layout (``--disaggregation-decode-tp/-dp`` on the prefill server,
``--disaggregation-prefill-pp`` on the decode server); later releases ask the prefill's bootstrap server.
Each refusal mirrors the release's own check, with its message (recorded under "checks" in
``releases/sglang-<version>.json``), against the key the user can change. docs/disaggregation.md.
"""

from __future__ import annotations

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.sglang_compat.versions import Version, parse_version, release_facts
from orchestrator.errors import ConfigError

# SGLang's default bootstrap port: dry runs show prefill server i on this plus i
DEFAULT_BOOTSTRAP_PORT = 8998
# the last release that needs each side told the other's layout (the flags went in 0.5.10)
PEER_LAYOUT_FLAGS_UNTIL: Version = (0, 5, 9)
# the first release whose prefill server refuses the fake backend
PREFILL_REFUSES_FAKE_SINCE: Version = (0, 5, 10)
FAKE_ON_PREFILL = "Prefill server does not support 'fake' as the transfer backend"
TP_NOT_MULTIPLE = "Different tp size is supported only when one tp is multiple of the other."


def transfer_backends(version: str) -> list[str]:
    """The transfer backends the release's ``--disaggregation-transfer-backend`` accepts."""
    backends = release_facts(version).pd.get("transfer_backends", [])
    return [str(b) for b in backends] if isinstance(backends, list) else []


def refuse_what_the_release_refuses(cfg: ParasweepConf, version: str) -> None:
    """The release's own refusals of this role's server, with its message."""
    pd, v = cfg.pd, parse_version(version)
    backends = transfer_backends(version)
    if backends and pd.transfer_backend not in backends:
        raise ConfigError("pd.transfer_backend", pd.transfer_backend, ", ".join(backends),
                          f"SGLang {version}'s --disaggregation-transfer-backend has no such choice")
    if pd.role == "prefill" and pd.transfer_backend == "fake" and v >= PREFILL_REFUSES_FAKE_SINCE:
        raise ConfigError("pd.transfer_backend", "fake", "a backend that moves KV (mooncake, nixl) "
                          "with prefill servers; fake with pd.prefill.workers=0 (decode alone)",
                          f"SGLang {version}: {FAKE_ON_PREFILL}")
    if v <= PEER_LAYOUT_FLAGS_UNTIL:
        tp_p, tp_d = pd.prefill.tp or 1, pd.decode.tp or 1
        if max(tp_p, tp_d) % min(tp_p, tp_d):
            raise ConfigError("pd.decode.tp", tp_d, f"a multiple or a divisor of pd.prefill.tp={tp_p}",
                              f"SGLang {version}: {TP_NOT_MULTIPLE}")


def pd_flags(cfg: ParasweepConf, version: str) -> list[tuple[str, list[str], str, object]]:
    """(flag, values, config key, value) of a role's server; none outside disaggregation."""
    pd = cfg.pd
    if not pd.enabled or not pd.role:
        return []
    refuse_what_the_release_refuses(cfg, version)
    flags: list[tuple[str, list[str], str, object]] = [
        ("--disaggregation-mode", [pd.role], "pd.role", pd.role),
        ("--disaggregation-transfer-backend", [pd.transfer_backend], "pd.transfer_backend",
         pd.transfer_backend)]
    old = parse_version(version) <= PEER_LAYOUT_FLAGS_UNTIL
    if pd.role == "prefill":
        port = pd.bootstrap_port if pd.bootstrap_port is not None else DEFAULT_BOOTSTRAP_PORT
        flags.append(("--disaggregation-bootstrap-port", [str(port)], "pd.bootstrap_port", port))
        if old and pd.decode.tp != pd.prefill.tp:
            flags.append(("--disaggregation-decode-tp", [str(pd.decode.tp)], "pd.decode.tp", pd.decode.tp))
        if old and pd.decode.dp != pd.prefill.dp:
            flags.append(("--disaggregation-decode-dp", [str(pd.decode.dp)], "pd.decode.dp", pd.decode.dp))
    else:
        if pd.reserved_decode_tokens is not None:
            flags.append(("--num-reserved-decode-tokens", [str(pd.reserved_decode_tokens)],
                          "pd.reserved_decode_tokens", pd.reserved_decode_tokens))
        if old and (pd.prefill.pp or 1) > 1:
            flags.append(("--disaggregation-prefill-pp", [str(pd.prefill.pp)], "pd.prefill.pp",
                          pd.prefill.pp))
    return flags
