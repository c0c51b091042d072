"""The migration runner: per-module versions in ``schema_migrations``, serialized by an advisory lock.

Each module's tables are migrated under its own name, from ``modules/<name>/_migrations.py`` (found by name, so a new
module adds a file and no line anywhere else). ``bettercompute_store_pg/schema.sql`` shows what they all make today.

There is no legacy path. Before this layout, pre-release code migrated every table under one module, ``"core"``
(versions 1 to 12), and the store kept that list frozen (in ``_schema``) to upgrade such a schema in place at every
``install()``, for the modules' first versions to adopt. It was removed before the first public release: only
databases of that pre-release code record ``"core"``, a fresh schema never ran the list, and keeping it cost 440
lines of DDL no one could change, a second transaction at every start and an ``adopts`` on every module's first
version. A schema migrated since by the per-module code carries its old ``"core"`` rows harmlessly; one that only
the older code ever migrated fails at its first table (it exists already), and is dropped and migrated again.
``Migration.adopts`` stays, for a release that moves tables from one module to another in schemas already migrated.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from types import ModuleType

from bettercompute.errors import InvalidConfigError
from bettercompute.ports import Migration

from ._db import Connection, Statement, fetch_in
from ._schema import migration_lock_key, quote_schema, render
from ._tables import MIGRATIONS as RUNTIME_TABLES

__all__ = ["RUNTIME", "run_migrations", "shipped_formerly", "shipped_migrations"]

RUNTIME = "runtime"
"""The name the runtime's own tables are migrated under (by ``PgStore.install()``, never as a module)."""

_LOCK = Statement.of("SELECT pg_advisory_xact_lock(:key)")
_PACKAGE = "bettercompute_store_pg.modules"
_MODULE_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
# A renamed module's history, carried over once: only where the new name has nothing recorded yet.
_CARRY_OVER = """
INSERT INTO {s}.schema_migrations (module, version, name, applied_at)
SELECT :module, version, name, applied_at FROM {s}.schema_migrations
WHERE module = ANY(CAST(:formerly AS text[]))
  AND NOT EXISTS (SELECT 1 FROM {s}.schema_migrations WHERE module = :module)
ON CONFLICT (module, version) DO NOTHING
RETURNING version
"""


def _shipped(module: str) -> ModuleType | None:
    """``modules/<module>/_migrations.py`` of this package, or ``None``."""
    if not _MODULE_NAME.fullmatch(module):
        return None
    name = f"{_PACKAGE}.{module}._migrations"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # Only the absence of that package or file means "nothing shipped"; a broken import inside it is a bug.
        if exc.name is not None and (exc.name == name or name.startswith(exc.name + ".")):
            return None
        raise


def shipped_migrations(module: str) -> tuple[Migration, ...]:
    """What this package ships for the module named ``module`` (``modules/<module>/_migrations.py``), or ``()``;
    for ``RUNTIME``, the store's own tables (``_tables.py``)."""
    if module == RUNTIME:
        return tuple(RUNTIME_TABLES)
    found = _shipped(module)
    return tuple(found.MIGRATIONS) if found is not None else ()


def shipped_formerly(module: str) -> tuple[str, ...]:
    """The names the module named ``module`` was migrated under before it was renamed (its ``FORMERLY``), or
    ``()``."""
    found = _shipped(module)
    return tuple(getattr(found, "FORMERLY", ())) if found is not None else ()


def _check_declared(module: str, migrations: Sequence[Migration]) -> list[Migration]:
    problems: list[dict[str, object]] = []
    seen: set[int] = set()
    for migration in migrations:
        if migration.version in seen:
            problems.append({"module": module, "version": migration.version, "problem": "duplicate version"})
        seen.add(migration.version)
        if migration.adopts is not None and migration.adopts[0] == module:
            problems.append({"module": module, "version": migration.version, "problem": "adopts its own module"})
    if problems:
        raise InvalidConfigError(f"the migrations of module {module!r} are invalid", details={"problems": problems})
    return sorted(migrations, key=lambda m: m.version)


async def run_migrations(
    conn: Connection, schema: str, module: str, migrations: Sequence[Migration], *, formerly: Sequence[str] = ()
) -> list[int]:
    """Apply ``module``'s pending migrations in the transaction open on ``conn``, under the schema's migration lock.

    ``formerly`` names what the module was called before a rename: where nothing is recorded under ``module`` yet,
    the versions recorded under those names are copied to it first (and kept, so older code running beside this
    during a rolling upgrade still finds its own).

    The lock is transaction-scoped, so it works through PgBouncer in transaction mode and cannot leak if the
    process dies. Migrations that fail roll back together with their bookkeeping.

    A pending migration that ``adopts`` a recorded step of another module is recorded without running (its tables
    are there already).

    Returns:
        The versions this call recorded, in order (run, or adopted).

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
    if formerly:
        await fetch_in(conn, Statement.of(_CARRY_OVER.format(s=quoted)), {"module": module, "formerly": list(formerly)})
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
    adopted = Statement.of(
        f"SELECT 1 AS found FROM {quoted}.schema_migrations WHERE module = :module AND version = :version"
    )
    for migration in ordered:
        if migration.version in recorded:
            continue
        # Under the lock, so the step it adopts cannot be recorded or not between this check and the record.
        if migration.adopts is None or not await fetch_in(
            conn, adopted, {"module": migration.adopts[0], "version": migration.adopts[1]}
        ):
            await conn.execute(render(migration.sql, schema), prepare=False)
        await fetch_in(conn, record, {"module": module, "version": migration.version, "name": migration.name})
        applied.append(migration.version)
    return applied
