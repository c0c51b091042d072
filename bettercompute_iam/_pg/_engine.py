"""IAM's PostgreSQL adapter: ``IamTables`` runs what authentication, bootstrap and expiry need on IAM's tables.

The only modules of this package that may import the PostgreSQL store or psycopg (an import-linter contract) are
this adapter's; its statements run on psycopg, on the store's pooled connections or on the connection of a
transaction it opens itself (``PgTransaction.connection``). The tables' migrations and every statement are in
``_statements``; the administrative ones run in the repository ``IamAdmin`` (``_admin``).
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from bettercompute.errors import InvalidConfigError
from bettercompute.ports import AuditRecord, Store
from bettercompute_store_pg import PgStore, fetch_in

from . import _statements as sql

__all__ = ["ROOT_TENANT", "CredentialRow", "IamTables"]

ROOT_TENANT = "root"


@attrs.frozen(kw_only=True)
class CredentialRow:
    """What authentication needs to know about one credential."""

    id: str
    secret_hash: bytes
    principal_id: str
    principal_name: str
    kind: str
    tenant_id: str
    usable: bool
    expires_at: dt.datetime | None
    last_used_at: dt.datetime | None


class IamTables:
    """The statements IAM runs, on the store's connections, in the store's schema."""

    def __init__(self, store: Store) -> None:
        if not isinstance(store, PgStore):
            raise InvalidConfigError(
                "the embedded IAM needs the PostgreSQL store",
                details={"problems": [f"iam: store is a {type(store).__name__}, not a PgStore"]},
            )
        self._store = store
        # The hot reads run through the store's one-round-trip path (no BEGIN/ROLLBACK around them).
        self._credential = store.sql(sql.CREDENTIAL)
        self._touch = store.sql(sql.TOUCH_CREDENTIAL)
        self._ensure_root = store.sql(sql.ENSURE_ROOT)
        self._ensure_principal = store.sql(sql.ENSURE_PRINCIPAL)
        self._active = store.sql(sql.ACTIVE_CREDENTIALS)
        self._insert_credential = store.sql(sql.STORE_CREDENTIAL)
        self._revoke = store.sql(sql.REVOKE_CREDENTIALS)
        self._lock = store.sql(sql.ADVISORY_LOCK)
        self._grants = store.sql(sql.PRINCIPAL_GRANTS)
        self._upsert_builtin = store.sql(sql.UPSERT_BUILTIN_ROLES)
        self._expire = store.sql(sql.EXPIRE_CREDENTIALS)
        self._projected = store.sql(sql.PROJECTED)
        self._orphans = store.sql(sql.ORPHANED_PROJECTIONS)
        self._bind_root_admin = store.sql(sql.BIND_ROOT_ADMIN)

    async def credential(self, credential_id: str) -> CredentialRow | None:
        """One credential with its principal, or ``None``."""
        rows = await self._store.fetch(self._credential, {"id": credential_id})
        if not rows:
            return None
        row: tuple[Any, ...] = tuple(rows[0])
        return CredentialRow(
            id=row[0],
            secret_hash=bytes(row[1]),
            principal_id=row[2],
            principal_name=row[3],
            kind=row[4],
            tenant_id=row[5],
            usable=bool(row[6]),
            expires_at=row[7],
            last_used_at=row[8],
        )

    async def touch(self, credential_id: str) -> None:
        """Record that a credential was used now."""
        await self._store.fetch(self._touch, {"id": credential_id})

    async def ensure_root(self, builtin_roles: Mapping[str, Sequence[str]]) -> None:
        """Create the root tenant if it does not exist, and add to the built-in roles the actions they lack."""
        roles = json.dumps({name: list(actions) for name, actions in builtin_roles.items()})
        async with self._store.transaction() as tx:
            conn = tx.connection
            await fetch_in(conn, self._ensure_root, {"id": ROOT_TENANT})
            await fetch_in(conn, self._upsert_builtin, {"roles": roles})

    async def expire(self, limit: int) -> list[tuple[str, str, str]]:
        """Mark up to ``limit`` credentials past their expiry as expired, with an audit row each.

        Returns (credential id, principal id, tenant id) of each. Authentication already refuses them by time; this
        records when they ended, for listings and for the audit trail.
        """
        async with self._store.transaction() as tx:
            rows = await fetch_in(tx.connection, self._expire, {"limit": limit})
            expired = [(r[0], r[1], r[2]) for r in rows]
            for credential_id, _, tenant in expired:
                await tx.audit(
                    AuditRecord(
                        action="iam:credentials:expire",
                        actor="system",
                        tenant=tenant,
                        resource_type="credential",
                        resource_id=credential_id,
                        decision_id=None,
                    )
                )
        return expired

    async def projected(self, resource_type: str, resource_id: str) -> tuple[str, str | None] | None:
        """The tenant and pool the projection records for a resource, or ``None``."""
        rows = await self._store.fetch(self._projected, {"type": resource_type, "id": resource_id})
        return (rows[0][0], rows[0][1]) if rows else None

    async def orphaned_projections(self) -> int:
        """How many projected resources name a tenant IAM does not know (their decisions could never allow a
        tenant-scoped caller, so they point at a module that wrote a wrong tenant, or a tenant removed by hand)."""
        rows = await self._store.fetch(self._orphans, {})
        return int(rows[0][0])

    async def grants(self, principal_id: str) -> list[tuple[tuple[str, ...], str, str | None, str | None]]:
        """Every binding of a principal: the role's action patterns, the scope type, id and tenant."""
        rows = await self._store.fetch(self._grants, {"principal": principal_id})
        return [(tuple(r[0]), r[1], r[2], r[3]) for r in rows]

    async def bootstrap(
        self, *, principal_id: str, principal_name: str, credential_id: str, secret_hash: bytes, rotate: bool
    ) -> tuple[str, bool, list[str]]:
        """Make sure the root admin exists and, if it has no usable credential (or ``rotate``), store the new one.

        Returns the root admin's id, whether the new credential was stored, and the ids of credentials revoked.
        Serialized across processes, so two concurrent bootstraps mint one credential.
        """
        async with self._store.transaction() as tx:
            conn = tx.connection
            await fetch_in(conn, self._lock, {"key": f"{self._store.schema}:iam-bootstrap"})
            await fetch_in(conn, self._ensure_root, {"id": ROOT_TENANT})
            params = {"id": principal_id, "tenant": ROOT_TENANT, "kind": "user", "name": principal_name}
            pid: str = (await fetch_in(conn, self._ensure_principal, params))[0][0]
            await fetch_in(
                conn,
                self._bind_root_admin,
                {"id": f"bd_{secrets.token_hex(8)}", "principal": pid, "tenant": ROOT_TENANT},
            )
            active = [r[0] for r in await fetch_in(conn, self._active, {"principal": pid})]
            if active and not rotate:
                return pid, False, []
            revoked: list[str] = []
            if active:
                revoked = [r[0] for r in await fetch_in(conn, self._revoke, {"ids": active})]
            await fetch_in(
                conn,
                self._insert_credential,
                {"id": credential_id, "principal": pid, "hash": secret_hash, "expires_at": None},
            )
            return pid, True, revoked

    async def revoke(self, credential_ids: list[str]) -> list[str]:
        """Revoke credentials; returns those that were active."""
        async with self._store.transaction() as tx:
            return [r[0] for r in await fetch_in(tx.connection, self._revoke, {"ids": credential_ids})]
