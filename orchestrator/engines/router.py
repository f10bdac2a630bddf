"""The router package in front of a trial's DP replicas (``dp.router_impl``): what each replica and the
router are started with.

Where the router runs the policy, the trial starts ``dp.size`` servers of one replica each (the same
flags as the trial's with ``--dp-size 1``), each on its own slice of the trial's GPUs, and the router
(``python -m smg.launch_router``) in front of them on 127.0.0.1. ``smg`` is the successor of the
``sglang-router`` package (its last release, 0.3.2, predates SGLang 0.5.9), with the same flags and
policies. The router's bundled launchers are not used: one picks random worker ports and overrides
``--base-gpu-id``, the other misreads SGLang's parallelism flags from 0.5.14 on (docs/sglang-adapter.md).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from orchestrator.config.schema import (
    PD_ROLES,
    ParasweepConf,
    bootstrap_ports,
    plays_vllm,
    role_gpus,
    worker_config,
    world_size,
)
from orchestrator.engines.base import HOST
from orchestrator.engines.vllm_compat.disagg import side_channel_env
from simulator.router import BALANCE_ABS, BALANCE_REL, CACHE_THRESHOLD

ROUTER_MODULE = "smg.launch_router"
VLLM_ROUTER_MODULE = "vllm_router.launch_router"  # vllm-router's launcher (the package's `vllm-router`)


def replica_config(cfg: ParasweepConf) -> ParasweepConf:
    """The configuration each replica's server is started with: the trial's, as one replica."""
    return dataclasses.replace(cfg, dp=dataclasses.replace(cfg.dp, size=1, router="round_robin",
                                                           router_impl="engine"))


def replica_gpus(visible: str | None, rank: int, per_replica: int) -> str:
    """Replica ``rank``'s ``CUDA_VISIBLE_DEVICES``: its slice of the trial's GPUs (the mask Ray set,
    else GPUs 0.. in order)."""
    return _gpu_slice(visible, rank * per_replica, per_replica)


@dataclasses.dataclass(frozen=True)
class RoutedLaunch:
    """What a trial behind the router starts: each replica's command with its ``CUDA_VISIBLE_DEVICES``,
    in rank order, and the router's command in front of them."""

    replicas: list[tuple[list[str], str]]
    router: list[str]


def routed_launch(cfg: ParasweepConf, replica_argv: Callable[[ParasweepConf, int], list[str]],
                  ports: list[int], router_port: int, prometheus_port: int, visible: str | None,
                  python: str = sys.executable) -> RoutedLaunch:
    """The commands of ``cfg``'s replicas (``replica_argv(config of one replica, its port)``, one per
    port) on their slices of ``visible``, and of the router in front of them on ``router_port``."""
    one, per_replica = replica_config(cfg), world_size(cfg) // cfg.dp.size
    replicas = [(replica_argv(one, port), replica_gpus(visible, rank, per_replica))
                for rank, port in enumerate(ports)]
    urls = [f"http://{HOST}:{port}" for port in ports]
    return RoutedLaunch(replicas, router_argv(cfg, router_port, prometheus_port, urls, python))


def router_argv(cfg: ParasweepConf, port: int, prometheus_port: int, worker_urls: list[str],
                python: str = sys.executable) -> list[str]:
    """The router's command. It runs in parasweep's own interpreter by default, where the pinned
    package is installed (the engine's ``engine.python`` need not have it). The cache-aware thresholds are its
    defaults, passed explicitly so the argv records what the simulated router models. Its Prometheus
    listener is always on, so each router on a host gets a port of its own. It logs warnings and
    errors only: at ``info`` it writes two lines per request."""
    return [python, "-m", ROUTER_MODULE, "--host", HOST, "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", cfg.dp.router,
            "--cache-threshold", f"{CACHE_THRESHOLD:g}", "--balance-abs-threshold", str(BALANCE_ABS),
            "--balance-rel-threshold", f"{BALANCE_REL:g}",
            "--prometheus-host", HOST, "--prometheus-port", str(prometheus_port), "--log-level", "warn"]


@dataclasses.dataclass(frozen=True)
class PDServer:
    """One server of a disaggregated deployment: its role, index, command, port and GPUs."""

    role: str
    index: int
    argv: list[str]
    port: int
    gpus: str
    bootstrap_port: int | None  # SGLang's prefill servers: where decode servers fetch their KV from
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # vLLM's: its NIXL side channel

    @property
    def name(self) -> str:
        return f"{self.role} server {self.index}"


