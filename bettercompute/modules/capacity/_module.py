"""The ``capacity`` module: the ``quotas``, ``capacity`` and ``reservations`` groups, the reservation controller
and the drafts sweeper (its tables and admission functions are its own migrations)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job
from bettercompute._runtime.reconcile import Reconciler
from bettercompute._version import __version__
from bettercompute.modules.capacity._methods import ACTIONS, CapacityGroup, QuotasGroup, ReservationsGroup
from bettercompute.modules.capacity._port import CAPACITY, QUOTAS
from bettercompute.modules.capacity._reservation_port import RESERVATIONS
from bettercompute.modules.capacity._reservations import ACKED, CONTROLLER, PLACER, sweep_drafts
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
    groups: Sequence[type[GroupSpec[Any]]] = (QuotasGroup, CapacityGroup, ReservationsGroup)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    repositories: Sequence[Repository[Any]] = (QUOTAS, CAPACITY, RESERVATIONS)
    jobs: Sequence[Job] = (
        Job(name="reservation-drafts", role="controllers", interval=dt.timedelta(seconds=20), run=sweep_drafts),
    )
    reconcilers: Sequence[Reconciler] = (CONTROLLER, ACKED, PLACER)

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None
