"""The statements behind IAM's method groups (tenants, principals, credentials, roles, bindings): the repository
``IamAdmin``, reached by the key ``IAM_ADMIN`` as every repository is.

Writes run in a transaction the caller opened with ``call.transaction()``, through ``tx.repository(IAM_ADMIN)`` (so
the audit row commits with them), and so do the reads a write decides on (grants, a pool's tenant): a request holds
one pooled connection at a time, never a second one while its transaction holds the first. Every method but the
listings refuses to run outside a transaction. Listings (``store.repository(IAM_ADMIN)``) run on their own.
Unique and foreign-key violations become ``CONFLICT`` and ``NOT_FOUND`` here; the driver's text (SQL, row values)
never leaves this module.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import psycopg

from bettercompute.errors import ConflictError, InternalError, NotFoundError
from bettercompute.ports import Repository
from bettercompute_store_pg import Database, PgRepository, Statement, quote_schema

from .._policy import Grant
from .._schemas import Binding, CredentialInfo, Principal, Role, Tenant

__all__ = ["IAM_ADMIN", "REPOSITORIES", "IamAdmin", "RootAdmins"]

_UNIQUE_VIOLATION = "23505"
_FOREIGN_KEY_VIOLATION = "23503"


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    return value.astimezone(dt.UTC) if value is not None else None


def _at(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC)


@contextlib.contextmanager
def _constraints(*, conflict: str, missing: str | None = None, details: Mapping[str, Any]) -> Iterator[None]:
    """Turn the violation of a unique (or foreign-key) constraint into ``ConflictError`` (or ``NotFoundError``)
    with this statement's own message; the store has already translated the driver's error, kept as the cause."""
    try:
        yield
    except (ConflictError, InternalError) as exc:
        cause = exc.__cause__
        state = cause.sqlstate if isinstance(cause, psycopg.IntegrityError) else None
        if state == _UNIQUE_VIOLATION:
            raise ConflictError(conflict, details=details) from cause
        if state == _FOREIGN_KEY_VIOLATION and missing is not None:
            raise NotFoundError(missing, details=details) from cause
        raise


def _after(created_at: str, id: str) -> str:
    # Keyset paging on (created_at, id): rows after the previous page's last key, or all rows for the first page.
    return f"(CAST(:after_at AS timestamptz) IS NULL OR ({created_at}, {id}) > (:after_at, :after_id))"


def _keyset(after: Sequence[Any] | None) -> dict[str, Any]:
    after_at, after_id = after if after is not None else (None, None)
    return {"after_at": after_at, "after_id": after_id}


@attrs.frozen(kw_only=True)
class RootAdmins:
    """Root-scope ``compute.admin`` bindings of enabled principals: how many there are, and how many would be left
    without the principal or binding about to go."""

    total: int
    remaining: int


class IamAdmin(PgRepository):
    """IAM's administrative statements in the store's schema, built once per store (the store makes this adapter
    once: ``store.repository(IAM_ADMIN)``, or bound to a transaction ``tx.repository(IAM_ADMIN)``)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        q = quote_schema(db.schema)
        self._lock_key = f"{db.schema}:iam-root-admins"
        principal_cols = "p.id, p.tenant_id, p.name, p.kind, p.disabled_at, p.created_at"
        credential_cols = (
            "c.id, c.principal_id, c.description, c.created_at, c.expires_at, c.revoked_at, c.last_used_at,"
            " CASE WHEN c.revoked_at IS NOT NULL THEN 'revoked'"
            " WHEN c.expired_at IS NOT NULL OR c.expires_at <= now() THEN 'expired' ELSE 'active' END"
        )
        binding_cols = "b.id, b.tenant_id, b.principal_id, b.role_id, r.name, b.scope_type, b.scope_id, b.created_at"
        role_cols = "r.id, r.tenant_id, r.name, r.actions, r.description, r.created_at"

        self._insert_tenant = db.sql(
            f"INSERT INTO {q}.iam_tenants (id, name) VALUES (:id, :name) RETURNING id, name, created_at"
        )
        self._list_tenants = db.sql(
            f"SELECT id, name, created_at FROM {q}.iam_tenants WHERE {_after('created_at', 'id')}"
            f" ORDER BY created_at, id LIMIT :limit"
        )

        self._insert_principal = db.sql(
            f"INSERT INTO {q}.iam_principals AS p (id, tenant_id, kind, name) VALUES (:id, :tenant, :kind, :name)"
            f" RETURNING {principal_cols}"
        )
        self._list_principals = db.sql(
            f"SELECT {principal_cols} FROM {q}.iam_principals p"
            f" WHERE p.tenant_id = :tenant AND {_after('p.created_at', 'p.id')}"
            f" ORDER BY p.created_at, p.id LIMIT :limit"
        )
        # FOR UPDATE: a disable and a new credential (FOR SHARE) for the same principal do not interleave.
        self._lock_principal = db.sql(
            f"SELECT {principal_cols} FROM {q}.iam_principals p WHERE p.id = :id AND p.tenant_id = :tenant FOR UPDATE"
        )
        self._share_principal = db.sql(
            f"SELECT {principal_cols} FROM {q}.iam_principals p WHERE p.id = :id AND p.tenant_id = :tenant FOR SHARE"
        )
        self._disable_principal = db.sql(
            f"UPDATE {q}.iam_principals AS p SET disabled_at = coalesce(p.disabled_at, now()) WHERE p.id = :id"
            f" RETURNING {principal_cols}"
        )

        self._insert_credential = db.sql(
            f"INSERT INTO {q}.iam_credentials AS c (id, principal_id, secret_hash, description, expires_at)"
            f" VALUES (:id, :principal, :hash, :description,"
            f" now() + make_interval(secs => CAST(:seconds AS double precision)))"
            f" RETURNING {credential_cols}"
        )
        self._list_credentials = db.sql(
            f"SELECT {credential_cols} FROM {q}.iam_credentials c JOIN {q}.iam_principals p ON p.id = c.principal_id"
            f" WHERE p.tenant_id = :tenant AND (CAST(:principal AS text) IS NULL OR c.principal_id = :principal)"
            f" AND {_after('c.created_at', 'c.id')}"
            f" ORDER BY c.created_at, c.id LIMIT :limit"
        )
        self._lock_credential = db.sql(
            f"SELECT c.principal_id FROM {q}.iam_credentials c JOIN {q}.iam_principals p ON p.id = c.principal_id"
            f" WHERE c.id = :id AND p.tenant_id = :tenant FOR UPDATE OF c"
        )
        self._revoke_credential = db.sql(
            f"WITH old AS (SELECT c.id, c.revoked_at FROM {q}.iam_credentials c"
            f" JOIN {q}.iam_principals p ON p.id = c.principal_id"
            f" WHERE c.id = :id AND p.tenant_id = :tenant FOR UPDATE OF c)"
            f" UPDATE {q}.iam_credentials AS c SET revoked_at = coalesce(old.revoked_at, now())"
            f" FROM old WHERE c.id = old.id RETURNING {credential_cols}, old.revoked_at IS NULL"
        )

        self._insert_role = db.sql(
            f"INSERT INTO {q}.iam_roles AS r (id, tenant_id, name, actions, description)"
            f" VALUES (:id, :tenant, :name, :actions, :description) RETURNING {role_cols}"
        )
        self._list_roles = db.sql(
            f"SELECT {role_cols} FROM {q}.iam_roles r WHERE (r.tenant_id IS NULL OR r.tenant_id = :tenant)"
            f" AND (CAST(:after_custom AS boolean) IS NULL OR (r.tenant_id IS NOT NULL, r.created_at, r.id)"
            f" > (CAST(:after_custom AS boolean), :after_at, :after_id))"
            f" ORDER BY r.tenant_id IS NOT NULL, r.created_at, r.id LIMIT :limit"
        )

        self._insert_binding = db.sql(
            f"WITH b AS (INSERT INTO {q}.iam_bindings (id, role_id, principal_id, tenant_id, scope_type, scope_id)"
            f" SELECT :id, r.id, p.id, p.tenant_id, :scope_type, :scope_id"
            f" FROM {q}.iam_principals p, {q}.iam_roles r"
            f" WHERE p.id = :principal AND p.tenant_id = :tenant"
            f" AND r.id = :role AND (r.tenant_id IS NULL OR r.tenant_id = :tenant)"
            f" RETURNING *)"
            f" SELECT {binding_cols} FROM b JOIN {q}.iam_roles r ON r.id = b.role_id"
        )
        self._role_actions = db.sql(
            f"SELECT actions FROM {q}.iam_roles WHERE id = :role AND (tenant_id IS NULL OR tenant_id = :tenant)"
        )
        self._binding_parts = db.sql(
            f"SELECT EXISTS (SELECT 1 FROM {q}.iam_principals WHERE id = :principal AND tenant_id = :tenant),"
            f" EXISTS (SELECT 1 FROM {q}.iam_roles WHERE id = :role AND (tenant_id IS NULL OR tenant_id = :tenant))"
        )
        self._list_bindings = db.sql(
            f"SELECT {binding_cols} FROM {q}.iam_bindings b JOIN {q}.iam_roles r ON r.id = b.role_id"
            f" WHERE b.tenant_id = :tenant AND (CAST(:principal AS text) IS NULL OR b.principal_id = :principal)"
            f" AND {_after('b.created_at', 'b.id')}"
            f" ORDER BY b.created_at, b.id LIMIT :limit"
        )
        # A pool scope lies in the tenant the authorization projection records for the pool (None: no such pool).
        self._grants = db.sql(
            f"SELECT b.principal_id, r.actions, b.scope_type, b.scope_id,"
            f" CASE b.scope_type WHEN 'tenant' THEN b.scope_id WHEN 'pool' THEN pr.tenant_id END"
            f" FROM {q}.iam_bindings b JOIN {q}.iam_roles r ON r.id = b.role_id"
            f" LEFT JOIN {q}.authz_resources pr"
            f" ON b.scope_type = 'pool' AND pr.resource_type = 'pool' AND pr.resource_id = b.scope_id"
            f" WHERE b.principal_id = ANY(:principals)"
        )
        self._pool_tenant = db.sql(
            f"SELECT tenant_id FROM {q}.authz_resources WHERE resource_type = 'pool' AND resource_id = :pool"
        )
        self._lock_binding = db.sql(
            f"SELECT {binding_cols} FROM {q}.iam_bindings b JOIN {q}.iam_roles r ON r.id = b.role_id"
            f" WHERE b.id = :id AND b.tenant_id = :tenant FOR UPDATE OF b"
        )
        self._delete_binding = db.sql(f"DELETE FROM {q}.iam_bindings WHERE id = :id")

        self._lock_root_admins = db.sql("SELECT pg_advisory_xact_lock(hashtext(:key))")
        self._root_admins = db.sql(
            f"SELECT count(*),"
            f" count(*) FILTER (WHERE b.principal_id <> coalesce(CAST(:principal AS text), '')"
            f" AND b.id <> coalesce(CAST(:binding AS text), ''))"
            f" FROM {q}.iam_bindings b JOIN {q}.iam_principals p ON p.id = b.principal_id"
            f" WHERE b.role_id = 'compute.admin' AND b.scope_type = 'root' AND p.disabled_at IS NULL"
        )

    # --- running statements -------------------------------------------------------------------------------------

    async def _rows(self, method: str, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
        """The rows of a statement of ``method``, in the transaction this adapter is bound to."""
        return await self._fetch_in_transaction(method, statement, params)

    async def _row(self, method: str, statement: Statement, params: Mapping[str, Any]) -> Any:
        """The first row, or ``None`` when there is none."""
        rows = await self._rows(method, statement, params)
        return rows[0] if rows else None

    async def _one(self, method: str, statement: Statement, params: Mapping[str, Any]) -> Any:
        """The only row of a statement that always returns one (an INSERT ... RETURNING, an aggregate)."""
        rows = await self._rows(method, statement, params)
        if len(rows) != 1:
            raise InternalError("a statement answered an unexpected number of rows")
        return rows[0]

    # --- reads --------------------------------------------------------------------------------------------------

    # Each list reads one page: at most ``limit`` rows after the key ``after`` (the last key of the page before),
    # in the statement's order, which is by a unique key. The tenant filter holds whatever ``after`` is.

    async def list_tenants(self, *, after: Sequence[Any] | None, limit: int) -> list[Tenant]:
        """Tenants in ``(created_at, id)`` order."""
        rows = await self._fetch(self._list_tenants, {**_keyset(after), "limit": limit})
        return [_tenant(r) for r in rows]

    async def list_principals(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[Principal]:
        """The tenant's principals in ``(created_at, id)`` order."""
        rows = await self._fetch(self._list_principals, {"tenant": tenant, **_keyset(after), "limit": limit})
        return [_principal(r) for r in rows]

    async def list_credentials(
        self, tenant: str, principal_id: str | None, *, after: Sequence[Any] | None, limit: int
    ) -> list[CredentialInfo]:
        """The credentials of the tenant's principals, or of one of them (never a secret or its hash)."""
        params = {"tenant": tenant, "principal": principal_id, **_keyset(after), "limit": limit}
        return [_credential(r) for r in await self._fetch(self._list_credentials, params)]

    async def list_roles(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[Role]:
        """The built-in roles, then the tenant's own, oldest first; ``after`` is ``(custom, created_at, id)``."""
        after_custom, after_at, after_id = after if after is not None else (None, None, None)
        params = {
            "tenant": tenant,
            "after_custom": after_custom,
            "after_at": after_at,
            "after_id": after_id,
            "limit": limit,
        }
        return [_role(r) for r in await self._fetch(self._list_roles, params)]

    async def list_bindings(
        self, tenant: str, principal_id: str | None, *, after: Sequence[Any] | None, limit: int
    ) -> list[Binding]:
        """The bindings of the tenant's principals, or of one of them."""
        params = {"tenant": tenant, "principal": principal_id, **_keyset(after), "limit": limit}
        return [_binding(r) for r in await self._fetch(self._list_bindings, params)]

    # --- writes, and the reads they decide on: in the transaction this adapter is bound to ------------------------

    async def create_tenant(self, *, tenant_id: str, name: str) -> Tenant:
        """Insert a tenant. Raises ``ConflictError`` when the name is taken."""
        with _constraints(conflict=f"a tenant named {name!r} exists", details={"path": "name", "name": name}):
            row = await self._one("create_tenant", self._insert_tenant, {"id": tenant_id, "name": name})
        return _tenant(row)

    async def create_principal(self, *, principal_id: str, tenant: str, name: str, kind: str) -> Principal:
        """Insert a principal. Raises ``NotFoundError`` (no such tenant) or ``ConflictError`` (name taken)."""
        params = {"id": principal_id, "tenant": tenant, "name": name, "kind": kind}
        with _constraints(
            conflict=f"a principal named {name!r} exists in this tenant",
            missing="no such tenant",
            details={"tenant": tenant, "name": name},
        ):
            row = await self._one("create_principal", self._insert_principal, params)
        return _principal(row)

    async def lock_principal(self, *, tenant: str, principal_id: str, share: bool) -> Principal | None:
        """The principal, locked until the transaction ends (``share``: against a disable only); ``None`` when it is
        not in ``tenant``."""
        statement = self._share_principal if share else self._lock_principal
        row = await self._row("lock_principal", statement, {"id": principal_id, "tenant": tenant})
        return _principal(row) if row is not None else None

    async def disable_principal(self, *, principal_id: str) -> Principal:
        """Mark a (locked) principal disabled, keeping the first time it was."""
        row = await self._one("disable_principal", self._disable_principal, {"id": principal_id})
        return _principal(row)

    async def root_admins(
        self, *, without_principal: str | None = None, without_binding: str | None = None
    ) -> RootAdmins:
        """Count root-scope ``compute.admin`` bindings of enabled principals, and those left without a principal or a
        binding. Serialized across processes until the transaction ends, so two changes cannot both take the last
        but one."""
        await self._rows("root_admins", self._lock_root_admins, {"key": self._lock_key})
        params = {"principal": without_principal, "binding": without_binding}
        total, remaining = await self._one("root_admins", self._root_admins, params)
        return RootAdmins(total=int(total), remaining=int(remaining))

    async def create_credential(
        self,
        *,
        credential_id: str,
        principal_id: str,
        secret_hash: bytes,
        expires_in_seconds: int | None,
        description: str,
    ) -> CredentialInfo:
        """Insert a credential (only the secret's hash), expiring ``expires_in_seconds`` from the database's now."""
        params = {
            "id": credential_id,
            "principal": principal_id,
            "hash": secret_hash,
            "description": description,
            "seconds": expires_in_seconds,
        }
        with _constraints(conflict="a credential with this id exists; retry", details={}):
            row = await self._one("create_credential", self._insert_credential, params)
        return _credential(row)

    async def lock_credential(self, *, tenant: str, credential_id: str) -> str | None:
        """The principal of a credential of ``tenant``, the credential locked until the transaction ends; ``None``
        when the tenant has no such credential."""
        row = await self._row("lock_credential", self._lock_credential, {"id": credential_id, "tenant": tenant})
        return row[0] if row is not None else None

    async def revoke_credential(self, *, tenant: str, credential_id: str) -> tuple[CredentialInfo, bool] | None:
        """Revoke a credential of ``tenant`` (keeping the first revocation time); whether this call revoked it.
        ``None`` when the tenant has no such credential."""
        params = {"id": credential_id, "tenant": tenant}
        row = await self._row("revoke_credential", self._revoke_credential, params)
        if row is None:
            return None
        return _credential(row), bool(row[8])

    async def create_role(
        self, *, role_id: str, tenant: str, name: str, actions: Sequence[str], description: str
    ) -> Role:
        """Insert a custom role. Raises ``NotFoundError`` (no such tenant) or ``ConflictError`` (name taken)."""
        params = {"id": role_id, "tenant": tenant, "name": name, "actions": list(actions), "description": description}
        with _constraints(
            conflict=f"a role named {name!r} exists in this tenant",
            missing="no such tenant",
            details={"tenant": tenant, "name": name},
        ):
            row = await self._one("create_role", self._insert_role, params)
        return _role(row)

    async def create_binding(
        self,
        *,
        binding_id: str,
        tenant: str,
        principal_id: str,
        role: str,
        scope_type: str,
        scope_id: str | None,
    ) -> Binding:
        """Insert a binding of a principal of ``tenant`` to a built-in role or a role of ``tenant``.

        Raises:
            NotFoundError: the principal is not in ``tenant``, or the role is neither built-in nor ``tenant``'s.
            ConflictError: the same role is already bound to the principal on that scope.
        """
        params = {
            "id": binding_id,
            "tenant": tenant,
            "principal": principal_id,
            "role": role,
            "scope_type": scope_type,
            "scope_id": scope_id,
        }
        details = {"principal_id": principal_id, "role": role, "scope_type": scope_type, "scope_id": scope_id}
        with _constraints(conflict="this role is already bound to the principal on that scope", details=details):
            row = await self._row("create_binding", self._insert_binding, params)
        if row is not None:
            return _binding(row)
        principal_found, role_found = await self._one("create_binding", self._binding_parts, params)
        if not principal_found:
            raise NotFoundError("no such principal in this tenant", details={"path": "principal_id", **details})
        if not role_found:
            raise NotFoundError("no such role in this tenant", details={"path": "role", **details})
        raise InternalError("the binding was not stored")

    async def grants(self, *, principal_ids: Sequence[str]) -> dict[str, tuple[Grant, ...]]:
        """What the bindings of each principal give it, read in the transaction (a principal without bindings maps to
        ``()``)."""
        rows = await self._rows("grants", self._grants, {"principals": list(principal_ids)})
        grants: dict[str, tuple[Grant, ...]] = {p: () for p in principal_ids}
        for principal_id, actions, scope_type, scope_id, scope_tenant in rows:
            grant = Grant(patterns=tuple(actions), scope_type=scope_type, scope_id=scope_id, scope_tenant=scope_tenant)
            grants[principal_id] += (grant,)
        return grants

    async def pool_tenant(self, *, pool_id: str) -> str | None:
        """The tenant of a pool, read in the transaction; ``None`` when no pool has that id."""
        row = await self._row("pool_tenant", self._pool_tenant, {"pool": pool_id})
        return row[0] if row is not None else None

    async def role_actions(self, *, tenant: str, role: str) -> tuple[str, ...] | None:
        """The action patterns of a built-in role or of a role of ``tenant``; ``None`` when there is no such role."""
        row = await self._row("role_actions", self._role_actions, {"tenant": tenant, "role": role})
        return tuple(row[0]) if row is not None else None

    async def lock_binding(self, *, tenant: str, binding_id: str) -> Binding | None:
        """A binding of ``tenant``, locked until the transaction ends; ``None`` when there is none."""
        row = await self._row("lock_binding", self._lock_binding, {"id": binding_id, "tenant": tenant})
        return _binding(row) if row is not None else None

    async def delete_binding(self, *, binding_id: str) -> None:
        """Delete a (locked) binding."""
        await self._rows("delete_binding", self._delete_binding, {"id": binding_id})


IAM_ADMIN: Repository[IamAdmin] = Repository(
    module="iam", name="admin", adapters={"postgresql": "bettercompute_iam._pg._admin"}
)
"""``tx.repository(IAM_ADMIN)`` in a transaction, ``store.repository(IAM_ADMIN)`` for the listings."""

REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"admin": IamAdmin}
"""The adapters the PostgreSQL store finds here through ``IAM_ADMIN.adapters``, by ``Repository.name``."""


# --- rows to outputs (rows never leave this module) --------------------------------------------------------------


def _tenant(row: Any) -> Tenant:
    return Tenant(id=row[0], name=row[1], created_at=_at(row[2]))


def _principal(row: Any) -> Principal:
    return Principal(
        id=row[0], tenant=row[1], name=row[2], kind=row[3], disabled_at=_utc(row[4]), created_at=_at(row[5])
    )


def _credential(row: Any) -> CredentialInfo:
    return CredentialInfo(
        id=row[0],
        principal_id=row[1],
        description=row[2],
        created_at=_at(row[3]),
        expires_at=_utc(row[4]),
        revoked_at=_utc(row[5]),
        last_used_at=_utc(row[6]),
        state=row[7],
    )


def _role(row: Any) -> Role:
    return Role(
        id=row[0],
        tenant=row[1],
        name=row[2],
        actions=tuple(row[3]),
        description=row[4],
        builtin=row[1] is None,
        created_at=_at(row[5]),
    )


def _binding(row: Any) -> Binding:
    return Binding(
        id=row[0],
        tenant=row[1],
        principal_id=row[2],
        role=row[3],
        role_name=row[4],
        scope_type=row[5],
        scope_id=row[6],
        created_at=_at(row[7]),
    )
