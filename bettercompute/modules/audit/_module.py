"""The ``audit`` module: reading and verifying the audit log, and the job that links it into hash chains (its chain
table and the append-only triggers are migrated under the name ``audit``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job
from bettercompute._version import __version__
from bettercompute.modules.audit._methods import ACTIONS, AuditGroup
from bettercompute.modules.audit._port import AUDIT_LOG
from bettercompute.modules.audit._service import AUDIT_CHAIN
from bettercompute.ports import Migration, Repository

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.registry import GroupSpec

__all__ = ["AuditModule"]


class AuditModule:
    """Always registered by ``better_compute()``."""

    name = "audit"
    version = __version__
    core_range = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (AuditGroup,)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    repositories: Sequence[Repository[Any]] = (AUDIT_LOG,)
    jobs: Sequence[Job] = (AUDIT_CHAIN,)

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None
