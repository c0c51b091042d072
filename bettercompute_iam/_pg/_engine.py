"""IAM's PostgreSQL adapter: its tables (migrations of module ``iam``) and the statements that read and write them.

The only modules of this package that may import the PostgreSQL store or psycopg (an import-linter contract) are
this adapter's; its statements run on psycopg, on the store's pooled connections or on the connection of a
transaction it opens itself (``PgTransaction.connection``). Its administrative statements are the repository
``IamAdmin`` (``_admin``).
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from bettercompute.errors import InvalidConfigError
from bettercompute.ports import AuditRecord, Migration, Store
from bettercompute_store_pg import PgStore, fetch_in, quote_schema

__all__ = ["MIGRATIONS", "ROOT_TENANT", "CredentialRow", "IamTables"]

ROOT_TENANT = "root"

MIGRATIONS = (
    Migration(
        version=1,
        name="tenants, principals and credentials",
        sql="""
CREATE TABLE {schema}.iam_tenants (
    id          text PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {schema}.iam_principals (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES {schema}.iam_tenants (id),
    kind        text NOT NULL CHECK (kind IN ('user', 'service_account')),
    name        text NOT NULL,
    disabled_at timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);
CREATE TABLE {schema}.iam_credentials (
    id           text PRIMARY KEY,
    principal_id text NOT NULL REFERENCES {schema}.iam_principals (id),
    secret_hash  bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    revoked_at   timestamptz,
    last_used_at timestamptz
);
CREATE INDEX iam_credentials_principal ON {schema}.iam_credentials (principal_id);
""",
    ),
    Migration(
        version=2,
        name="roles and bindings",
        sql="""
ALTER TABLE {schema}.iam_credentials
    ADD COLUMN description text NOT NULL DEFAULT '',
    ADD COLUMN expired_at timestamptz;
CREATE INDEX iam_credentials_expiring ON {schema}.iam_credentials (expires_at)
    WHERE revoked_at IS NULL AND expired_at IS NULL AND expires_at IS NOT NULL;
CREATE TABLE {schema}.iam_roles (
    id          text PRIMARY KEY,
    tenant_id   text REFERENCES {schema}.iam_tenants (id),
    name        text NOT NULL,
    actions     text[] NOT NULL,
    description text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX iam_roles_name ON {schema}.iam_roles (coalesce(tenant_id, ''), name);
CREATE TABLE {schema}.iam_bindings (
    id           text PRIMARY KEY,
    role_id      text NOT NULL REFERENCES {schema}.iam_roles (id),
    principal_id text NOT NULL REFERENCES {schema}.iam_principals (id),
    tenant_id    text NOT NULL REFERENCES {schema}.iam_tenants (id),
    scope_type   text NOT NULL CHECK (scope_type IN ('root', 'tenant', 'pool')),
    scope_id     text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((scope_type = 'root') = (scope_id IS NULL))
);
CREATE UNIQUE INDEX iam_bindings_unique
    ON {schema}.iam_bindings (role_id, principal_id, scope_type, coalesce(scope_id, ''));
CREATE INDEX iam_bindings_principal ON {schema}.iam_bindings (principal_id);
CREATE INDEX iam_bindings_tenant ON {schema}.iam_bindings (tenant_id);
""",
    ),
)


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
        q = quote_schema(store.schema)
        # The hot reads run through the store's one-round-trip path (no BEGIN/ROLLBACK around them).
        self._credential = store.sql(
            "SELECT c.id, c.secret_hash, p.id AS principal_id, p.name AS principal_name, p.kind, p.tenant_id,"
            " (c.revoked_at IS NULL AND (c.expires_at IS NULL OR c.expires_at > now()) AND p.disabled_at IS NULL)"
            " AS usable, c.expires_at, c.last_used_at"
            " FROM {s}.iam_credentials c JOIN {s}.iam_principals p ON p.id = c.principal_id WHERE c.id = :id"
        )
        self._touch = store.sql("UPDATE {s}.iam_credentials SET last_used_at = now() WHERE id = :id")
        self._ensure_root = store.sql(
            f"INSERT INTO {q}.iam_tenants (id, name) VALUES (:id, :id) ON CONFLICT (id) DO NOTHING"
        )
        self._ensure_principal = store.sql(
            f"INSERT INTO {q}.iam_principals (id, tenant_id, kind, name) VALUES (:id, :tenant, :kind, :name)"
            f" ON CONFLICT (tenant_id, name) DO UPDATE SET disabled_at = NULL"
            f" RETURNING id"
        )
        self._active = store.sql(
            f"SELECT id FROM {q}.iam_credentials WHERE principal_id = :principal AND revoked_at IS NULL"
            f" AND (expires_at IS NULL OR expires_at > now()) ORDER BY created_at FOR UPDATE"
        )
        self._insert_credential = store.sql(
            f"INSERT INTO {q}.iam_credentials (id, principal_id, secret_hash, expires_at)"
            f" VALUES (:id, :principal, :hash, :expires_at)"
        )
        self._revoke = store.sql(
            f"UPDATE {q}.iam_credentials SET revoked_at = now() WHERE id = ANY(:ids) AND revoked_at IS NULL"
            f" RETURNING id"
        )
        self._lock = store.sql("SELECT pg_advisory_xact_lock(hashtext(:key))")
        # As IamAdmin's: a pool scope lies in the tenant the projection records for the pool.
        self._grants = store.sql(
            "SELECT r.actions, b.scope_type, b.scope_id,"
            " CASE b.scope_type WHEN 'tenant' THEN b.scope_id WHEN 'pool' THEN pr.tenant_id END AS scope_tenant"
            " FROM {s}.iam_bindings b JOIN {s}.iam_roles r ON r.id = b.role_id"
            " LEFT JOIN {s}.authz_resources pr"
            " ON b.scope_type = 'pool' AND pr.resource_type = 'pool' AND pr.resource_id = b.scope_id"
            " WHERE b.principal_id = :principal"
        )
        self._upsert_builtin = store.sql(
            f"INSERT INTO {q}.iam_roles AS r (id, tenant_id, name, actions, description)"
            f" SELECT j.key, NULL, j.key, ARRAY(SELECT jsonb_array_elements_text(j.value)), 'built-in'"
            f" FROM jsonb_each(CAST(:roles AS jsonb)) AS j"
            # Only ever adds: processes composed with other modules share the schema, and none may take away
            # the actions another one's declarations put in a built-in role.
            f" ON CONFLICT (id) DO UPDATE"
            f" SET actions = ARRAY(SELECT DISTINCT a FROM unnest(r.actions || EXCLUDED.actions) AS a ORDER BY a)"
            f" WHERE NOT (r.actions @> EXCLUDED.actions)"
        )
        self._expire = store.sql(
            f"UPDATE {q}.iam_credentials SET expired_at = expires_at"
            f" WHERE id IN (SELECT id FROM {q}.iam_credentials"
            f"  WHERE revoked_at IS NULL AND expired_at IS NULL AND expires_at IS NOT NULL AND expires_at <= now()"
            f"  ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED)"
            f" RETURNING id, principal_id, (SELECT tenant_id FROM {q}.iam_principals p WHERE p.id = principal_id)"
        )
        self._projected = store.sql(
            "SELECT tenant_id, pool_id FROM {s}.authz_resources WHERE resource_type = :type AND resource_id = :id"
        )
        self._orphans = store.sql(
            "SELECT count(*) AS n FROM {s}.authz_resources r"
            " WHERE NOT EXISTS (SELECT 1 FROM {s}.iam_tenants t WHERE t.id = r.tenant_id)"
        )
        self._bind_root_admin = store.sql(
            f"INSERT INTO {q}.iam_bindings (id, role_id, principal_id, tenant_id, scope_type, scope_id)"
            f" VALUES (:id, 'compute.admin', :principal, :tenant, 'root', NULL)"
            f" ON CONFLICT DO NOTHING"
        )

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
