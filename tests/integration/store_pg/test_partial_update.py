"""``PartialUpdate``: the ``UPDATE`` of whichever declared columns a call sets, each value cast as its column
declares, one statement per set of names, and nothing built for a name that was not declared."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bettercompute_store_pg import Database, PartialUpdate, PgStore

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

_COLUMNS = {"state": None, "hardware": "jsonb", "macs": "text[]", "ports": "integer[]"}
_RETURNING = "id, state, hardware, macs, ports, updated_at"


@pytest.fixture
async def things(pg_store: PgStore, fresh_schema: str) -> AsyncIterator[PgStore]:
    """The store, with a table of one row to update."""
    async with pg_store.connection() as conn:
        await conn.execute(
            f'CREATE TABLE "{fresh_schema}".things (id text PRIMARY KEY, state text, hardware jsonb,'
            " macs text[] NOT NULL DEFAULT '{}', ports integer[], updated_at timestamptz NOT NULL)"
        )
        await conn.execute(
            f"INSERT INTO \"{fresh_schema}\".things (id, state, updated_at) VALUES ('t1', 'new', '2000-01-01Z')"
        )
    yield pg_store


def _update(store: PgStore) -> PartialUpdate:
    db: Database = store._db  # the adapters' own handle: PartialUpdate is made where they are
    return PartialUpdate(db, "things", _COLUMNS, returning=_RETURNING)


async def _run(store: PgStore, update: PartialUpdate, key: str, **fields: Any) -> list[Any]:
    statement, params = update.prepare(key, fields)
    return await store.fetch(statement, params)


async def test_each_value_is_cast_as_its_column_declares_and_the_row_is_touched(things: PgStore) -> None:
    update = _update(things)
    hardware = {"cpus": 2, "gpus": [{"uuid": "GPU-1"}]}
    (row,) = await _run(
        things, update, "t1", state="ready", hardware=hardware, macs=("aa:bb", "cc:dd"), ports=frozenset({22})
    )
    assert (row.id, row.state, row.hardware, row.macs, row.ports) == ("t1", "ready", hardware, ["aa:bb", "cc:dd"], [22])
    assert row.updated_at > dt.datetime(2001, 1, 1, tzinfo=dt.UTC)
    (kinds,) = await things.fetch(
        things.sql("SELECT jsonb_typeof(hardware) AS hardware, pg_typeof(macs)::text AS macs FROM {s}.things"), {}
    )
    assert (kinds.hardware, kinds.macs) == ("object", "text[]")  # JSON stored as an object, not a string


async def test_only_the_named_columns_change_and_none_is_null(things: PgStore) -> None:
    update = _update(things)
    await _run(things, update, "t1", state="ready", hardware={"cpus": 2}, ports=[22, 80])
    (row,) = await _run(things, update, "t1", hardware=None, ports=None)
    assert (row.state, row.hardware, row.ports, row.macs) == ("ready", None, None, [])
    assert await _run(things, update, "t-unknown", state="gone") == []  # no such row: nothing returned


async def test_a_name_outside_the_declared_columns_is_refused_before_any_statement(things: PgStore) -> None:
    update = _update(things)
    for fields in ({"id": "t2"}, {"state": "x", "updated_at": None}, {"state; DROP TABLE things": 1}):
        with pytest.raises(ValueError, match="not a column of things"):
            update.prepare("t1", fields)
    assert update._statements == {}  # nothing built or kept for a refused set
    (row,) = await things.fetch(things.sql("SELECT id, state FROM {s}.things"), {})
    assert (row.id, row.state) == ("t1", "new")


async def test_the_statement_of_a_set_of_names_is_built_once(pg_store: PgStore) -> None:
    update = _update(pg_store)
    first = update.statement(["state", "macs"])
    assert update.statement(("macs", "state")) is first  # the same set in another order
    assert update.prepare("t1", {"state": "a", "macs": []})[0] is first
    other = update.statement(["state"])
    assert other is not first
    assert "CAST(%(macs)s AS text[])" in first.query and "state = %(state)s" in first.query
    assert "updated_at = now()" in other.query and "CAST" not in other.query


async def test_a_declaration_that_would_write_odd_sql_is_refused(pg_store: PgStore) -> None:
    db: Database = pg_store._db
    with pytest.raises(ValueError, match="not plain SQL identifiers"):
        PartialUpdate(db, "things; DROP TABLE x", {"state": None}, returning="id")
    with pytest.raises(ValueError, match="not plain SQL identifiers"):
        PartialUpdate(db, "things", {"State": None}, returning="id")
    with pytest.raises(ValueError, match="the key and the touched column"):
        PartialUpdate(db, "things", {"id": None}, returning="id")
    with pytest.raises(ValueError, match="the key and the touched column"):
        PartialUpdate(db, "things", {"updated_at": None}, returning="id")
