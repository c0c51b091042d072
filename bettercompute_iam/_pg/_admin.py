"""The repository behind IAM's method groups (tenants, principals, credentials, roles, bindings): ``IamAdmin``,
reached by the key ``IAM_ADMIN`` as every repository is. Its statements are in ``_statements``.

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
from bettercompute_store_pg import Database, PgRepository, Statement

from .._policy import Grant
from .._schemas import Binding, CredentialInfo, Principal, Role, Tenant
from . import _statements as sql

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


def _keyset(after: Sequence[Any] | None) -> dict[str, Any]:
    """The parameters of a page's keyset condition (``_statements``: rows after ``after``, or all of them)."""
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
        self._lock_key = f"{db.schema}:iam-root-admins"
        self._insert_tenant = db.sql(sql.INSERT_TENANT)
        self._list_tenants = db.sql(sql.LIST_TENANTS)
        self._insert_principal = db.sql(sql.INSERT_PRINCIPAL)
        self._list_principals = db.sql(sql.LIST_PRINCIPALS)
        self._lock_principal = db.sql(sql.LOCK_PRINCIPAL)
        self._share_principal = db.sql(sql.SHARE_PRINCIPAL)
        self._disable_principal = db.sql(sql.DISABLE_PRINCIPAL)
        self._insert_credential = db.sql(sql.INSERT_CREDENTIAL)
        self._list_credentials = db.sql(sql.LIST_CREDENTIALS)
        self._lock_credential = db.sql(sql.LOCK_CREDENTIAL)
        self._revoke_credential = db.sql(sql.REVOKE_CREDENTIAL)
        self._insert_role = db.sql(sql.INSERT_ROLE)
        self._list_roles = db.sql(sql.LIST_ROLES)
        self._role_actions = db.sql(sql.ROLE_ACTIONS)
        self._insert_binding = db.sql(sql.INSERT_BINDING)
        self._binding_parts = db.sql(sql.BINDING_PARTS)
        self._list_bindings = db.sql(sql.LIST_BINDINGS)
        self._lock_binding = db.sql(sql.LOCK_BINDING)
        self._delete_binding = db.sql(sql.DELETE_BINDING)
        self._grants = db.sql(sql.GRANTS)
        self._pool_tenant = db.sql(sql.POOL_TENANT)
        self._lock_root_admins = db.sql(sql.ADVISORY_LOCK)
        self._root_admins = db.sql(sql.ROOT_ADMINS)

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
