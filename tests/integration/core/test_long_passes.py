"""A pass longer than its lease's TTL keeps its lease and its progress; a pass cut short keeps what it did."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import AsyncIterator

import anyio
import pytest

from bettercompute import BetterCompute, Options, better_compute
from bettercompute.ports import OutboxEvent, StoredEvent
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests._timing import deadline

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@pytest.fixture
async def compute(database_url: str, fresh_schema: str) -> AsyncIterator[BetterCompute]:
    store = PgStore(database_url, schema=fresh_schema, pool_size=4)
    plane = better_compute(Options(store=store, iam=EmbeddedIam(), lease_ttl=dt.timedelta(seconds=2)))
    await plane.initialize()
    try:
        yield plane
    finally:
        await plane.close()


async def _publish(compute: BetterCompute, count: int) -> None:
    async with compute.context.store.transaction() as tx:
        await tx.publish([OutboxEvent(type="tick", key=f"k{i}", payload={"i": i}) for i in range(count)])


async def test_a_pass_longer_than_the_lease_ttl_delivers_each_event_once(compute: BetterCompute) -> None:
    # 40 events at 0.1 s each take twice the 2 s lease TTL in one pass.
    seen: Counter[int] = Counter()
    done = anyio.Event()

    async def slow(event: StoredEvent) -> None:
        await anyio.sleep(0.1)
        seen[int(str(event.payload["i"]))] += 1
        if len(seen) == 40:
            done.set()

    compute.events.subscribe(slow)
    await _publish(compute, 40)
    await compute.start({"sinks"})
    try:
        with anyio.fail_after(deadline(60)):
            await done.wait()
        await anyio.sleep(1)  # room for a duplicate to show up, if any
    finally:
        await compute.stop()
    assert set(seen) == set(range(40))
    assert max(seen.values()) == 1


async def test_a_pass_stopped_midway_keeps_what_it_delivered(compute: BetterCompute) -> None:
    seen: Counter[int] = Counter()
    some, all_of_them = anyio.Event(), anyio.Event()

    async def slow(event: StoredEvent) -> None:
        await anyio.sleep(0.05)
        seen[int(str(event.payload["i"]))] += 1
        if len(seen) >= 10:
            some.set()
        if len(seen) == 60:
            all_of_them.set()

    compute.events.subscribe(slow)
    await _publish(compute, 60)
    await compute.start({"sinks"})
    with anyio.fail_after(deadline(30)):
        await some.wait()
    await compute.stop()  # in the middle of the pass
    # A second run finishes the rest at once (nothing waits for a claim to expire), and repeats nothing it acked.
    await compute.start({"sinks"})
    try:
        with anyio.fail_after(deadline(20)):
            await all_of_them.wait()
    finally:
        await compute.stop()
    assert max(seen.values()) == 1
