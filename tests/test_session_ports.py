"""Servers behind a router take their ports from a probe (bind to port 0, close); another trial can bind
one of them before the server does. The session then starts them all again on fresh ports, a bounded
number of times, and lets any other start failure through at once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.errors import EngineStartError
from orchestrator.trial.session import PORT_ATTEMPTS, LiveSession

TAKEN = "router exited (code 1); router log tail:\nError: Address already in use (os error 98)"


def _session() -> SimpleNamespace:
    stopped: list[object] = []
    return SimpleNamespace(_stop_engines=stopped.append, _group=object(), stopped=stopped)


def test_a_port_taken_before_its_server_bound_it_starts_everything_again() -> None:
    session, calls = _session(), []

    def start() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise EngineStartError(TAKEN)
        return "server"

    assert LiveSession._retrying_taken_ports(session, start) == "server"  # type: ignore[arg-type]
    assert len(calls) == 2 and session.stopped == [None] and session._group is None


def test_other_start_failures_and_a_port_taken_every_time_are_raised() -> None:
    session = _session()

    def broken() -> str:
        raise EngineStartError("replica 1's engine exited (code 1)")

    with pytest.raises(EngineStartError, match="exited"):
        LiveSession._retrying_taken_ports(session, broken)  # type: ignore[arg-type]
    assert session.stopped == []
    calls = []

    def always_taken() -> str:
        calls.append(1)
        raise EngineStartError(TAKEN)

    with pytest.raises(EngineStartError, match="Address already in use"):
        LiveSession._retrying_taken_ports(_session(), always_taken)  # type: ignore[arg-type]
    assert len(calls) == PORT_ATTEMPTS
