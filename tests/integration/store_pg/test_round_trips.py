"""How many round trips a transaction costs: BEGIN travels with the first statement, writes whose rows no one reads
(audit rows, projections, outbox events, work items) with the next statement or the COMMIT, and the server sees
every statement in the order the code made it. Also the pool's waiters."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from bettercompute.errors import ConflictError, InternalError, UnavailableError
from bettercompute.ports import AuditRecord, OutboxEvent, ResourceRef, WorkItem
from bettercompute_store_pg import PgStore, connection_of, fetch_in
from bettercompute_store_pg._db import defer_in
from tests._timing import deadline

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@pytest.fixture
async def store(pg_store: PgStore) -> AsyncIterator[PgStore]:
    async with pg_store.connection() as conn:
        await conn.execute(f'CREATE TABLE "{pg_store.schema}".marks (id integer PRIMARY KEY)')
    yield pg_store


def audit(n: int) -> AuditRecord:
    return AuditRecord(
        action="test:marks:make",
        actor="tester",
        tenant=None,
        resource_type="mark",
        resource_id=f"mark-{n}",
        decision_id=None,
        outcome="ok",
        details={},
    )


async def audited(store: PgStore) -> list[str]:
    rows = await store.fetch(
        store.sql("SELECT resource_id FROM {s}.audit WHERE action = 'test:marks:make' ORDER BY id"), {}
    )
    return [row.resource_id for row in rows]


async def marks(store: PgStore) -> list[int]:
    return [row.id for row in await store.fetch(store.sql("SELECT id FROM {s}.marks ORDER BY id"), {})]


def trips(store: PgStore) -> int:
    return store.pool_usage.round_trips


async def test_a_transaction_that_sends_nothing_costs_no_round_trip(store: PgStore) -> None:
    before = trips(store)
    async with store.transaction():
        pass
    assert trips(store) == before


async def test_writes_no_one_reads_travel_with_the_commit(store: PgStore) -> None:
    before = trips(store)
    async with store.transaction() as tx:
        await tx.audit(audit(1))
        await tx.project(ResourceRef(type="mark", id="mark-1", tenant="t_root"))
        await tx.publish([OutboxEvent(type="mark.made", key="mark-1")])
        await tx.enqueue([WorkItem(kind="marks", key="mark-1")])
        await tx.audit(audit(2))
    # BEGIN, five writes and COMMIT: one round trip.
    assert trips(store) - before == 1
    assert await audited(store) == ["mark-1", "mark-2"]
    events = await store.fetch(store.sql("SELECT type FROM {s}.outbox WHERE key = 'mark-1'"), {})
    assert [row.type for row in events] == ["mark.made"]


async def test_held_back_writes_go_with_the_next_statement_in_their_order(store: PgStore) -> None:
    before = trips(store)
    async with store.transaction() as tx:
        conn = connection_of(tx)
        await tx.audit(audit(1))
        # The next statement sees the write held back before it: they went together, in order.
        seen = await fetch_in(
            conn, store.sql("SELECT count(*) AS n FROM {s}.audit WHERE action = 'test:marks:make'"), {}
        )
        assert seen[0].n == 1
        await tx.audit(audit(2))
    assert trips(store) - before == 2
    assert await audited(store) == ["mark-1", "mark-2"]


async def test_a_held_back_write_that_fails_rolls_the_whole_transaction_back(store: PgStore) -> None:
    insert = store.sql("INSERT INTO {s}.marks VALUES (:id)")
    with pytest.raises(ConflictError):
        async with store.transaction() as tx:
            conn = connection_of(tx)
            await tx.audit(audit(1))
            defer_in(conn, insert, {"id": 1})
            defer_in(conn, insert, {"id": 1})  # a duplicate key: fails when sent
            await fetch_in(conn, insert, {"id": 2})  # sent with them; the error surfaces here
    assert await marks(store) == []
    assert await audited(store) == []
    # The connection went back clean and works.
    async with store.transaction() as tx:
        await fetch_in(connection_of(tx), insert, {"id": 3})
    assert await marks(store) == [3]
    assert store.pool_usage.in_use == 0


async def test_a_failure_before_anything_was_sent_sends_nothing(store: PgStore) -> None:
    before = trips(store)
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await tx.audit(audit(1))
            raise RuntimeError("the caller failed")
    assert trips(store) == before
    assert await audited(store) == []


async def test_a_cursor_of_ones_own_is_refused_while_statements_are_held_back(store: PgStore) -> None:
    """Its statement would run before BEGIN, outside the transaction; ``execute`` sends what is held back first."""
    async with store.transaction() as tx:
        conn = connection_of(tx)
        with pytest.raises(InternalError):
            conn.cursor()
        await conn.execute(f'INSERT INTO "{store.schema}".marks VALUES (1)')
        async with conn.cursor() as cur:
            await cur.execute("SELECT 1")
    assert await marks(store) == [1]


async def test_a_write_is_held_back_only_inside_a_transaction(store: PgStore) -> None:
    async with store.connection() as conn:
        with pytest.raises(InternalError):
            defer_in(conn, store.sql("INSERT INTO {s}.marks VALUES (1)"), {})
    assert await marks(store) == []


async def test_a_waiter_that_gives_up_does_not_take_a_slot_with_it(database_url: str, fresh_schema: str) -> None:
    store = PgStore(database_url, schema=fresh_schema, pool_size=1)
    await store.open()
    try:
        async with store.connection():
            for _ in range(3):
                with anyio.move_on_after(0.1) as scope:
                    await store.now()
                assert scope.cancelled_caught
        # Every waiter left; the one slot is free again at once.
        with anyio.fail_after(deadline(2)):
            await store.now()
        assert store.pool_usage.in_use == 0
    finally:
        await store.close()


async def test_waiters_are_served_in_arrival_order(database_url: str, fresh_schema: str) -> None:
    store = PgStore(database_url, schema=fresh_schema, pool_size=1)
    await store.open()
    served: list[int] = []

    async def waiter(n: int) -> None:
        async with store.connection():
            served.append(n)

    try:
        async with anyio.create_task_group() as tg, store.connection():
            for n in range(5):
                tg.start_soon(waiter, n)
                await anyio.sleep(0.01)  # each is queued before the next arrives
        assert served == [0, 1, 2, 3, 4]
    finally:
        await store.close()


async def test_a_closed_store_is_unavailable(database_url: str, fresh_schema: str) -> None:
    store = PgStore(database_url, schema=fresh_schema, pool_size=1)
    await store.open()
    pool = store._db.require()
    await store.close()
    with pytest.raises(UnavailableError):
        await pool.get()
