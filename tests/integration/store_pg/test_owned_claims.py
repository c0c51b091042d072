"""A claim limited to owned shards hands out nothing on a shard whose lease the claimer does not hold (any more)."""

from __future__ import annotations

import datetime as dt

import anyio
import pytest

from bettercompute.ports import WorkItem
from bettercompute_store_pg import PgStore

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

PREFIX = "controllers/shard:"
MINUTE = dt.timedelta(minutes=1)


async def _claim(store: PgStore, holder: str) -> list[str]:
    claims = await store.queue.claim(
        holder=holder, kinds=["k"], limit=10, claim_for=MINUTE, shards=[7], owner_prefix=PREFIX
    )
    return [c.key for c in claims]


async def test_only_the_shard_lease_holder_claims(pg_store: PgStore) -> None:
    await pg_store.queue.enqueue([WorkItem(kind="k", key="x", shard=7)])
    assert await _claim(pg_store, "a") == []  # nobody holds shard 7 yet
    lease = await pg_store.leases.acquire(f"{PREFIX}7", "a", dt.timedelta(seconds=1))
    assert lease is not None
    await anyio.sleep(1.2)  # a paused past its TTL ...
    assert await pg_store.leases.acquire(f"{PREFIX}7", "b", MINUTE) is not None  # ... and b took the shard
    assert await _claim(pg_store, "a") == []  # a, not yet aware, claims nothing there
    assert await _claim(pg_store, "b") == ["x"]
