"""Schema migrations of a module."""

from __future__ import annotations

import attrs

__all__ = ["Migration"]


@attrs.frozen(kw_only=True)
class Migration:
    """One step of a module's schema, applied once, in version order, under the store's migration lock.

    ``sql`` is written for the store whose ``dialect`` the migration is listed under; it may reference the store's
    schema as ``{schema}``.
    """

    version: int
    name: str
    sql: str
