"""Work-queue claims per second through ``PgStore``, next to pgbench running the same SQL.

Each worker loops claim (a batch of ``BATCHES`` items: 1, and 10 the way a real worker claims) then complete for each
claimed item: the store's hot path. pgbench runs the store's own claim and complete statements (taken from the
package) against a table filled the same way, with the same concurrency, and with the same values passed as bound
parameters (``-D``), not literals: with literals PostgreSQL would plan the claim once, while the store's parameterized
claim is planned on every call. For a batch of n, pgbench's claim is wrapped to hand its n ids and tokens to n
completes. Both sides run a warm-up first, then count the rows the measured run completed (deleted). So the ratio is
the cost of Python, the store and psycopg (with its pool) on top of PostgreSQL.

    python bench/claims.py            # BETTERCOMPUTE_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/test
    python bench/claims.py --json     # the same figures as one JSON object on stdout (bench/run.py reads it)

Takes about a minute. Uses (and drops) the schema ``bc_bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from bettercompute.ports import WorkItem
from bettercompute_store_pg import PgStore
from bettercompute_store_pg._queue import claim_sql, complete_sql

URL = os.environ.get("BETTERCOMPUTE_DATABASE_URL", "").strip() or "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = "bc_bench"
WORKERS = 4
SECONDS = 8
WARMUP_SECONDS = 2
BATCHES = (1, 10)
ITEMS = 80_000  # more than either side can drain in SECONDS, so no worker ever finds the queue empty
KIND = "bench"
CLAIM_FOR = dt.timedelta(seconds=60)


def drop_schema() -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


async def fill(store: PgStore) -> None:
    async with store.connection() as conn:
        await conn.execute(f'TRUNCATE "{SCHEMA}".work_queue')
    batch = 10_000
    for start in range(0, ITEMS, batch):
        await store.queue.enqueue(
            [WorkItem(kind=KIND, key=f"item-{n}", shard=n % 256) for n in range(start, start + batch)]
        )
    with psycopg.connect(URL, autocommit=True) as conn:  # VACUUM cannot run in a transaction
        conn.execute(f'VACUUM ANALYZE "{SCHEMA}".work_queue')


def remaining() -> int:
    with psycopg.connect(URL, autocommit=True) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{SCHEMA}".work_queue').fetchone()
        assert row is not None
        return int(row[0])


async def run_store(store: PgStore, batch: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds

    async def worker(name: str) -> None:
        while time.monotonic() < deadline:
            for claim in await store.queue.claim(holder=name, kinds=[KIND], limit=batch, claim_for=CLAIM_FOR):
                await store.queue.complete(claim)

    await asyncio.gather(*(worker(f"w{n}") for n in range(WORKERS)))


async def bench_store(store: PgStore, batch: int) -> float:
    await run_store(store, batch, WARMUP_SECONDS)
    before = remaining()
    started = time.monotonic()
    await run_store(store, batch, SECONDS)
    elapsed = time.monotonic() - started
    return (before - remaining()) / elapsed


def pgbench_script(batch: int) -> str:
    """The store's statements, parameters as pgbench variables; a batch's ids and tokens go to one complete each."""
    claim = claim_sql(shards=False, fence=False)
    complete = complete_sql()
    quoted = f'"{SCHEMA}"'

    def one_line(sql: str) -> str:
        return " ".join(sql.replace("{s}", quoted).split())

    if batch == 1:
        lines = [f"{one_line(claim)} \\gset", one_line(complete.replace(":token", ":claim_token")) + ";"]
    else:  # \gset takes one row: the claimed rows become columns id1, token1, ...
        order = "ORDER BY c.due_at, c.id"
        columns = ", ".join(
            f"(array_agg(c.id {order}))[{n}] AS id{n}, (array_agg(c.claim_token {order}))[{n}] AS token{n}"
            for n in range(1, batch + 1)
        )
        lines = [f"WITH c AS ({one_line(claim)}) SELECT {columns} FROM c \\gset"]
        for n in range(1, batch + 1):
            lines.append(one_line(complete.replace(":id", f":id{n}").replace(":token", f":token{n}")) + ";")
    return "\n".join(lines) + "\n"


def pgbench(binary: str, script: Path, batch: int, seconds: int) -> float:
    variables = {"holder": "pgbench", "kinds": f"{{{KIND}}}", "limit": str(batch), "claim_for": str(CLAIM_FOR)}
    defines = [arg for name, value in variables.items() for arg in ("-D", f"{name}={value}")]
    command = [binary, "-n", "-M", "prepared", *defines, "-f", str(script), "-c", str(WORKERS), "-j", "2"]
    result = subprocess.run([*command, "-T", str(seconds), URL], capture_output=True, text=True, check=False)
    match = re.search(r"tps = ([0-9.]+)", result.stdout)
    if result.returncode != 0 or match is None:
        raise SystemExit(f"pgbench failed:\n{result.stdout}\n{result.stderr}")
    return float(match.group(1))


def bench_pgbench(batch: int) -> float | None:
    binary = shutil.which("pgbench")
    if binary is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "claim.sql"
        script.write_text(pgbench_script(batch))
        pgbench(binary, script, batch, WARMUP_SECONDS)
        before = remaining()
        started = time.monotonic()
        pgbench(binary, script, batch, SECONDS)
        elapsed = time.monotonic() - started  # includes pgbench's connection setup, as the store's run does not
        return (before - remaining()) / elapsed


async def measure() -> dict[int, tuple[float, float | None]]:
    """Batch size -> (PgStore items/s, pgbench items/s or None without pgbench)."""
    results: dict[int, tuple[float, float | None]] = {}
    drop_schema()
    try:
        async with PgStore(URL, schema=SCHEMA, pool_size=WORKERS) as store:
            await store.install()
            for batch in BATCHES:
                await fill(store)
                store_rate = await bench_store(store, batch)
                await fill(store)
                results[batch] = (store_rate, bench_pgbench(batch))
    finally:
        drop_schema()
    return results


def figures(results: dict[int, tuple[float, float | None]]) -> dict[str, float | int | None]:
    """The results as flat named figures (``--json``)."""
    out: dict[str, float | int | None] = {"claimers": WORKERS, "seconds": SECONDS}
    for batch, (store_rate, pgbench_rate) in results.items():
        out[f"batch{batch}_store_items_per_s"] = round(store_rate, 1)
        out[f"batch{batch}_pgbench_items_per_s"] = None if pgbench_rate is None else round(pgbench_rate, 1)
        out[f"batch{batch}_ratio"] = None if pgbench_rate is None else round(store_rate / pgbench_rate, 3)
    return out


def report(results: dict[int, tuple[float, float | None]]) -> None:
    for batch, (store_rate, pgbench_rate) in results.items():
        print(f"claim batch {batch:2d}, {WORKERS} concurrent claimers, items/s (claim + complete each):")
        print(f"  PgStore  {store_rate:8.0f}")
        if pgbench_rate is None:
            print("  pgbench  not installed (postgresql-client); no comparison")
            continue
        print(f"  pgbench  {pgbench_rate:8.0f}  same SQL, bound parameters, prepared")
        print(f"  ratio    {store_rate / pgbench_rate:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    results = asyncio.run(measure())
    if args.json:
        print(json.dumps(figures(results)))
    else:
        report(results)


if __name__ == "__main__":
    main()
