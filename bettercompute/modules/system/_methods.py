"""The ``system`` group's declaration."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec, MethodDef
from bettercompute.modules.system import _service
from bettercompute.modules.system._schemas import (
    HealthInput,
    HealthOutput,
    VersionInput,
    VersionOutput,
    WhoamiInput,
    WhoamiOutput,
)

B = TypeVar("B")


class SystemGroup(GroupSpec[B]):
    """The control plane itself: its version, the caller's identity, its health."""

    name = "system"
    version = MethodDef(input=VersionInput, output=VersionOutput, handler=_service.version, mutates=False)
    whoami = MethodDef(input=WhoamiInput, output=WhoamiOutput, handler=_service.whoami, mutates=False)
    health = MethodDef(input=HealthInput, output=HealthOutput, handler=_service.health, mutates=False)


ACTIONS = tuple(sorted(m.action for m in SystemGroup.methods.values()))
