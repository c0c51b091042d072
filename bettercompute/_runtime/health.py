"""What ``self_check()`` finds: the answer of ``system.health`` and of the HTTP health endpoints."""

from __future__ import annotations

from typing import Literal

import attrs

__all__ = ["HealthCheck", "HealthOutput"]


@attrs.frozen(kw_only=True)
class HealthCheck:
    """One read-only check and what it found."""

    name: str
    ok: bool
    detail: str


@attrs.frozen(kw_only=True)
class HealthOutput:
    """``ok`` when every check passed."""

    status: Literal["ok", "unavailable"]
    checks: tuple[HealthCheck, ...]
