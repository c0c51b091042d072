"""Three worker OS processes on one schema: shard ownership, takeover after kill -9, no overlapping passes, fencing."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest

from bettercompute._runtime.shards import SHARDS
from bettercompute.errors import FailedPreconditionError
from bettercompute.ports import Lease
from bettercompute_store_pg import PgStore
from tests._timing import deadline

from ._probe import KIND, RECONCILER

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.e2e]

SCRIPT = Path(__file__).with_name("_probe.py")
TTL = 2.0


def _start(url: str, schema: str, instance: str) -> subprocess.Popen[str]:
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), url, schema, instance, str(TTL)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if not os.environ.get("BC_WORKER_LOGS") else None,
        text=True,
        env=env,
    )


@pytest.fixture
def workers(database_url: str, fresh_schema: str) -> Iterator[dict[str, subprocess.Popen[str]]]:
    processes = {name: _start(database_url, fresh_schema, name) for name in ("w1", "w2", "w3")}
    try:
        for process in processes.values():
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
        yield processes
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
            process.wait(timeout=deadline(30))
            if process.stdout is not None:
                process.stdout.close()


def _owners(url: str, schema: str) -> dict[int, tuple[str, str]]:
    """Shard -> (holder, instance) for every unexpired controllers shard lease held by a live member."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"""SELECT l.name, l.holder, w.instance FROM "{schema}".leases l
            JOIN "{schema}".workers w ON w.id = l.holder AND w.role = 'controllers' AND w.expires_at > now()
            WHERE l.name LIKE 'controllers/shard:%' AND l.expires_at > now()"""
        ).fetchall()
    return {int(name.split(":")[1]): (holder, instance) for name, holder, instance in rows}


async def _wait_for(predicate: Callable[[], bool], within: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < deadline(within):
        if predicate():
            return time.monotonic() - started
        await anyio.sleep(0.2)
    raise AssertionError(f"timed out after {within} s waiting for {what}")


def _leases_of(url: str, schema: str, instance: str) -> list[tuple[str, str, int, dt.datetime]]:
    """(name, holder, token, expires_at) of every lease the worker ``instance`` holds."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"""SELECT l.name, l.holder, l.token, l.expires_at FROM "{schema}".leases l
            JOIN "{schema}".workers w ON w.id = l.holder WHERE w.instance = %s""",
            (instance,),
        ).fetchall()
    return [(name, holder, token, expires_at) for name, holder, token, expires_at in rows]


async def _stale_lease_is_refused(store: PgStore, victim_lease: tuple[str, str, int, dt.datetime]) -> None:
    """A write fenced by the dead worker's (now stale) shard lease is refused, and so is completing a claim with it."""
    name, holder, token, expires_at = victim_lease
    stale = Lease(name=name, holder=holder, token=token, expires_at=expires_at)
    with pytest.raises(FailedPreconditionError):
        async with store.transaction(fence=stale):
            pass
    await store.queue.enqueue([RECONCILER.item("fenced")])
    shard = RECONCILER.item("fenced").shard
    claims = await store.queue.claim(
        holder="stale", kinds=[KIND], limit=1, claim_for=dt.timedelta(seconds=30), shards=[shard]
    )
    if claims:  # unless a live worker got there first
        stale_for_shard = Lease(name=f"controllers/shard:{shard}", holder=holder, token=token, expires_at=expires_at)
        assert not await store.queue.complete(claims[0], fence=stale_for_shard)


def _assert_no_pass_overlapped(url: str, schema: str, keys: list[str]) -> None:
    """Every key ran, and no two passes on one key overlapped."""
    with psycopg.connect(url) as conn:
        runs = conn.execute(f'SELECT key, started, ended FROM "{schema}".probe_runs ORDER BY key, started').fetchall()
    assert {key for key, _, _ in runs} >= set(keys)
    for (key_a, _, end_a), (key_b, start_b, _) in itertools.pairwise(runs):
        if key_a == key_b:
            assert start_b >= end_a, f"two passes on {key_a} overlapped"


async def _kill_and_take_over(
    workers: dict[str, subprocess.Popen[str]], url: str, schema: str, enqueue: Callable[[], Awaitable[None]]
) -> list[tuple[str, str, int, dt.datetime]]:
    """Kill w2 with work queued; the two others own every shard again within a few TTLs. Returns w2's leases."""
    victim_leases = _leases_of(url, schema, "w2")
    assert victim_leases
    workers["w2"].send_signal(signal.SIGKILL)
    workers["w2"].wait(timeout=deadline(10))
    await enqueue()
    took = await _wait_for(
        lambda: len(_owners(url, schema)) == SHARDS and {i for _, i in _owners(url, schema).values()} == {"w1", "w3"},
        30,
        "the killed worker's shards owned again",
    )
    # One TTL for its row and leases to expire, plus a shard cycle (a third of it) and a loaded machine's slack.
    assert took < deadline(6 * TTL), took
    return victim_leases


async def test_three_workers_share_every_shard_take_over_and_never_overlap(
    workers: dict[str, subprocess.Popen[str]], database_url: str, fresh_schema: str
) -> None:
    url, schema = database_url, fresh_schema
    seen: list[dict[int, tuple[str, str]]] = []

    def all_owned() -> bool:
        # One reading, kept: asking again could catch a lease a loaded worker is a moment late renewing.
        seen[:] = [_owners(url, schema)]
        return len(seen[0]) == SHARDS and {i for _, i in seen[0].values()} == set(workers)

    await _wait_for(all_owned, 30, "all 256 shards owned, by all three workers")
    owners = seen[0]
    assert sorted(owners) == list(range(SHARDS))  # exactly one live holder per shard (one lease row per name)

    store = PgStore(url, schema=schema, pool_size=2)
    await store.open()
    keys = [f"node/{i}" for i in range(40)]

    async def enqueue() -> None:
        await store.queue.enqueue([RECONCILER.item(key) for key in keys])

    for _ in range(3):  # the same keys again and again: passes on one key must still never overlap
        await enqueue()
        await anyio.sleep(0.3)

    victim_leases = await _kill_and_take_over(workers, url, schema, enqueue)
    await enqueue()
    try:
        with anyio.fail_after(deadline(40)):  # every item done by the two survivors
            while await store.queue.pending([KIND]):  # noqa: ASYNC110 - polling the database, no event to wait on
                await anyio.sleep(0.3)
        await _stale_lease_is_refused(store, victim_leases[0])
    finally:
        await store.close()

    _assert_no_pass_overlapped(url, schema, keys)

    for name in ("w1", "w3"):
        workers[name].send_signal(signal.SIGTERM)
    for name in ("w1", "w3"):
        assert workers[name].wait(timeout=deadline(30)) == 0
    # Stopping hands every shard lease back and leaves the membership at once.
    assert _owners(url, schema) == {}
