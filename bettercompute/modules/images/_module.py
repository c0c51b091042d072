"""The ``images`` module: the image registry (its table is migrated under the name ``images``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job
from bettercompute._version import __version__
from bettercompute.modules.images._methods import ACTIONS, ImagesGroup
from bettercompute.modules.images._port import IMAGES
from bettercompute.ports import Migration, Repository

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.registry import GroupSpec

__all__ = ["ImagesModule"]


class ImagesModule:
    """Always registered by ``better_compute()``, before any module of ``Options.modules`` (whose tables may refer
    to its table)."""

    name = "images"
    version = __version__
    core_range = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (ImagesGroup,)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    repositories: Sequence[Repository[Any]] = (IMAGES,)
    jobs: Sequence[Job] = ()

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None
