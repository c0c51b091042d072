"""The ``pools`` module: the ``pools`` and ``join-tokens`` groups (their tables are core migration 6)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..._jobs import Job
from ..._version import __version__
from ...ports import Migration
from ._methods import ACTIONS, JoinTokensGroup, PoolsGroup

if TYPE_CHECKING:
    from ..._core import ModuleContext
    from ..._registry import GroupSpec

__all__ = ["PoolsModule"]


class PoolsModule:
    """Always registered by ``better_compute()``."""

    name = "pools"
    version = __version__
    core_range = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (PoolsGroup, JoinTokensGroup)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    jobs: Sequence[Job] = ()

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None
