"""Which Ray a sweep runs on, said plainly.

- ``ray.address`` null: a fresh local Ray instance of the sweep's own, whatever else is on the
  machine. Ray's own ``ray.init()`` without an address would follow ``RAY_ADDRESS`` or the file
  ``ray start`` leaves in Ray's temp directory (``ray_current_cluster``) to another cluster, even one
  that no longer exists; ``address="local"`` never does. The instance listens on loopback only
  (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray's single-machine mode, in which its node address is
  127.0.0.1 and every server binds there) and keeps Ray's token authentication on.
- ``ray.address=auto`` or ``host:port``: join that cluster with its resources as they are (Ray
  refuses ``num_gpus``/``num_cpus`` when joining), after checking that it can be reached.

Ray's notices reach the user only where they matter: the notice that token authentication is on
(printed on every local start) is filtered out of Ray's log; the protection itself stays on.
docs/platform-notes.md, Ray.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.schema import joins_cluster
from orchestrator.errors import UserError

AUTH_MODE_ENV = "RAY_AUTH_MODE"
# Ray's single-machine switch (named for the platforms where it is the default): node address
# 127.0.0.1, so the GCS, raylet, workers and agents bind to loopback instead of every interface
LOOPBACK_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
CONNECT_TIMEOUT_S = 5.0
TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


class _TokenNoticeFilter(logging.Filter):
    """Drops Ray's "Token authentication is enabled ... Set RAY_AUTH_MODE=disabled to opt out" notice:
    it tells a user who did not ask about Ray how to turn a protection off. Ray's other warnings (a
    token missing or refused) pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


_TOKEN_NOTICE_FILTER = _TokenNoticeFilter()


@dataclass(frozen=True)
class ClusterInfo:
    """What the sweep runs on: a local instance of its own, or the cluster it joined."""

    joined: str | None  # the address given (ray.address), None for the sweep's own local instance
    gcs_address: str
    nodes: int
    gpus: int
    largest_node_gpus: int

    def describe(self) -> str:
        """One line for the start of the sweep."""
        gpus = f"{self.gpus} GPU(s)" + (f", at most {self.largest_node_gpus} on one node"
                                        if self.nodes > 1 else "")
        if self.joined is None:
            return (f"Ray: a local instance of this sweep's own at {self.gcs_address} (loopback only), "
                    f"{gpus}")
        return (f"Ray: joined the cluster at {self.gcs_address} (ray.address={self.joined}): "
                f"{self.nodes} node(s), {gpus}")


def _token_file() -> Path:
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def _check_reachable(address: str) -> None:
    """A ``host:port`` that nothing answers on is one line, before Ray spends a minute retrying."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"ray.address={address}: not an address; valid: null (a local Ray of the "
                        "sweep's own), auto (the cluster started on this machine with `ray start`) "
                        "or host:port of a Ray cluster's head (GCS)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise UserError(f"ray.address={address}: no Ray cluster answers there ({exc.strerror or exc}); "
                        "valid: the host:port of a running cluster's head (`ray status` on it shows "
                        "it), auto, or null for a local Ray of the sweep's own") from None


def _join_kwargs(address: str) -> dict[str, Any]:
    if address != "auto":
        _check_reachable(address)
    # A cluster started on this host has a token (Ray >= 2.59); a client with an explicit address must
    # say so itself ("auto" finds it on its own). Set before Ray reads its configuration.
    if address != "auto" and AUTH_MODE_ENV not in os.environ and _token_file().exists():
        os.environ[AUTH_MODE_ENV] = "token"
    return {"address": address}


def _local_kwargs(num_gpus: int | None, num_cpus: int | None) -> dict[str, Any]:
    os.environ[LOOPBACK_ONLY_ENV] = "0"
    # keep warmed, idle workers alive between trials (Ray reaps idle workers above this limit)
    kwargs: dict[str, Any] = {"address": "local", "_system_config": {"num_workers_soft_limit": 64}}
    if num_gpus is not None:
        kwargs["num_gpus"] = int(num_gpus)
    if num_cpus is not None:
        kwargs["num_cpus"] = int(num_cpus)
    return kwargs


def init_ray(address: str | None, num_gpus: int | None, num_cpus: int | None) -> ClusterInfo:
    """Start the sweep's own local Ray (address None) or join a cluster; what it runs on."""
    if not joins_cluster(address):  # null, "" or "local": the sweep's own local instance
        address = None
    # the environment first: Ray reads its single-machine switch when it is imported
    kwargs = _join_kwargs(address) if address else _local_kwargs(num_gpus, num_cpus)
    import ray

    if not ray.is_initialized():
        handler = signal.getsignal(signal.SIGTERM)
        logging.getLogger(TOKEN_NOTICE_LOGGER).addFilter(_TOKEN_NOTICE_FILTER)
        try:
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, **kwargs)
        except ConnectionError as exc:  # "auto" with no cluster on this machine, or a refused join
            raise UserError(f"ray.address={address}: {str(exc).splitlines()[0]}; valid: a running "
                            "cluster (`ray start --head` first), or null for a local Ray of the "
                            "sweep's own") from None
        # Ray's core installs a crash handler for SIGTERM that aborts the driver (exit -6) before any
        # trial can stop its engine; put back ours (run.py turns SIGTERM into a Ctrl-C)
        if callable(handler) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)
    total, largest, nodes = cluster_gpus()
    return ClusterInfo(address, ray.get_runtime_context().gcs_address, nodes, total, largest)


def cluster_gpus() -> tuple[int, int, int]:
    """(total GPUs, GPUs of the largest node, alive nodes)."""
    per_node = [gpus for _, gpus in node_gpus()]
    return sum(per_node), max(per_node, default=0), len(per_node)


def node_gpus() -> list[tuple[str, int]]:
    """(Ray node id, GPUs) of each alive node."""
    import ray

    return [(str(n["NodeID"]), int(n.get("Resources", {}).get("GPU", 0)))
            for n in ray.nodes() if n.get("Alive")]

