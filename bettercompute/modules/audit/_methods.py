"""The ``audit`` group's declaration (actions ``compute:audit:<method>``)."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.audit import _service

B = TypeVar("B")


class AuditGroup(GroupSpec[B]):
    """The audit log: every mutation's row, who did it and under which decision, linked into a hash chain per
    tenant."""

    name = "audit"
    list = _service.list_audit
    get = _service.get_audit
    verify = _service.verify_audit


ACTIONS = tuple(sorted(m.action for m in AuditGroup.methods.values()))
