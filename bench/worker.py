"""The worker runtime: reconcile throughput next to pgbench on the same SQL, and event -> webhook latency.

(1) Reconcile throughput. A no-op ``Reconciler`` is run by real worker processes (``compute.start({"controllers"})``
    in a child process each, as ``serve --roles controllers`` would, 1, 2 and then 3 of them) draining a queue filled
    beforehand. Items/s is counted from the rows the measured window removed, after a warm-up and, with several
    processes, after the 256 shards are split between them. pgbench then runs the statements those workers run
    (``claim_sql`` with the shard filter, batches of ``CONCURRENCY``; fenced ``complete_sql`` for each item, against
    a shard lease held for the run), with bound parameters, prepared, one client per worker process, each on its own
    share of the shards and holding their leases under its own name (as the workers do: the claim's plan depends on
    it), on a queue filled the same way. Two differences remain, both in the worker's favour or neutral: a worker
    runs a batch's completes concurrently (up to ``CONCURRENCY`` connections) where a pgbench client runs them one
    after the other; and pgbench cannot bind a NULL, so ``:now`` and ``:again_after`` are bound as ``'null'``
    through ``NULLIF(..., 'null')`` (the worker binds NULL).

(2) Event -> webhook latency. A loopback HTTP receiver (asyncio) is subscribed with ``webhooks.create``
    (``LocalKeyKms`` on a temporary key, ``allow_private_destinations``), ``compute.start({"sinks"})`` runs the
    outbox dispatcher and the sender, and ``EVENTS`` events are published one by one, each in its own transaction
    (``tx.publish``, payload ``tenant``), each on its own key. The latency is from the commit returning to the
    receiver reading the request, checked with ``bettercompute.modules.webhooks.verify``. It is measured twice, on a
    fresh schema each time: with the jobs polling every ``Options.poll_interval`` (the default, 1 s) and no notifier,
    then with a ``PgNotifier`` whose pokes wake them after each commit.

    python bench/worker.py            # BETTERCOMPUTE_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/test
    python bench/worker.py --json     # the same figures as one JSON object on stdout (bench/run.py reads it)

Takes about a minute. Uses (and drops) the schema ``bc_bench_worker``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import psycopg

from bettercompute import Events, LocalKeyKms, Options, Outcome, ReconcileContext, Reconciler, better_compute
from bettercompute._runtime.workers import CONCURRENCY
from bettercompute.modules.webhooks import (
    CreateWebhookInput,
    WebhookSettings,
    WebhooksGroup,
    WebhookVerificationError,
    verify,
)
from bettercompute.ports import Migration
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgNotifier, PgStore
from bettercompute_store_pg._queue import claim_sql, complete_sql

URL = os.environ.get("BETTERCOMPUTE_DATABASE_URL", "").strip() or "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = "bc_bench_worker"
KIND = "bench.noop"
PROCESSES = (1, 2, 3)
ITEMS = 40_000  # more than either side drains in its warm-up and window, so the queue never runs dry
WARMUP_SECONDS = 2
SECONDS = 3  # the measured window of each side (pgbench takes whole seconds)
LEASE_TTL = dt.timedelta(seconds=3)  # shard cycles every second, so a second process gets its half quickly
POLL = dt.timedelta(milliseconds=50)
EVENTS = 100
EVENT_SPACING = 0.03  # seconds between two publishes
PGBENCH_HOLDER = "pgbench"


async def noop(ctx: ReconcileContext, key: str) -> Outcome:
    """Nothing to do: what is measured is the claim, the dispatch and the fenced complete."""
    return Outcome.done()


NOOP = Reconciler(kind=KIND, reconcile=noop)


@attrs.frozen(kw_only=True)
class NoopModule:
    """One reconciler, nothing else."""

    name: str = "bench_noop"
    version: str = "0.1.0"
    core_range: str = ">=0.1"
    groups: Sequence[Any] = ()
    actions: Sequence[str] = ()
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(factory=dict)
    jobs: Sequence[Any] = ()
    reconcilers: Sequence[Reconciler] = (NOOP,)

    async def start(self, context: Any) -> None:
        return None

    async def stop(self) -> None:
        return None


def drop_schema() -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


def remaining() -> int:
    with psycopg.connect(URL, autocommit=True) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{SCHEMA}".work_queue').fetchone()
        assert row is not None
        return int(row[0])


async def fill() -> None:
    """An empty queue, then ``ITEMS`` items of ``KIND`` spread over the shards by the reconciler's own hash."""
    async with PgStore(URL, schema=SCHEMA, pool_size=1) as store:
        async with store.connection() as conn:
            await conn.execute(f'TRUNCATE "{SCHEMA}".work_queue')
        batch = 10_000
        for start in range(0, ITEMS, batch):
            await store.queue.enqueue([NOOP.item(f"item-{n}") for n in range(start, min(ITEMS, start + batch))])
    with psycopg.connect(URL, autocommit=True) as conn:  # VACUUM cannot run in a transaction
        conn.execute(f'VACUUM ANALYZE "{SCHEMA}".work_queue')


