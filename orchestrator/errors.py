"""User-facing errors: one line that names the key, the value and what would be valid."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vocab.records import PointResult


class UserError(Exception):
    """A mistake in the user's input or environment; printed as one line, exit code 2."""


class ConfigError(UserError):
    def __init__(self, key: str, value: Any, valid: str, why: str = "") -> None:
        self.key, self.value, self.valid, self.why = key, value, valid, why
        reason = f" ({why})" if why else ""
        super().__init__(f"{key}={value}: invalid{reason}; valid: {valid}")


class EngineStartError(Exception):
    """The engine did not become ready; the message carries the tail of its log."""


class EngineFailure(Exception):
    """The engine failed a trial after it was ready: its process exited, it stopped answering
    ``/health``, or a point ran past ``workload.point_timeout_s``. The first line of the message says
    which, during which point and how far it got; the tail of the engine's log follows. ``result``
    is the point cut short (its finished records, its in-flight ones marked aborted), already
    marked invalid, so its metrics can still be logged."""

    def __init__(self, message: str, result: PointResult | None = None) -> None:
        super().__init__(message)
        self.result = result
