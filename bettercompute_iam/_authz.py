"""The ``authz`` group: authentication and decisions over HTTP, for ``RemoteIam`` in other processes."""

from __future__ import annotations

from typing import Any

from bettercompute import GroupSpec

__all__ = ["AUTHZ_GROUPS"]

AUTHZ_GROUPS: tuple[type[GroupSpec[Any]], ...] = ()
