"""The ``maintenance`` module's repository: what its handlers need of a store, as a protocol, and its typed key."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository

__all__ = ["MAINTENANCE", "WindowRecord", "Windows"]


@attrs.frozen(kw_only=True)
class WindowRecord:
    """A stored maintenance window."""

    id: str
    tenant: str
    pool_id: str
    starts_at: dt.datetime
    ends_at: dt.datetime
    reason: str


class Windows(Protocol):
    """Maintenance windows. ``create`` needs a transaction (``tx.repository(MAINTENANCE)``)."""

    async def create(self, record: WindowRecord) -> None:
        """Add a window; it commits or rolls back with the transaction."""
        ...

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[WindowRecord]:
        """A page of the tenant's windows by (start, id), after the key ``after``."""
        ...


MAINTENANCE: Repository[Windows] = Repository(
    module="maintenance", name="windows", adapters={"postgresql": "examples.maintenance._pg"}
)
"""``tx.repository(MAINTENANCE)`` in a transaction, ``store.repository(MAINTENANCE)`` outside one. The module lives
in a package of its own, so its key names where the PostgreSQL store finds the adapter (``REPOSITORIES`` there)."""
