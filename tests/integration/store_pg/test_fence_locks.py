"""While a fenced transaction is open, its holder may renew the lease, and nobody may take it over; a taker is not
held up either: it gets nothing at once and tries again later. (A holder stalled inside its fenced transaction is cut
off by PgBouncer's ``idle_transaction_timeout``: ``test_pgbouncer``.)"""

from __future__ import annotations

import datetime as dt

import anyio
import pytest

from bettercompute_store_pg import PgStore

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

TTL = dt.timedelta(seconds=1)


async def test_an_open_fenced_transaction_lets_renewals_through_and_turns_takeovers_away(pg_store: PgStore) -> None:
    lease = await pg_store.leases.acquire("shard:1", "a", TTL)
    assert lease is not None
    async with pg_store.transaction(fence=lease):
        # The holder renews while its own fenced transaction is open: not blocked.
        with anyio.fail_after(2):
            renewed = await pg_store.leases.renew_many([lease], TTL)
        assert [r.token for r in renewed] == [lease.token]
        await anyio.sleep(1.2)  # the lease has run out (not renewed again), so without the fence b would win it
        # The takeover neither waits for this transaction nor wins: both forms come back at once, empty-handed.
        with anyio.fail_after(1):
            assert await pg_store.leases.acquire("shard:1", "b", TTL) is None
            assert await pg_store.leases.acquire_many(["shard:1", "shard:2"], "b", TTL) == [
                await pg_store.leases.get("shard:2")
            ]
    taken = await pg_store.leases.acquire("shard:1", "b", TTL)
    assert taken is not None
    assert taken.holder == "b"
    assert taken.token > lease.token
