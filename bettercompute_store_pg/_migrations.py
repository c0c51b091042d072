"""The migration runner: per-module versions in ``schema_migrations``, serialized by an advisory lock."""

from __future__ import annotations

from collections.abc import Sequence

from bettercompute.errors import InvalidConfigError
from bettercompute.ports import Migration

from ._db import Connection, Statement, fetch_in
from ._schema import migration_lock_key, quote_schema, render

__all__ = ["run_migrations"]

_LOCK = Statement.of("SELECT pg_advisory_xact_lock(:key)")


def _check_declared(module: str, migrations: Sequence[Migration]) -> list[Migration]:
    problems: list[dict[str, object]] = []
    seen: set[int] = set()
    for migration in migrations:
        if migration.version in seen:
            problems.append({"module": module, "version": migration.version, "problem": "duplicate version"})
        seen.add(migration.version)
    if problems:
        raise InvalidConfigError(f"the migrations of module {module!r} are invalid", details={"problems": problems})
    return sorted(migrations, key=lambda m: m.version)


async def run_migrations(conn: Connection, schema: str, module: str, migrations: Sequence[Migration]) -> list[int]:
    """Apply ``module``'s pending migrations in the transaction open on ``conn``, under the schema's migration lock.

    The lock is transaction-scoped, so it works through PgBouncer in transaction mode and cannot leak if the
    process dies. Migrations that fail roll back together with their bookkeeping.

    Returns:
        The versions this call applied, in order.

    Raises:
        InvalidConfigError: Duplicate versions, or a recorded version whose name changed.
    """
    ordered = _check_declared(module, migrations)
    quoted = quote_schema(schema)
    await fetch_in(conn, _LOCK, {"key": migration_lock_key(schema)})
    # Under the lock, so two processes cannot race to create the same schema. Statements without parameters go
    # to the server as one simple query each: never prepared, never scanned for placeholders (a literal '%' stays
    # one), and a migration may hold several statements.
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}", prepare=False)
    await conn.execute(
        f"CREATE TABLE IF NOT EXISTS {quoted}.schema_migrations ("
        " module text NOT NULL, version integer NOT NULL, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (module, version))",
        prepare=False,
    )
    rows = await fetch_in(
        conn,
        Statement.of(f"SELECT version, name FROM {quoted}.schema_migrations WHERE module = :module"),
        {"module": module},
    )
    recorded: dict[int, str] = {row.version: row.name for row in rows}
    renamed = [
        {"module": module, "version": m.version, "recorded": recorded[m.version], "declared": m.name}
        for m in ordered
        if m.version in recorded and recorded[m.version] != m.name
    ]
    if renamed:
        raise InvalidConfigError(
            f"a recorded migration of module {module!r} changed its name", details={"problems": renamed}
        )
    applied: list[int] = []
    record = Statement.of(
        f"INSERT INTO {quoted}.schema_migrations (module, version, name) VALUES (:module, :version, :name)"
    )
    for migration in ordered:
        if migration.version in recorded:
            continue
        await conn.execute(render(migration.sql, schema), prepare=False)
        await fetch_in(conn, record, {"module": module, "version": migration.version, "name": migration.name})
        applied.append(migration.version)
    return applied
