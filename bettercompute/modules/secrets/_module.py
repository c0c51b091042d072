"""The ``secrets`` module: its group (the broker, ``SecretBroker``, is built by whoever serves ``Secret``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job
from bettercompute._version import __version__
from bettercompute.modules.nodes._port import NODES
from bettercompute.modules.pools._port import POOLS
from bettercompute.modules.secrets._methods import ACTIONS, SecretsGroup
from bettercompute.modules.secrets._port import SECRETS
from bettercompute.ports import Migration, Repository

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.registry import GroupSpec

__all__ = ["SecretsModule"]


class SecretsModule:
    """Registered by ``better_compute()`` when ``Options.kms`` is set. Its table is core migration 8."""

    name = "secrets"
    version = __version__
    core_range = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (SecretsGroup,)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    repositories: Sequence[Repository[Any]] = (
        SECRETS,
        POOLS,
        NODES,
    )
    jobs: Sequence[Job] = ()

    async def start(self, context: ModuleContext) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""
