"""The ``secrets`` module: its group (the broker, ``SecretBroker``, is built by whoever serves ``Secret``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job
from bettercompute._version import __version__
from bettercompute.modules.nodes import NODES
from bettercompute.modules.pools import POOLS
from bettercompute.modules.secrets._methods import ACTIONS, SecretsGroup
from bettercompute.modules.secrets._port import SEALED_SECRETS, SECRETS
from bettercompute.ports import Migration, Repository, Sealed

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.registry import GroupSpec

__all__ = ["NEEDS_KMS", "SecretsModule"]

NEEDS_KMS = (
    "secrets need Options.kms: a KMS seals every value at rest (bettercompute.LocalKeyKms(path), the same key file in"
    " every process)"
)
"""What the ``secrets`` group answers (``FAILED_PRECONDITION``) where no KMS is configured."""


class SecretsModule:
    """Always registered by ``better_compute()``. Without ``Options.kms`` (``kms=False``) it is ``unavailable``: its
    group answers ``FAILED_PRECONDITION`` naming the option."""

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
    sealed: Sequence[Repository[Sealed]] = (SEALED_SECRETS,)
    jobs: Sequence[Job] = ()

    def __init__(self, *, kms: bool = True) -> None:
        self.unavailable: str | None = None if kms else NEEDS_KMS

    async def start(self, context: ModuleContext) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""
