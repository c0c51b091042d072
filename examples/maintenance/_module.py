"""The ``maintenance`` group, its typed group set, and the module object a host puts in ``Options.modules``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from bettercompute import GroupSet, GroupSpec, Job, ModuleContext
from bettercompute.modules.pools import POOLS
from bettercompute.ports import Migration, Repository
from examples.maintenance import _handlers
from examples.maintenance._pg import MIGRATIONS
from examples.maintenance._port import MAINTENANCE

__all__ = ["MaintenanceGroup", "MaintenanceGroups", "MaintenanceModule"]

B = TypeVar("B")


class MaintenanceGroup(GroupSpec[B]):
    """Maintenance windows of a tenant's pools."""

    name = "maintenance"
    create = _handlers.create
    list = _handlers.list_windows


class MaintenanceGroups(GroupSet[B]):
    """The module's groups, typed: ``MaintenanceGroups(compute.api).maintenance`` or ``MaintenanceGroups(client)``."""

    maintenance: MaintenanceGroup[B]


class MaintenanceModule:
    """Register with ``Options(modules=[MaintenanceModule()])``; ``initialize()`` runs its migrations."""

    name = "maintenance"
    version = "1.0.0"
    core_range = ">=0.1,<0.2"
    groups: Sequence[type[GroupSpec[Any]]] = (MaintenanceGroup,)
    actions: Sequence[str] = ()  # every method's action comes from its declaration
    migrations: Mapping[str, Sequence[Migration]] = {"postgresql": MIGRATIONS}
    jobs: Sequence[Job] = ()
    # Its own repository and the core's it reads: better_compute() refuses a store that lacks one.
    repositories: Sequence[Repository[Any]] = (MAINTENANCE, POOLS)

    async def start(self, context: ModuleContext) -> None:
        """Nothing to start: the store made sure of the repositories at composition."""

    async def stop(self) -> None:
        """Nothing to stop."""
