"""The per-test schema copy (``tests/integration/_template.py``) against a schema migrated from nothing."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from bettercompute.ports import WorkItem
from bettercompute_store_pg import PgStore

from .._template import clone_schema, copy_script, migrate_template
from ..conftest import drop_schema, new_schema

pytestmark = pytest.mark.anyio

# What a schema is made of, as the catalog tells it, with the schema's own name taken out of every definition.
_FINGERPRINT = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions, obj_description(c.oid, 'pg_class')
        FROM pg_class c WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind <> 't' ORDER BY c.relname""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
               a.attgenerated, a.attcollation, pg_get_expr(d.adbin, d.adrelid),
               row_number() OVER (PARTITION BY c.relname ORDER BY a.attnum)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attnum""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid), k.condeferrable, k.condeferred
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE k.connamespace = %(s)s::regnamespace ORDER BY c.relname, k.conname""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s ORDER BY indexname""",
    "sequences": """
        SELECT s.relname, q.seqtypid, q.seqincrement, q.seqmin, q.seqmax, q.seqstart, q.seqcache, q.seqcycle,
               t.relname, a.attname
        FROM pg_sequence q JOIN pg_class s ON s.oid = q.seqrelid
        LEFT JOIN pg_depend dep ON dep.classid = 'pg_class'::regclass AND dep.objid = s.oid AND dep.deptype = 'a'
        LEFT JOIN pg_class t ON t.oid = dep.refobjid
        LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = dep.refobjsubid
        WHERE s.relnamespace = %(s)s::regnamespace ORDER BY s.relname""",
    "migrations": "SELECT module, version, name FROM {s}.schema_migrations ORDER BY module, version",
}


def _fingerprint(url: str, schema: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET search_path = ''")  # every name in a definition comes qualified with its schema
        for part, sql in _FINGERPRINT.items():
            rows = conn.execute(sql.replace("{s}", f'"{schema}"'), {"s": schema}).fetchall()
            found[part] = [tuple(str(v).replace(schema, "<schema>") for v in row) for row in rows]
        tables = [row[0] for row in found["relations"] if row[1] == "r"]
        found["rows"] = {t: conn.execute(f'SELECT count(*) FROM "{schema}"."{t}"').fetchone() for t in tables}
    return found


async def test_a_copy_cannot_be_told_from_a_schema_migrated_from_nothing(
    database_url: str, schema_copy_script: str, empty_schema: str
) -> None:
    await migrate_template(database_url, empty_schema)
    copy = new_schema()
    try:
        clone_schema(database_url, schema_copy_script, copy)
        migrated, copied = _fingerprint(database_url, empty_schema), _fingerprint(database_url, copy)
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
