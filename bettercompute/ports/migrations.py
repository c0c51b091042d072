"""Schema migrations of a module."""

from __future__ import annotations

import attrs

__all__ = ["Migration"]


@attrs.frozen(kw_only=True)
class Migration:
    """One step of a module's schema, applied once, in version order, under the store's migration lock.

    ``sql`` is written for the store whose ``dialect`` the migration is listed under; it may reference the store's
    schema as ``{schema}``.

    ``adopts`` names another module's recorded step, ``(module, version)``, that already made what this migration
    makes: where that step is recorded, this one is recorded as applied without running. That is how tables move
    from one module to another in a schema already migrated: the module that owns them now adopts the step that made
    them.
    """

    version: int
    name: str
    sql: str
    adopts: tuple[str, int] | None = None
