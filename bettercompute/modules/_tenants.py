"""The one check every ``create`` that names a tenant makes, in the transaction that inserts."""

from __future__ import annotations

from bettercompute.errors import NotFoundError
from bettercompute.ports import Transaction


async def require_tenant(tx: Transaction, tenant: str) -> None:
    """Refuse a tenant the IAM does not know, before anything is written in ``tx``.

    Asked in the inserting transaction (not before it), so the answer holds when the rows commit; raising inside
    ``store.transaction()`` rolls back whatever the transaction did.

    Raises:
        NotFoundError: there is no such tenant (``details["path"]`` is ``tenant``).
    """
    if not await tx.tenant_exists(tenant):
        raise NotFoundError("no such tenant", details={"path": "tenant", "tenant": tenant})