# --- (1) reconcile throughput -------------------------------------------------------------------------------------


async def child(name: str) -> None:
    """One worker process: the controllers role until SIGTERM, then stop (leases handed back)."""
    store = PgStore(URL, schema=SCHEMA)
    options = Options(
        store=store,
        iam=EmbeddedIam(),
        modules=[NoopModule()],
        instance=name,
        notifier=PgNotifier(URL, schema=SCHEMA),
        lease_ttl=LEASE_TTL,
        poll_interval=POLL,
    )
    compute = better_compute(options)
    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        await compute.initialize(migrate=False)
        await compute.start({"controllers"})
        print("ready", flush=True)
        async for _ in signals:
            break
    await compute.close()


def start_worker(name: str) -> subprocess.Popen[str]:
    logs = None if os.environ.get("BC_BENCH_LOGS") else subprocess.DEVNULL
    process = subprocess.Popen(
        [sys.executable, __file__, "--child", name], stdout=subprocess.PIPE, stderr=logs, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line != "ready":
        process.kill()
        raise SystemExit(f"worker {name} did not start (set BC_BENCH_LOGS=1 to see why)")
    return process


def shard_holders() -> dict[str, int]:
    """Holder -> live ``controllers/shard:<n>`` leases held."""
    with psycopg.connect(URL, autocommit=True) as conn:
        rows = conn.execute(
            f"""SELECT holder, count(*) FROM "{SCHEMA}".leases
            WHERE name LIKE 'controllers/shard:%%' AND expires_at > now() GROUP BY holder"""
        ).fetchall()
    return {str(holder): int(n) for holder, n in rows}


def measure_window() -> float:
    """Items/s removed from the queue during ``SECONDS``; refuses a window in which the queue ran dry."""
    before = remaining()
    started = time.monotonic()
    time.sleep(SECONDS)
    after = remaining()
    elapsed = time.monotonic() - started
    if after == 0:
        raise SystemExit("the queue ran dry during the window: raise ITEMS")
    return (before - after) / elapsed


def bench_workers(processes: int) -> tuple[float, dict[str, int]]:
    workers: list[subprocess.Popen[str]] = []
    try:
        for n in range(processes):
            workers.append(start_worker(f"bench-w{n + 1}"))
        deadline = time.monotonic() + 20
        while True:  # every shard held, and by every process
            holders = shard_holders()
            if len(holders) == processes and sum(holders.values()) == 256:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the shards were not split between the workers: {holders}")
            time.sleep(0.1)
        time.sleep(WARMUP_SECONDS)
        rate = measure_window()
        split = shard_holders()
    finally:
        for process in workers:
            process.send_signal(signal.SIGTERM)
        for process in workers:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
    return rate, split


def one_line(statement: str, renames: Mapping[str, str]) -> str:
    """``statement`` on one line, schema filled in, parameters renamed (``:id`` -> ``:id3``)."""
    statement = statement.replace("{s}", f'"{SCHEMA}"')
    for old, new in renames.items():
        statement = re.sub(re.escape(old) + r"\b", new, statement)
    return " ".join(statement.split())


# pgbench binds every variable as text and cannot bind a NULL: these are bound as 'null' and turned back into NULL.
NULLABLE = {
    "CAST(:now AS timestamptz)": "CAST(NULLIF(:now, 'null') AS timestamptz)",
    "CAST(:again_after AS interval)": "CAST(NULLIF(:again_after, 'null') AS interval)",
}


def nullable(statement: str) -> str:
    for old, new in NULLABLE.items():
        statement = statement.replace(old, new)
    return statement


def pgbench_script(processes: int) -> str:
    """Per client: the worker's claim on its own shards (``CONCURRENCY`` rows, handed out as columns to ``\\gset``),
    then the worker's fenced complete for each, under the lease of the item's shard. A claim that found fewer rows
    (the client's shards ran dry) hands out id 0 for the rest, whose completes then match nothing: pgbench cannot
    bind an empty value as a number."""
    claim = nullable(claim_sql(shards=True, fence=False, clock=True, owned=True))
    complete = nullable(complete_sql(fence=True, timed=True))
    order = "ORDER BY c.due_at, c.id"
    columns = ", ".join(
        f"coalesce((array_agg(c.id {order}))[{n}], 0) AS id{n}, "
        f"coalesce((array_agg(c.claim_token {order}))[{n}], '') AS token{n}, "
        f"'controllers/shard:' || coalesce((array_agg(c.shard {order}))[{n}], 0) AS lease{n}"
        for n in range(1, CONCURRENCY + 1)
    )
    lines = []
    for client in range(processes):
        lines.append(("\\if" if client == 0 else "\\elif") + f" :client_id = {client}")
        claim_line = one_line(claim, {":shards": f":shards{client}", ":holder": f":holder{client}"})
        lines.append(f"WITH c AS ({claim_line}) SELECT {columns} FROM c \\gset")
        for n in range(1, CONCURRENCY + 1):
            renames = {":id": f":id{n}", ":token": f":token{n}", ":lease_name": f":lease{n}"}
            lines.append(one_line(complete, {**renames, ":lease_holder": f":holder{client}"}) + ";")
    lines.append("\\endif")
    return "\n".join(lines) + "\n"


def pgbench(binary: str, script: Path, processes: int, seconds: int) -> None:
    variables = {
        "kinds": f"{{{KIND}}}",
        "limit": str(CONCURRENCY),
        "claim_for": str(NOOP.deadline + LEASE_TTL),
        "now": "null",
        "again_after": "null",
        "lease_token": "1",
        "owner_prefix": "controllers/shard:",
    }
    for client in range(processes):  # client n claims on the shards s with s % processes == n, as pgbench<n>
        variables[f"shards{client}"] = "{" + ",".join(str(s) for s in range(client, 256, processes)) + "}"
        variables[f"holder{client}"] = f"{PGBENCH_HOLDER}{client}"
    defines = [arg for name, value in variables.items() for arg in ("-D", f"{name}={value}")]
    command = [binary, "-n", "-M", "prepared", *defines, "-f", str(script), "-c", str(processes), "-j", "1"]
    result = subprocess.run([*command, "-T", str(seconds), URL], capture_output=True, text=True, check=False)
    if result.returncode != 0 or "tps = " not in result.stdout:
        raise SystemExit(f"pgbench failed:\n{result.stdout}\n{result.stderr}")


def bench_pgbench(processes: int) -> float | None:
    binary = shutil.which("pgbench")
    if binary is None:
        return None
    with psycopg.connect(URL, autocommit=True) as conn:  # the shard leases the fenced completes check
        conn.execute(
            f"""INSERT INTO "{SCHEMA}".leases (name, holder, token, expires_at)
            SELECT 'controllers/shard:' || n, %s || (n %% %s), 1, now() + interval '1 hour'
            FROM generate_series(0, 255) AS n
            ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, token = 1, expires_at = EXCLUDED.expires_at""",
            (PGBENCH_HOLDER, processes),
        )
    try:
        with tempfile.TemporaryDirectory() as folder:
            script = Path(folder) / "worker.sql"
            script.write_text(pgbench_script(processes))
            pgbench(binary, script, processes, WARMUP_SECONDS)
            before = remaining()
            started = time.monotonic()
            pgbench(binary, script, processes, SECONDS)
            elapsed = time.monotonic() - started  # includes pgbench's start and connections; the worker's does not
            after = remaining()
    finally:
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(f'DELETE FROM "{SCHEMA}".leases WHERE holder LIKE %s', (f"{PGBENCH_HOLDER}%",))
    if after == 0:
        raise SystemExit("the queue ran dry during pgbench's run: raise ITEMS")
    return (before - after) / elapsed


# --- (2) event -> webhook latency ---------------------------------------------------------------------------------


class Receiver:
    """A minimal HTTP/1.1 server on loopback: notes when each POST was read, answers 200 and closes."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict[str, str], bytes]] = []
        self.arrived = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/hook"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            headers = {}
            for line in head.decode("latin-1").split("\r\n")[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.received.append((time.perf_counter(), headers, body))
            self.arrived.set()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@attrs.frozen(kw_only=True)
class Latency:
    seconds: list[float]
    published: int
    bad_signatures: int


async def bench_webhooks(*, poked: bool) -> Latency:
    receiver = Receiver()
    url = await receiver.start()
    settings = WebhookSettings(allow_private_destinations=True)  # the receiver listens on loopback
    with tempfile.TemporaryDirectory() as folder:
        store = PgStore(URL, schema=SCHEMA)
        iam = EmbeddedIam()
        kms = LocalKeyKms(Path(folder) / "kms.key")
        notifier = PgNotifier(URL, schema=SCHEMA) if poked else None
        options = Options(store=store, iam=iam, instance="bench-sinks", kms=kms, webhooks=settings, notifier=notifier)
        compute = better_compute(options)
        await compute.initialize()
        committed: dict[int, float] = {}
        try:
            boot = await iam.bootstrap()
            assert boot.credential is not None
            tenant = boot.tenant_id
            group: WebhooksGroup[Any] = compute.api.group(WebhooksGroup)
            created = await group.create(boot.credential, CreateWebhookInput(tenant=tenant, url=url))
            await compute.start({"sinks"})
            for n in range(EVENTS):
                async with store.transaction() as tx:
                    await tx.publish([Events.event("bench.ping", f"node-{n}", tenant=tenant, n=n)])
                committed[n] = time.perf_counter()
                await asyncio.sleep(EVENT_SPACING)
            with anyio.move_on_after(30):
                while len({json.loads(body)["data"]["n"] for _, _, body in receiver.received}) < EVENTS:
                    receiver.arrived.clear()
                    await receiver.arrived.wait()
        finally:
            await compute.close()
            await receiver.stop()
            if notifier is not None:
                await notifier.close()
    first: dict[int, float] = {}
    bad = 0
    for at, headers, body in receiver.received:
        try:
            verify(created.secret, headers, body)
        except WebhookVerificationError:
            bad += 1
            continue
        n = json.loads(body)["data"]["n"]
        first.setdefault(n, at)  # at least once: a duplicate counts by its first arrival
    return Latency(
        seconds=[first[n] - committed[n] for n in sorted(first)],
        published=EVENTS,
        bad_signatures=bad,
    )


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


# --- main -----------------------------------------------------------------------------------------------------------


async def install() -> None:
    """Every migration of what the worker processes compose (the store's, IAM's), run once here."""
    compute = better_compute(Options(store=PgStore(URL, schema=SCHEMA, pool_size=2), iam=EmbeddedIam()))
    await compute.initialize()
    await compute.close()


@attrs.frozen(kw_only=True)
class Results:
    # processes -> (workers' items/s, holder -> shards held, pgbench's items/s or None without pgbench)
    throughput: dict[int, tuple[float, dict[str, int], float | None]]
    latencies: dict[bool, Latency]  # poked -> event -> webhook latencies


def measure() -> Results:
    results: dict[int, tuple[float, dict[str, int], float | None]] = {}
    latencies: dict[bool, Latency] = {}
    drop_schema()
    try:
        asyncio.run(install())
        for processes in PROCESSES:
            asyncio.run(fill())
            rate, split = bench_workers(processes)
            asyncio.run(fill())
            results[processes] = (rate, split, bench_pgbench(processes))
        for poked in (False, True):
            drop_schema()
            asyncio.run(install())
            latencies[poked] = asyncio.run(bench_webhooks(poked=poked))
    finally:
        drop_schema()
    return Results(throughput=results, latencies=latencies)


def figures(results: Results) -> dict[str, float | int | str | None]:
    """The results as flat named figures (``--json``); latencies in ms."""
    out: dict[str, float | int | str | None] = {"items_queued": ITEMS, "window_seconds": SECONDS}
    one = results.throughput.get(1)
    for processes, (rate, split, pg_rate) in results.throughput.items():
        prefix = f"workers{processes}"
        out[f"{prefix}_items_per_s"] = round(rate, 1)
        out[f"{prefix}_shards"] = "/".join(str(n) for n in sorted(split.values(), reverse=True))
        out[f"{prefix}_pgbench_items_per_s"] = None if pg_rate is None else round(pg_rate, 1)
        out[f"{prefix}_ratio_pgbench"] = None if pg_rate is None else round(rate / pg_rate, 3)
        out[f"{prefix}_ratio_one_worker"] = None if one is None else round(rate / one[0], 3)
    for poked, latency in results.latencies.items():
        prefix = "webhook_poked" if poked else "webhook_polled"
        values = latency.seconds
        out[f"{prefix}_received"] = len(values)
        out[f"{prefix}_published"] = latency.published
        out[f"{prefix}_bad_signatures"] = latency.bad_signatures
        out[f"{prefix}_p50_ms"] = round(1000 * statistics.median(values), 1) if values else None
        out[f"{prefix}_p99_ms"] = round(1000 * percentile(values, 0.99), 1) if values else None
        out[f"{prefix}_max_ms"] = round(1000 * max(values), 1) if values else None
    out["webhook_poll_interval_s"] = Options().poll_interval.total_seconds()
    return out


def report(results: Results) -> None:
    print(f"reconcile throughput, no-op reconciler, {ITEMS} items queued, {SECONDS:.0f} s window, items/s")
    for processes, (rate, split, pg_rate) in results.throughput.items():
        shares = "/".join(str(n) for n in sorted(split.values(), reverse=True))
        print(f"  {processes} worker process(es), shards {shares}:")
        print(f"    workers  {rate:8.0f}  claim {CONCURRENCY} + {CONCURRENCY} fenced completes, run concurrently")
        if pg_rate is None:
            print("    pgbench  not installed (postgresql-client); no comparison")
            continue
        print(f"    pgbench  {pg_rate:8.0f}  same SQL, bound parameters, prepared, {processes} client(s)")
        print(f"    ratio    {rate / pg_rate:8.2f}")
    poll = Options().poll_interval.total_seconds()
    print("event -> webhook latency, commit to receipt (sinks/events, then sinks/webhooks)")
    for poked, latency in results.latencies.items():
        values = latency.seconds
        how = "PgNotifier pokes after each commit" if poked else f"no notifier: polled every {poll:.0f} s"
        print(f"  {how}: {len(values)}/{latency.published} events received, {latency.bad_signatures} bad signatures")
        if values:
            print(
                f"    p50 {1000 * statistics.median(values):7.1f} ms   p99 {1000 * percentile(values, 0.99):7.1f} ms"
                f"   min {1000 * min(values):7.1f} ms   max {1000 * max(values):7.1f} ms"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    results = measure()
    if args.json:
        print(json.dumps(figures(results)))
    else:
        report(results)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        anyio.run(child, sys.argv[2])
    else:
        main()
