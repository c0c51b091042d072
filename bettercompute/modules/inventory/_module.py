"""The ``inventory`` module: the built-in node controllers and the ``devices`` group.

Always registered (without node identity there are no nodes, and its controllers find nothing to do). Its tables hang
off ``nodes`` and were made by the ``nodes`` module's migrations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job
from bettercompute._runtime.reconcile import Reconciler
from bettercompute._version import __version__
from bettercompute.modules.inventory._checks import DIAG_NVML, AcceptanceCheck
from bettercompute.modules.inventory._controllers import Controllers
from bettercompute.modules.inventory._methods import ACTIONS, DevicesGroup
from bettercompute.modules.inventory._port import INVENTORY
from bettercompute.ports import Migration, Repository

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.registry import GroupSpec

__all__ = ["InventoryModule"]


class InventoryModule:
    """Always registered by ``better_compute()``; ``checks`` are the acceptance checks pools may name (``diag.nvml`` and
    those other modules declare in their ``acceptance_checks``)."""

    name = "inventory"
    version = __version__
    core_range = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (DevicesGroup,)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    repositories: Sequence[Repository[Any]] = (INVENTORY,)
    jobs: Sequence[Job] = ()

    def __init__(self, checks: Sequence[AcceptanceCheck] = ()) -> None:
        extra = [c for c in checks if c.kind != DIAG_NVML.kind]
        self.controllers = Controllers([DIAG_NVML, *extra])
        self.reconcilers: Sequence[Reconciler] = (self.controllers.inventory, self.controllers.lifecycle)

    async def start(self, context: ModuleContext) -> None:
        """Nothing to load."""

    async def stop(self) -> None:
        """Nothing to stop."""
