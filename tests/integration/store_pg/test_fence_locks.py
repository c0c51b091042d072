"""While a fenced transaction is open, its holder may renew the lease, and nobody may take it over; a taker is not
held up either: it gets nothing at once and tries again later. (A holder stalled inside its fenced transaction is cut
off by PgBouncer's ``idle_transaction_timeout``: ``test_pgbouncer``.)"""

from __future__ import annotations

import datetime as dt

import anyio
import pytest

from bettercompute.errors import UnavailableError
from bettercompute_store_pg import PgStore
from bettercompute_store_pg._leases import FENCED_LOCK_TIMEOUT
from tests._timing import deadline

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

TTL = dt.timedelta(seconds=1)


async def test_an_open_fenced_transaction_lets_renewals_through_and_turns_takeovers_away(pg_store: PgStore) -> None:
    lease = await pg_store.leases.acquire("shard:1", "a", TTL)
    assert lease is not None
    async with pg_store.transaction(fence=lease):
        # The holder renews while its own fenced transaction is open: not blocked.
        with anyio.fail_after(deadline(2)):
            renewed = await pg_store.leases.renew_many([lease], TTL)
        assert [r.token for r in renewed] == [lease.token]
        await anyio.sleep(1.2)  # the lease has run out (not renewed again), so without the fence b would win it
        # The takeover neither waits for this transaction nor wins: both forms come back at once, empty-handed.
        with anyio.fail_after(deadline(1)):
            assert await pg_store.leases.acquire("shard:1", "b", TTL) is None
            assert await pg_store.leases.acquire_many(["shard:1", "shard:2"], "b", TTL) == [
                await pg_store.leases.get("shard:2")
            ]
    taken = await pg_store.leases.acquire("shard:1", "b", TTL)
    assert taken is not None
    assert taken.holder == "b"
    assert taken.token > lease.token


async def test_a_fenced_transaction_waits_for_a_row_lock_only_so_long(pg_store: PgStore) -> None:
    # A pass fenced by its shard lease that meets a row another transaction keeps locked (a stalled holder's) fails
    # and is retried, instead of queueing behind it for as long as the stall lasts.
    lease = await pg_store.leases.acquire("shard:3", "a", dt.timedelta(seconds=30))
    blocker = await pg_store.leases.acquire("other", "b", dt.timedelta(seconds=30))
    assert lease is not None and blocker is not None
    table = f'"{pg_store.schema}".leases'
    async with pg_store.transaction() as stalled:
        await stalled.connection.execute(f"SELECT 1 FROM {table} WHERE name = 'other' FOR UPDATE")
        with anyio.fail_after(FENCED_LOCK_TIMEOUT.total_seconds() + 3), pytest.raises(UnavailableError):
            async with pg_store.transaction(fence=lease) as tx:
                await tx.connection.execute(f"SELECT 1 FROM {table} WHERE name = 'other' FOR UPDATE")
