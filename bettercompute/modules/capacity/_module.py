"""The ``capacity`` module object: the ``quotas`` and ``capacity`` groups. Its migrations also made the reservations'
tables and admission functions (the ``reservations`` module's since the split)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job
from bettercompute._version import __version__
from bettercompute.modules.capacity._methods import ACTIONS, CapacityGroup, QuotasGroup
from bettercompute.modules.capacity._port import CAPACITY, QUOTAS
from bettercompute.ports import Migration, Repository

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.registry import GroupSpec

__all__ = ["CapacityModule"]


class CapacityModule:
    """Always registered by ``better_compute()``, after the pools module (its quota rows name pools)."""

    name = "capacity"
    version = __version__
    core_range = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (QuotasGroup, CapacityGroup)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    repositories: Sequence[Repository[Any]] = (QUOTAS, CAPACITY)
    jobs: Sequence[Job] = ()

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None