@dataclasses.dataclass(frozen=True)
class PDLaunch:
    """What a disaggregated trial starts: every server (prefill first, in placement order) and the
    router in PD mode in front of them."""

    servers: list[PDServer]
    router: list[str]


def pd_launch(cfg: ParasweepConf, server_argv: Callable[[ParasweepConf, int], list[str]],
              ports: list[int], side_ports: Callable[[int, int], int], router_port: int, prometheus_port: int,
              visible: str | None, python: str = sys.executable) -> PDLaunch:
    """Each server's command (``server_argv(its config, its port)``) on its slice of ``visible`` (the
    GPUs in placement order: prefill servers first), one port each, and the router in PD mode on
    ``router_port``. The servers call each other on ports of their own where nothing sets them: SGLang's
    prefill servers' bootstrap ports (``pd.bootstrap_port`` and up where set), every vLLM server's NIXL
    side channel. ``side_ports(offset, width)`` gives the first of ``width`` consecutive ports for a
    server, ``offset`` the count its servers before it took (a free block for a trial, a fixed base plus
    ``offset`` for a printed command). A vLLM server takes one per GPU: its ranks listen from its side
    channel's port up (by DP rank, or DP rank times TP size plus TP rank, as the release has it)."""
    vllm = plays_vllm(cfg)
    boots = [] if vllm else bootstrap_ports(cfg, lambda i: side_ports(i, 1))
    servers, first = [], 0
    for role in PD_ROLES:
        per_server = role_gpus(cfg, role)
        for i in range(getattr(cfg.pd, role).workers):
            boot = boots[i] if role == "prefill" and not vllm else None
            one = worker_config(cfg, role, i, boot)
            port = ports[len(servers)]
            gpus = _gpu_slice(visible, first, per_server)
            env = side_channel_env(side_ports(first, per_server)) if vllm else {}
            servers.append(PDServer(role, i, server_argv(one, port), port, gpus, boot, env))
            first += per_server
    router = (vllm_pd_router_argv(cfg, router_port, prometheus_port, servers, python) if vllm
              else pd_router_argv(cfg, router_port, prometheus_port, servers, python))
    return PDLaunch(servers, router)


def _gpu_slice(visible: str | None, first: int, count: int) -> str:
    if not visible:
        return ",".join(str(g) for g in range(first, first + count))
    return ",".join(g.strip() for g in visible.split(",")[first:first + count])


def pd_router_argv(cfg: ParasweepConf, port: int, prometheus_port: int, servers: list[PDServer],
                   python: str = sys.executable) -> list[str]:
    """The router in PD mode: each prefill server with its bootstrap port, each decode server, the
    pairing policy for both roles. With the fake backend there are decode servers only, and the router
    runs as a plain router in front of them."""
    urls = [(s, f"http://{HOST}:{s.port}") for s in servers]
    prefill = [x for s, url in urls if s.role == "prefill" for x in ("--prefill", url, str(s.bootstrap_port))]
    decode = [x for s, url in urls if s.role == "decode" for x in ("--decode", url)]
    mode = ["--pd-disaggregation", *prefill, *decode] if prefill else \
        ["--worker-urls", *(url for _, url in urls)]
    return [python, "-m", ROUTER_MODULE, "--host", HOST, "--port", str(port), *mode,
            "--policy", cfg.pd.policy, "--prometheus-host", HOST, "--prometheus-port", str(prometheus_port),
            "--log-level", "warn"]


def vllm_pd_router_argv(cfg: ParasweepConf, port: int, prometheus_port: int, servers: list[PDServer],
                        python: str = sys.executable) -> list[str]:
    """vllm-router in PD mode (``--vllm-pd-disaggregation``, NIXL): each prefill and decode server, the
    pairing policy, its Prometheus listener on a port of its own. It checks the servers' health every
    second while it starts (its default, 30 s, would add up to 30 s to every trial's start)."""
    urls = [(s.role, f"http://{HOST}:{s.port}") for s in servers]
    roles = [x for role, url in urls for x in (f"--{role}", url)]
    return [python, "-m", VLLM_ROUTER_MODULE, "--vllm-pd-disaggregation", *roles, "--kv-connector", "nixl",
            "--policy", cfg.pd.policy, "--host", HOST, "--port", str(port), "--prometheus-host", HOST,
            "--prometheus-port", str(prometheus_port), "--worker-startup-check-interval", "1",
            "--log-level", "warning"]


def worker_urls(argv: list[str]) -> list[str]:
    """The replicas' URLs in a router command, in rank order."""
    if "--worker-urls" not in argv:
        return []
    rest = argv[argv.index("--worker-urls") + 1:]
    return rest[:next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))]
