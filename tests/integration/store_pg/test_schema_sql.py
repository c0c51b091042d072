"""``bettercompute_store_pg/schema.sql``: the checked-in dump is what the migrations make now, on this server (CI runs
this directory on the system PostgreSQL and again on the embedded one, of another major version), and the dump
refuses to leave out what it cannot show."""

from __future__ import annotations

import psycopg
import pytest

from bettercompute.ports import Migration
from bettercompute_cli._schemadump import TARGET, _Catalog, render
from bettercompute_store_pg import PgStore


def test_schema_sql_is_what_the_migrations_make_now(database_url: str) -> None:
    # render() raises SchemaDumpError when the schema holds anything it cannot show: today's holds nothing such.
    made = render(database_url)
    assert made == TARGET.read_text(encoding="utf-8"), "schema.sql is stale: run `make schema` and commit it"
    assert "schema_dump_" not in made  # the scratch schema's name is the placeholder everywhere
    # Admission's functions in full, as their last migration left them, and the bookings' exclusion constraint.
    assert "CREATE OR REPLACE FUNCTION {schema}.bc_admit_reservation(p jsonb)" in made
    assert "p_identity := kept ->> 'identity';" in made  # a line of bc_undo_draft's body, as capacity 4 redefined it
    assert "EXCLUDE USING gist (atom_id WITH =, during WITH &&)" in made
    store = ("runtime", "pools", "images", "commands", "usage", "capacity", "webhooks", "secrets", "nodes")
    for module in (*store, "iam", "metal", "vps"):
        assert f"\n-- {module} 1: " in made


@pytest.mark.anyio
async def test_the_dump_refuses_what_it_cannot_show(database_url: str, empty_schema: str) -> None:
    cannot = Migration(
        version=1,
        name="what the dump cannot show",
        sql="""
CREATE TABLE {schema}.t (id integer PRIMARY KEY);
ALTER TABLE {schema}.t ENABLE ROW LEVEL SECURITY;
CREATE VIEW {schema}.v AS SELECT id FROM {schema}.t;
CREATE TYPE {schema}.mood AS ENUM ('ok');
CREATE SEQUENCE {schema}.counter;
CREATE TABLE {schema}.numbered (id bigserial PRIMARY KEY);
""",
    )
    async with PgStore(database_url, schema=empty_schema, pool_size=1) as store:
        await store.migrate("probe", [cannot])
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("SET search_path = ''")
        refused = await _Catalog(conn, empty_schema).refused()
    # A serial column's sequence is shown by its default: only the one of its own is refused.
    assert refused == ["relation v of kind v", "sequence counter", "table t with row security", "type mood"]
