"""The runtime's repositories reached by key: the workflow store (``bettercompute.ports.WORKFLOWS``)."""

from __future__ import annotations

from collections.abc import Callable

from bettercompute_store_pg._db import Database
from bettercompute_store_pg._repository import PgRepository
from bettercompute_store_pg._workflows import PgWorkflows

__all__ = ["REPOSITORIES"]

REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"workflows": PgWorkflows}
"""The adapters of the runtime's repositories, by ``Repository.name``."""
