"""The store's pooled psycopg connections: what a cancelled or failed transaction leaves behind, the pool's bounds,
and the rows statements return."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.pq import TransactionStatus

from bettercompute.errors import InternalError, UnavailableError
from bettercompute_store_pg import PgStore, connection_of, fetch_in
from bettercompute_store_pg import _db as db
from bettercompute_store_pg._pool import pipelined

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@pytest.fixture
async def one_connection(database_url: str, fresh_schema: str) -> AsyncIterator[PgStore]:
    """A store whose pool holds a single connection, so the next call gets whatever the last one gave back; and a
    table to write to."""
    store = PgStore(database_url, schema=fresh_schema, pool_size=1)
    await store.open()
    try:
        async with store.connection() as conn:
            await conn.execute(f'CREATE TABLE "{fresh_schema}".marks (id integer PRIMARY KEY)')
        yield store
    finally:
        await store.close()


async def marks(store: PgStore) -> list[int]:
    return [row.id for row in await store.fetch(store.sql("SELECT id FROM {s}.marks ORDER BY id"), {})]


async def pooled(store: PgStore) -> psycopg.AsyncConnection[Any]:
    """The connection the pool hands out next, checked back in at once; it must be idle and in autocommit."""
    async with store.connection() as conn:
        assert conn.info.transaction_status == TransactionStatus.IDLE
        assert conn.autocommit
        return conn


async def test_a_transaction_cancelled_between_statements_rolls_back_and_keeps_its_connection(
    one_connection: PgStore,
) -> None:
    store = one_connection
    before = await pooled(store)
    with anyio.move_on_after(0.2) as scope:
        async with store.transaction() as tx:
            await fetch_in(connection_of(tx), store.sql("INSERT INTO {s}.marks VALUES (1)"), {})
            await anyio.sleep(5)
    assert scope.cancelled_caught
    assert await marks(store) == []
    # The rollback ran (shielded from the cancellation), so the same connection went back to the pool, clean.
    assert await pooled(store) is before
    assert store.pool_usage.in_use == 0


async def test_a_transaction_cancelled_mid_statement_rolls_back_and_its_connection_is_dropped(
    one_connection: PgStore,
) -> None:
    store = one_connection
    before = await pooled(store)
    started = time.monotonic()
    with anyio.move_on_after(0.3) as scope:
        async with store.transaction() as tx:
            conn = connection_of(tx)
            await fetch_in(conn, store.sql("INSERT INTO {s}.marks VALUES (1)"), {})
            await fetch_in(conn, store.sql("SELECT pg_sleep(5)"), {})
    assert scope.cancelled_caught
    assert time.monotonic() - started < 4
    # The server rolled the transaction back; the pool of one hands out a working connection, never the old one
    # with its statement still running.
    assert await marks(store) == []
    after = await pooled(store)
    assert after is not before
    async with store.transaction() as tx:
        await fetch_in(connection_of(tx), store.sql("INSERT INTO {s}.marks VALUES (2)"), {})
    assert await marks(store) == [2]
    assert store.pool_usage.in_use == 0


async def test_a_failed_statement_rolls_back_and_the_connection_is_reused(one_connection: PgStore) -> None:
    store = one_connection
    before = await pooled(store)
    # The caller's own error, then the server's: both roll back on the same connection, which stays pooled.
    with pytest.raises(UnavailableError):
        async with store.transaction() as tx:
            await fetch_in(connection_of(tx), store.sql("INSERT INTO {s}.marks VALUES (1)"), {})
            raise UnavailableError("the caller gave up")
    with pytest.raises(InternalError):
        async with store.transaction() as tx:
            await fetch_in(connection_of(tx), store.sql("INSERT INTO {s}.marks VALUES (1)"), {})
            await fetch_in(connection_of(tx), store.sql("SELECT 1 / 0"), {})
    assert await marks(store) == []
    assert await pooled(store) is before


async def test_an_exhausted_pool_is_unavailable_after_the_checkout_timeout(
    database_url: str, fresh_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "CHECKOUT_TIMEOUT_SECONDS", 1)  # the same rule, without waiting the real 10 s
    store = PgStore(database_url, schema=fresh_schema, pool_size=1)
    await store.open()
    try:
        async with store.connection():
            started = time.monotonic()
            with pytest.raises(UnavailableError) as caught:
                await store.now()
            assert 0.9 < time.monotonic() - started < 5
            assert str(caught.value) == "the database is unreachable"
        await store.now()  # free again
    finally:
        await store.close()


async def test_a_burst_never_holds_more_connections_than_the_pool_has(database_url: str, fresh_schema: str) -> None:
    store = PgStore(database_url, schema=fresh_schema, pool_size=2)
    await store.open()
    try:
        sleep = store.sql("SELECT pg_sleep(0.05)")
        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(store.fetch, sleep, {})
        usage = store.pool_usage
        assert usage.peak == store.pool_capacity == 2
        assert usage.in_use == 0 and usage.checkouts == 12
    finally:
        await store.close()


async def test_rows_have_their_columns_as_attributes_even_repeated_ones(pg_store: PgStore) -> None:
    rows = await pg_store.fetch(pg_store.sql("SELECT 1 AS n, 2 AS n, 3, 'a' AS name, NULL::jsonb AS data"), {})
    assert len(rows) == 1
    row = rows[0]
    assert tuple(row) == (1, 2, 3, "a", None)
    assert row.n == 1 and row.name == "a" and row.data is None
    # A statement that returns no rows answers an empty list, whatever path ran it.
    assert await pg_store.fetch(pg_store.sql("UPDATE {s}.leases SET holder = holder WHERE false"), {}) == []
    async with pg_store.transaction() as tx:
        assert await fetch_in(connection_of(tx), pg_store.sql("UPDATE {s}.leases SET holder = holder"), {}) == []


async def test_a_round_trip_interrupted_mid_pipeline_is_finished_before_its_connection_closes(
    one_connection: PgStore,
) -> None:
    # asyncio's own cancellation (a gateway closing cancels a session's task), which no anyio shield holds back,
    # reaching a pipeline's last round trip just as psycopg lets the event loop run because the process was busy
    # for a while (a garbage collection, another process on the CPU). With nothing of the transaction still in
    # flight, psycopg gives the round trip up at once, as a suspended generator. It must be finished then: left
    # to the garbage collector, it ran after the store had closed the connection and failed there (an unraisable
    # exception, so an error here).
    store = one_connection

    async def busy_when_cancelled() -> None:
        async with store.transaction() as tx:
            conn = connection_of(tx)
            await fetch_in(conn, store.sql("INSERT INTO {s}.marks VALUES (1)"), {})
            async with pipelined(conn):
                time.sleep(0.05)  # noqa: ASYNC251 -- busy: psycopg lets the loop run before the next round trip
                this = asyncio.current_task()
                assert this is not None
                this.cancel()  # as if by another task meanwhile

    task = asyncio.create_task(busy_when_cancelled())
    with pytest.raises(asyncio.CancelledError):
        await task
    del task  # it holds its cancellation, and through it every frame the cancellation went through
    assert await marks(store) == []
    await store.close()
    gc.collect()
