"""User-facing errors: one line that names the key, the value and what would be valid."""

from __future__ import annotations

from typing import Any


class UserError(Exception):
    """A mistake in the user's input or environment; printed as one line, exit code 2."""


class ConfigError(UserError):
    def __init__(self, key: str, value: Any, valid: str, why: str = "") -> None:
        self.key, self.value, self.valid, self.why = key, value, valid, why
        reason = f" ({why})" if why else ""
        super().__init__(f"{key}={value}: invalid{reason}; valid: {valid}")


class EngineStartError(Exception):
    """The engine did not become ready; the message carries the tail of its log."""
