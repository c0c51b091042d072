"""Work-queue claims per second through ``PgStore``, next to pgbench running the same SQL.

Each worker loops claim (one item) then complete: two statements per item, the store's hot path. pgbench runs the
store's own claim and complete statements (taken from the package, parameters filled in) against a table filled
the same way, so the ratio is the cost of Python, SQLAlchemy and psycopg on top of PostgreSQL.

    python bench/claims.py            # BETTERCOMPUTE_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/test

Takes about 30 seconds. Uses (and drops) the schema ``bc_bench``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
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
ITEMS = 80_000  # more than either side can drain in SECONDS, so no worker ever finds the queue empty
KIND = "bench"
CLAIM_FOR = dt.timedelta(seconds=60)


def drop_schema() -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


async def fill(store: PgStore) -> None:
    async with store.engine.begin() as conn:
        await conn.exec_driver_sql(f'TRUNCATE "{SCHEMA}".work_queue')
    batch = 10_000
    for start in range(0, ITEMS, batch):
        await store.queue.enqueue(
            [WorkItem(kind=KIND, key=f"item-{n}", shard=n % 256) for n in range(start, start + batch)]
        )
    with psycopg.connect(URL, autocommit=True) as conn:  # VACUUM cannot run in a transaction
        conn.execute(f'VACUUM ANALYZE "{SCHEMA}".work_queue')


async def bench_store(store: PgStore) -> float:
    done = 0
    deadline = time.monotonic() + SECONDS

    async def worker(name: str) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            for claim in await store.queue.claim(holder=name, kinds=[KIND], limit=1, claim_for=CLAIM_FOR):
                if await store.queue.complete(claim):
                    done += 1

    started = time.monotonic()
    await asyncio.gather(*(worker(f"w{n}") for n in range(WORKERS)))
    return done / (time.monotonic() - started)


def pgbench_script() -> str:
    """The store's statements with their parameters filled in the way pgbench understands."""
    claim = claim_sql(shards=False, fence=False)
    for name, value in {
        ":holder": "'pgbench'",
        ":kinds": f"'{{{KIND}}}'",
        ":limit": "1",
        ":claim_for": f"interval '{int(CLAIM_FOR.total_seconds())} seconds'",
    }.items():
        claim = re.sub(re.escape(name) + r"\b", value, claim)
    complete = complete_sql().replace(":token", ":claim_token")  # \gset names variables after the columns
    quoted = f'"{SCHEMA}"'

    def one_line(sql: str) -> str:
        return " ".join(sql.replace("{s}", quoted).split())

    return f"{one_line(claim)} \\gset\n{one_line(complete)};\n"


def bench_pgbench() -> float | None:
    binary = shutil.which("pgbench")
    if binary is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "claim.sql"
        script.write_text(pgbench_script())
        result = subprocess.run(
            [binary, "-n", "-M", "prepared", "-f", str(script), "-c", str(WORKERS), "-j", "2", "-T", str(SECONDS), URL],
            capture_output=True,
            text=True,
            check=False,
        )
    match = re.search(r"tps = ([0-9.]+)", result.stdout)
    if result.returncode != 0 or match is None:
        raise SystemExit(f"pgbench failed:\n{result.stdout}\n{result.stderr}")
    return float(match.group(1))


async def main() -> None:
    drop_schema()
    try:
        async with PgStore(URL, schema=SCHEMA, pool_size=WORKERS) as store:
            await store.install()
            await fill(store)
            store_rate = await bench_store(store)
            await fill(store)
        pgbench_rate = bench_pgbench()
    finally:
        drop_schema()
    print(f"PgStore  claim+complete, {WORKERS} concurrent claimers: {store_rate:8.0f} items/s")
    if pgbench_rate is None:
        print("pgbench  not installed (postgresql-client); no comparison")
        return
    print(f"pgbench  same SQL, {WORKERS} clients, prepared:          {pgbench_rate:8.0f} items/s")
    print(f"ratio    PgStore / pgbench: {store_rate / pgbench_rate:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
