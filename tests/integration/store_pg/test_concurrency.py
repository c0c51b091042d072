"""``PgStore`` under real concurrency: several pools, several OS processes."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from collections import Counter, defaultdict

import anyio
import psycopg
import pytest

from bettercompute.errors import FailedPreconditionError, UnavailableError
from bettercompute.ports import Lease, OutboxEvent, WorkItem
from bettercompute_store_pg import PgStore
from tests._timing import deadline

pytestmark = pytest.mark.anyio

LONG = dt.timedelta(minutes=5)

_MIGRATE_SCRIPT = """
import asyncio, json, sys, time
from bettercompute.ports import Migration
from bettercompute_store_pg import PgStore

url, schema, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
steps = [
    Migration(version=1, name="slow table", sql="SELECT pg_sleep(0.3); CREATE TABLE {schema}.probe (id integer)"),
    Migration(version=2, name="row", sql="INSERT INTO {schema}.probe VALUES (1)"),
]

async def main():
    store = PgStore(url, schema=schema, pool_size=1)
    await store.open()
    try:
        time.sleep(max(0.0, start_at - time.time()))
        runtime = await store.install()
        probe = await store.migrate("probe", steps)
        print(json.dumps({"runtime": runtime, "probe": probe}))
    finally:
        await store.close()

asyncio.run(main())
"""


def _migrate_in_two_processes(database_url: str, schema: str) -> list[dict[str, list[int]]]:
    start_at = time.time() + 2.0  # both interpreters are up and connected by then
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _MIGRATE_SCRIPT, database_url, schema, str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=deadline(60))
        assert process.returncode == 0, err
        results.append(json.loads(out))
    return results


def _recorded(database_url: str, schema: str) -> list[tuple[str, int]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(f'SELECT module, version FROM "{schema}".schema_migrations ORDER BY module, version')
        return [(module, version) for module, version in rows]


def test_two_processes_migrate_one_fresh_schema(database_url: str, empty_schema: str) -> None:
    results = _migrate_in_two_processes(database_url, empty_schema)
    runtime = [m.version for m in PgStore.runtime_migrations()]
    assert sorted(r["runtime"] for r in results) == [[], runtime]
    assert sorted(r["probe"] for r in results) == [[], [1, 2]]
    with psycopg.connect(database_url) as conn:
        probe_rows = conn.execute(f'SELECT count(*) FROM "{empty_schema}".probe').fetchone()
    assert _recorded(database_url, empty_schema) == [("probe", 1), ("probe", 2), *(("runtime", v) for v in runtime)]
    assert probe_rows == (1,)


async def test_one_of_many_concurrent_acquirers_gets_the_lease(pg_store: PgStore) -> None:
    won: list[Lease] = []

    async def acquire(holder: str, ttl: dt.timedelta) -> None:
        lease = await pg_store.leases.acquire("singleton", holder, ttl)
        if lease is not None:
            won.append(lease)

    async with anyio.create_task_group() as tg:
        for n in range(20):
            tg.start_soon(acquire, f"first-{n}", dt.timedelta(milliseconds=400))
    assert len(won) == 1
    [old] = won
    won.clear()
    await anyio.sleep(0.7)
    async with anyio.create_task_group() as tg:
        for n in range(20):
            tg.start_soon(acquire, f"second-{n}", LONG)
    assert len(won) == 1
    [new] = won
    assert new.token > old.token
    with pytest.raises(FailedPreconditionError):
        async with pg_store.transaction(fence=old) as tx:
            await tx.enqueue([WorkItem(kind="k", key="fenced")])
    async with pg_store.transaction(fence=new) as tx:
        await tx.enqueue([WorkItem(kind="k", key="fenced")])
    assert await pg_store.queue.pending() == 1


async def test_four_claimers_drain_the_queue_each_item_once(database_url: str, pg_store: PgStore) -> None:
    await pg_store.queue.enqueue([WorkItem(kind="k", key=f"item-{n}", shard=n % 7) for n in range(400)])
    seen: list[str] = []
    ids: list[int] = []

    async def claimer(name: str) -> None:
        async with PgStore(database_url, schema=pg_store.schema, pool_size=2) as store:
            while claims := await store.queue.claim(holder=name, kinds=["k"], limit=7, claim_for=LONG):
                for claim in claims:
                    seen.append(claim.key)
                    ids.append(claim.id)
                    assert await store.queue.complete(claim)

    async with anyio.create_task_group() as tg:
        for n in range(4):
            tg.start_soon(claimer, f"claimer-{n}")
    assert len(seen) == 400
    assert Counter(seen) == Counter(f"item-{n}" for n in range(400))
    assert len(set(ids)) == 400
    assert await pg_store.queue.pending() == 0


async def test_outbox_keeps_per_key_order_under_concurrent_writers_and_claimers(
    database_url: str, pg_store: PgStore
) -> None:
    keys = [f"key-{k}" for k in range(5)]
    writers, rounds = 4, 10
    delivered: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    writing_done = anyio.Event()

    async def writer(w: int) -> None:
        async with PgStore(database_url, schema=pg_store.schema, pool_size=2) as store:
            for r in range(rounds):
                # Several keys per transaction, listed in a different order by each writer.
                mine = keys[w % len(keys) :] + keys[: w % len(keys)]
                async with store.transaction() as tx:
                    await tx.publish(
                        [OutboxEvent(type="t", key=key, payload={"writer": w, "round": r}) for key in mine]
                    )

    async def sink(name: str) -> None:
        async with PgStore(database_url, schema=pg_store.schema, pool_size=2) as store:
            while True:
                events = await store.outbox.claim(holder=name, limit=3, claim_for=LONG)
                if not events:
                    if writing_done.is_set():
                        return
                    await anyio.sleep(0.01)
                    continue
                for event in events:
                    # Recorded before the ack: the next event of this key cannot be claimed until the ack.
                    delivered[event.key].append((event.seq, event.payload["writer"], event.payload["round"]))
                assert await store.outbox.ack(events) == len(events)

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(sink, f"sink-{n}")
        async with anyio.create_task_group() as writing:
            for w in range(writers):
                writing.start_soon(writer, w)
        writing_done.set()
    for key in keys:
        seqs = [seq for seq, _, _ in delivered[key]]
        assert seqs == list(range(1, writers * rounds + 1)), key
        for w in range(writers):
            assert [r for _, writer_id, r in delivered[key] if writer_id == w] == list(range(rounds))


async def test_a_deadlock_is_reported_as_retryable(database_url: str, pg_store: PgStore) -> None:
    holding = {"a": anyio.Event(), "b": anyio.Event()}
    failures: list[UnavailableError] = []

    async def writer(first: str, then: str, store: PgStore) -> None:
        try:
            async with store.transaction() as tx:
                await tx.publish([OutboxEvent(type="t", key=first)])
                # A publish is sent with the transaction's next statement: this read sends it, locking the key now.
                await tx.tenant_exists("nobody")
                holding[first].set()
                await holding[then].wait()  # each now waits for the key the other holds
                await tx.publish([OutboxEvent(type="t", key=then)])
        except UnavailableError as exc:
            failures.append(exc)

    async with PgStore(database_url, schema=pg_store.schema, pool_size=1) as other, anyio.create_task_group() as tg:
        tg.start_soon(writer, "a", "b", pg_store)
        tg.start_soon(writer, "b", "a", other)
    assert len(failures) == 1
    assert failures[0].retryable
    assert "deadlock" not in str(failures[0])
