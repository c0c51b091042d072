"""The ``system`` module (registered as ``core``): the ``system`` group and the runtime's own jobs."""

from __future__ import annotations

from collections.abc import Sequence

from bettercompute._runtime.declarations import StaticModule
from bettercompute._runtime.jobs import Job
from bettercompute._version import __version__
from bettercompute.modules.system._methods import ACTIONS, SystemGroup

__all__ = ["SystemModule"]


def SystemModule(*, jobs: Sequence[Job] = ()) -> StaticModule:
    """The core's own module, always registered first; ``jobs`` are the runtime's (the events dispatcher)."""
    return StaticModule(
        name="core",
        version=__version__,
        core_range=f"=={__version__}",
        groups=(SystemGroup,),
        actions=ACTIONS,
        jobs=jobs,
    )
