"""The ``reservations`` module object: the group, the controller, the placer and the drafts sweeper.

Its tables and admission functions were made by the ``capacity`` module's migrations (versions up to the split); the
store keeps them under that name, and later changes to them are this module's migrations.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job
from bettercompute._runtime.reconcile import Reconciler
from bettercompute._version import __version__
from bettercompute.modules.reservations._controller import ACKED, CONTROLLER, PLACER, sweep_drafts
from bettercompute.modules.reservations._methods import ACTIONS, ReservationsGroup
from bettercompute.modules.reservations._port import RESERVATIONS
from bettercompute.ports import Migration, Repository

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.registry import GroupSpec

__all__ = ["ReservationsModule"]


class ReservationsModule:
    """Always registered by ``better_compute()``, after the ``capacity`` module (admission enforces its quotas)."""

    name = "reservations"
    version = __version__
    core_range = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (ReservationsGroup,)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    repositories: Sequence[Repository[Any]] = (RESERVATIONS,)
    jobs: Sequence[Job] = (
        Job(name="reservation-drafts", role="controllers", interval=dt.timedelta(seconds=20), run=sweep_drafts),
    )
    reconcilers: Sequence[Reconciler] = (CONTROLLER, ACKED, PLACER)

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None
