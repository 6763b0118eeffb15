"""The load test's one error type."""

from __future__ import annotations

from engine.errors import OptionsError


class LoadTestError(OptionsError):
    """The load test cannot run as asked (bad settings, server unreachable)."""
