"""The per-test schema copy (``tests/integration/_template.py``) against a schema migrated from nothing."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from bettercompute.ports import WorkItem
from bettercompute_store_pg import PgStore

from .._template import clone_schema, copy_script, fingerprint, migrate_template
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
