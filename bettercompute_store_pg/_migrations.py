"""The migration runner: per-module versions in ``schema_migrations``, serialized by an advisory lock."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bettercompute.errors import InvalidConfigError
from bettercompute.ports import Migration

from ._schema import migration_lock_key, quote_schema, render

__all__ = ["run_migrations"]

_LOCK = text("SELECT pg_advisory_xact_lock(:key)")


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


async def run_migrations(engine: AsyncEngine, schema: str, module: str, migrations: Sequence[Migration]) -> list[int]:
    """Apply ``module``'s pending migrations in one transaction, under the schema's migration lock.

    The lock is transaction-scoped, so it works through PgBouncer in transaction mode and cannot leak if the
    process dies. Migrations that fail roll back together with their bookkeeping.

    Returns:
        The versions this call applied, in order.

    Raises:
        InvalidConfigError: Duplicate versions, or a recorded version whose name changed.
    """
    ordered = _check_declared(module, migrations)
    quoted = quote_schema(schema)
    async with engine.connect() as conn, conn.begin():
        await conn.execute(_LOCK, {"key": migration_lock_key(schema)})
        # Under the lock, so two processes cannot race to create the same schema.
        await conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        await conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {quoted}.schema_migrations ("
            " module text NOT NULL, version integer NOT NULL, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (module, version))"
        )
        result = await conn.execute(
            text(f"SELECT version, name FROM {quoted}.schema_migrations WHERE module = :module"), {"module": module}
        )
        recorded: dict[int, str] = {row.version: row.name for row in result}
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
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None  # a checked-out connection always has its psycopg connection
        record = text(
            f"INSERT INTO {quoted}.schema_migrations (module, version, name) VALUES (:module, :version, :name)"
        )
        for migration in ordered:
            if migration.version in recorded:
                continue
            # Straight to psycopg without parameters: sent as one simple query (so a migration may hold several
            # statements) and never scanned for placeholders (so a literal '%' stays one).
            await driver.execute(render(migration.sql, schema))
            await conn.execute(record, {"module": module, "version": migration.version, "name": migration.name})
            applied.append(migration.version)
    return applied
