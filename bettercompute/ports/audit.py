"""Audit rows: one per mutation, with the decision that allowed it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["AuditRecord"]


@attrs.frozen(kw_only=True)
class AuditRecord:
    """One audit row: who did what to which resource, under which IAM decision, with what outcome."""

    action: str
    actor: str
    tenant: str | None
    resource_type: str
    resource_id: str | None
    decision_id: str | None
    outcome: str = "ok"
    details: Mapping[str, Any] = attrs.field(factory=dict)
