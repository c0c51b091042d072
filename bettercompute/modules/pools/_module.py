"""The ``pools`` module: the ``pools`` group."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job
from bettercompute._version import __version__
from bettercompute.modules.pools._methods import ACTIONS, PoolsGroup
from bettercompute.modules.pools._port import POOLS
from bettercompute.ports import Migration, Repository

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.registry import GroupSpec

__all__ = ["PoolsModule"]


class PoolsModule:
    """Always registered by ``better_compute()``."""

    name = "pools"
    version = __version__
    core_range = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (PoolsGroup,)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    repositories: Sequence[Repository[Any]] = (POOLS,)
    jobs: Sequence[Job] = ()

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None
