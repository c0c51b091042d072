"""The ``system`` group's declaration."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.system import _service

B = TypeVar("B")


class SystemGroup(GroupSpec[B]):
    """The control plane itself: its version, the caller's identity, its health."""

    name = "system"
    version = _service.version
    whoami = _service.whoami
    health = _service.health


ACTIONS = tuple(sorted(m.action for m in SystemGroup.methods.values()))
