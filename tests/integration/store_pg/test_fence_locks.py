"""While a fenced transaction is open, its holder may renew the lease, but nobody may take it over."""

from __future__ import annotations

import datetime as dt

import anyio
import pytest

from bettercompute_store_pg import PgStore

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

TTL = dt.timedelta(seconds=1)


async def test_an_open_fenced_transaction_lets_renewals_through_and_holds_takeovers(pg_store: PgStore) -> None:
    lease = await pg_store.leases.acquire("shard:1", "a", TTL)
    assert lease is not None
    took_over: list[str] = []
    in_tx = anyio.Event()

    async def takeover() -> None:
        await in_tx.wait()
        await anyio.sleep(1.5)  # a's lease has expired by now (it is not renewed), so b would win it
        taken = await pg_store.leases.acquire("shard:1", "b", TTL)
        took_over.append("b" if taken is not None else "nobody")

    async with anyio.create_task_group() as tg:
        tg.start_soon(takeover)
        async with pg_store.transaction(fence=lease):
            in_tx.set()
            # The holder renews while its own fenced transaction is open: not blocked.
            with anyio.fail_after(2):
                renewed = await pg_store.leases.renew_many([lease], TTL)
            assert [r.token for r in renewed] == [lease.token]
            await anyio.sleep(3)  # long enough for the takeover to be waiting on the row
            assert took_over == []  # the takeover waits for this transaction to end
    assert took_over == ["b"]
