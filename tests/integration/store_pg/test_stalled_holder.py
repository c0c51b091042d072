"""A lease holder stalled inside its fenced transaction (SIGSTOP, a long pause, a partition) behind PgBouncer with
``idle_transaction_timeout``, as docs/operations.md asks: PgBouncer cuts the stalled transaction, so its
writes never land, and the lease moves on to a successor; while it is open, the successor is turned away at once
rather than made to wait (the wait used to stall every other worker's shard cycle behind the stalled one)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from bettercompute.errors import ComputeError
from bettercompute.ports import WorkItem
from bettercompute_store_pg import PgStore
from tests._timing import deadline

from .._pgbouncer import running_pgbouncer

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

TTL = dt.timedelta(seconds=1)
IDLE_TIMEOUT = 2  # seconds PgBouncer lets a client sit idle inside a transaction


@pytest.fixture(scope="module")
def cutting_pgbouncer(database_url: str) -> Iterator[str]:
    with running_pgbouncer(database_url, pool_size=4, settings={"idle_transaction_timeout": str(IDLE_TIMEOUT)}) as url:
        yield url


@pytest.fixture
async def store(cutting_pgbouncer: str, fresh_schema: str) -> AsyncIterator[PgStore]:
    store = PgStore(cutting_pgbouncer, schema=fresh_schema, pool_size=4, prepared_statements=False)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def test_a_stalled_holder_is_cut_off_its_writes_never_land_and_the_lease_moves_on(store: PgStore) -> None:
    lease = await store.leases.acquire("shard:7", "stalled", TTL)
    assert lease is not None
    with pytest.raises(ComputeError):
        async with store.transaction(fence=lease) as tx:
            await tx.enqueue([WorkItem(kind="stale", key="written-by-a-stalled-holder")])
            await anyio.sleep(TTL.total_seconds() + 0.2)
            # Its lease has run out, but its open transaction keeps the row: the successor is turned away, at once.
            with anyio.fail_after(deadline(1)):
                assert await store.leases.acquire("shard:7", "successor", TTL) is None
            await anyio.sleep(IDLE_TIMEOUT + 1)  # stalled past PgBouncer's limit: the transaction is cut
    assert await store.queue.pending() == 0  # the stale write did not land
    taken = await store.leases.acquire("shard:7", "successor", TTL)
    assert taken is not None
    assert (taken.holder, taken.token > lease.token) == ("successor", True)
