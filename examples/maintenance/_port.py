"""The ``maintenance`` module's repository: what its handlers need of a store, as a protocol."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Transaction

__all__ = ["WindowRecord", "Windows"]


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
    """Maintenance windows."""

    async def create(self, tx: Transaction, record: WindowRecord) -> None:
        """Add a window in the caller's transaction."""
        ...

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[WindowRecord]:
        """A page of the tenant's windows by (start, id), after the key ``after``."""
        ...
