"""The per-test schema copy (``tests/integration/_template.py``) against a schema migrated from nothing."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from bettercompute.ports import WorkItem
from bettercompute_store_pg import PgStore

from .._template import Template, clone_schema, copy_script, fingerprint, migrate_template, recycle_schema
from ..conftest import drop_schema, new_schema

pytestmark = pytest.mark.anyio


async def test_a_copy_cannot_be_told_from_a_schema_migrated_from_nothing(
    database_url: str, schema_copy_script: str, empty_schema: str
) -> None:
    await migrate_template(database_url, empty_schema)
    copy = new_schema()
    try:
        clone_schema(database_url, schema_copy_script, copy)
        migrated, copied = fingerprint(database_url, empty_schema), fingerprint(database_url, copy)
        assert migrated["relations"], "the migrations made nothing to compare"
        for part in migrated:
            assert copied[part] == migrated[part], part
    finally:
        drop_schema(database_url, copy)


async def test_a_store_on_a_copy_applies_nothing_and_works(database_url: str, fresh_schema: str) -> None:
    async with PgStore(database_url, schema=fresh_schema, pool_size=2) as store:
        assert await store.install() == []
        # A serial column draws from the copy's own sequence (the fingerprint compares the defaults too).
        await store.queue.enqueue([WorkItem(kind="k", key="a"), WorkItem(kind="k", key="b")])
        claims = await store.queue.claim(kinds=["k"], holder="h", limit=10, claim_for=dt.timedelta(minutes=1))
        assert sorted(c.key for c in claims) == ["a", "b"]


def test_what_a_copy_cannot_reproduce_fails_loudly(database_url: str, empty_schema: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{empty_schema}"')
        conn.execute(f'CREATE TABLE "{empty_schema}".t (id integer)')
        conn.execute(f'CREATE VIEW "{empty_schema}".v AS SELECT id FROM "{empty_schema}".t')
    with pytest.raises(RuntimeError, match="cannot reproduce"):
        copy_script(database_url, empty_schema)


async def test_a_used_copy_recycled_cannot_be_told_from_a_new_one(
    database_url: str, schema_template: Template, fresh_schema: str
) -> None:
    """What a test leaves in its copy (rows, sequence positions, a recorded migration gone) is gone from the
    recycled one."""
    new, used, recycled = new_schema(), fresh_schema, new_schema()
    try:
        clone_schema(database_url, schema_template.copy, new)
        async with PgStore(database_url, schema=used, pool_size=2) as store:
            await store.queue.enqueue([WorkItem(kind="k", key="a"), WorkItem(kind="k", key="b")])
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DELETE FROM "{used}".schema_migrations WHERE version = 1')
        assert fingerprint(database_url, used) != fingerprint(database_url, new)

        assert recycle_schema(database_url, schema_template, used, recycled)
        with psycopg.connect(database_url, autocommit=True) as conn:
            names = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", ([used, recycled],))
            assert [row[0] for row in names] == [recycled]
        assert fingerprint(database_url, recycled) == fingerprint(database_url, new)
    finally:
        for schema in (new, recycled):
            drop_schema(database_url, schema)


@pytest.mark.parametrize(
    "change",
    [
        "CREATE TABLE {s}.extra (id integer)",
        "ALTER TABLE {s}.audit ADD COLUMN extra integer",
        "ALTER TABLE {s}.audit DROP COLUMN action",
        "ALTER TABLE {s}.audit ALTER COLUMN action DROP NOT NULL",
        "ALTER TABLE {s}.work_queue ALTER COLUMN id SET DEFAULT 0",
        "CREATE INDEX extra ON {s}.audit (action)",
        "ALTER TABLE {s}.iam_principals DROP CONSTRAINT iam_principals_tenant_id_fkey",
        "CREATE SEQUENCE {s}.extra",
        "CREATE FUNCTION {s}.extra() RETURNS integer LANGUAGE sql AS 'SELECT 1'",
        "CREATE VIEW {s}.extra AS SELECT 1 AS one",
        "DROP SCHEMA {s} CASCADE",
    ],
)
def test_a_copy_whose_structure_a_test_changed_is_not_recycled(
    database_url: str, schema_template: Template, fresh_schema: str, change: str
) -> None:
    recycled = new_schema()
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(change.replace("{s}", fresh_schema).encode())
        assert not recycle_schema(database_url, schema_template, fresh_schema, recycled)
    finally:
        drop_schema(database_url, recycled)
