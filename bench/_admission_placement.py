"""(3) of ``bench/admission.py``: the time of one placement (``bc_place``) and of one whole admission (transaction 2)
as the fleet grows, on an empty pool and on pools half booked two ways."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import time
import uuid
from typing import Any

import attrs
import psycopg

from bench import _admission_setup as base
from bench._admission_pgbench import admit_argument
from bench._admission_setup import HOUR, PAST, Setup, connect, say, seed_fleet, seed_history
from bettercompute._runtime.shards import SHARDS, shard_of
from bettercompute_store_pg.modules.reservations._repository import _BEGIN

MIN_CALLS = 5  # placement calls timed at least, per pool and layout
CELL_SECONDS = 20.0  # ... and past this many seconds, no more than that


@attrs.frozen(kw_only=True)
class Placement:
    nodes: int
    layout: str  # "empty", "front", "spread"
    place_ms: float
    admit_ms: float
    candidates: int
    calls: int


def place_statement() -> str:
    return (
        f'SELECT "{base.SCHEMA}".bc_place(%(pool)s, %(gpus)s, NULL, NULL, false, false, NULL,'
        f" tstzrange(%(start)s, %(end)s, '[)'), '{{}}')"
    )


def begin_statement() -> str:
    """The store's ``_BEGIN`` in psycopg's parameter style."""
    return re.sub(r"(?<!:):([a-z_]+)\b", r"%(\1)s", _BEGIN.replace("{s}", f'"{base.SCHEMA}"'))


def time_placement(
    conn: psycopg.Connection[Any], setup: Setup, pool: str, *, gpus: int, calls: int, start: dt.datetime
) -> tuple[float, float, int, int]:
    """Median ms of ``bc_place`` and of ``bc_admit_reservation`` (a draft inserted first, rolled back after), the
    candidates the placer looked at, and how many calls were timed: ``calls``, or fewer (at least ``MIN_CALLS``)
    when they take longer than ``CELL_SECONDS`` together."""
    window = {"pool": pool, "gpus": gpus, "start": start, "end": start + HOUR}
    place = place_statement()
    begin = begin_statement()
    admit = f'SELECT "{base.SCHEMA}".bc_admit_reservation(%(p)s::jsonb)'
    place_times = []
    admit_times = []
    candidates = 0
    began = time.perf_counter()
    for n in range(calls + 2):  # the first two warm the session's plans and are not counted
        if n >= MIN_CALLS + 2 and time.perf_counter() - began > CELL_SECONDS:
            break
        t0 = time.perf_counter()
        row = conn.execute(place, window).fetchone()
        elapsed = time.perf_counter() - t0
        assert row is not None and row[0] is not None, "the placer found nothing on a pool with room"
        candidates = int(row[0]["candidates"])
        if n >= 2:
            place_times.append(elapsed)
        reservation = f"rsv_place_{n}_{uuid.uuid4().hex[:8]}"
        argument = admit_argument(setup, with_key=False)
        argument.update(id=reservation, work_shard=shard_of(reservation) % SHARDS, now=start.isoformat())
        with conn.transaction(force_rollback=True):
            conn.execute(
                begin,
                {
                    "id": reservation,
                    "tenant": setup.tenant,
                    "pool_id": pool,
                    "pool_tenants": [setup.tenant],
                    "gpus": gpus,
                    "constraints": "{}",
                    "start_at": start,
                    "end_at": start + HOUR,
                    "labels": "{}",
                    "created_by": setup.principal,
                    "now": start,
                    "identity": setup.principal,
                    "key": None,
                    "request_hash": "",
                    "attempt": "x",
                    "ttl": dt.timedelta(hours=24),
                },
            )
            t0 = time.perf_counter()
            out = conn.execute(admit, {"p": json.dumps(argument)}).fetchone()
            elapsed = time.perf_counter() - t0
            assert out is not None and out[0]["state"] == "placed", out
        if n >= 2:
            admit_times.append(elapsed)
    return (
        1000 * statistics.median(place_times),
        1000 * statistics.median(admit_times),
        candidates,
        len(place_times),
    )


def book_half(conn: psycopg.Connection[Any], setup: Setup, pool: str, *, layout: str, start: dt.datetime) -> None:
    """Book and hold half of the pool's atoms over a day around ``start``: the first half of the nodes in the
    placer's order (``front``), or every other node (``spread``)."""
    s = f'"{base.SCHEMA}"'
    conn.execute(f"DELETE FROM {s}.bookings WHERE pool_id = %s AND reservation_id NOT LIKE %s", (pool, PAST + "%"))
    keep = "o <= total / 2" if layout == "front" else "o %% 2 = 1"
    conn.execute(
        f"""INSERT INTO {s}.bookings (atom_id, reservation_id, tenant, pool_id, gpus, during)
        SELECT a.id, 'rsv_fill_' || a.node_id, a.tenant, a.pool_id, 1, tstzrange(%(from)s, %(to)s, '[)')
        FROM {s}.atoms AS a JOIN (
            SELECT id, row_number() OVER (ORDER BY id) AS o, count(*) OVER () AS total
            FROM {s}.nodes WHERE pool_id = %(pool)s
        ) AS n ON n.id = a.node_id
        WHERE a.pool_id = %(pool)s AND {keep}""",
        {"pool": pool, "from": start - dt.timedelta(hours=12), "to": start + dt.timedelta(hours=12)},
    )
    # ... held, as the placer leaves the atoms it books (its hints count them busy)
    conn.execute(
        f"""INSERT INTO {s}.placement_holds (atom_id, reservation_id)
        SELECT atom_id, reservation_id FROM {s}.bookings WHERE pool_id = %s AND reservation_id LIKE 'rsv_fill_%%'""",
        (pool,),
    )
    conn.execute(
        f"SELECT {s}.bc_placement_refresh(ARRAY(SELECT id FROM {s}.nodes WHERE pool_id = %s ORDER BY 1))", (pool,)
    )
    for table in ("bookings", "placement_holds", "placement_nodes"):
        conn.execute(f"VACUUM ANALYZE {s}.{table}")


def remove_fleet(conn: psycopg.Connection[Any], pool: str) -> None:
    """Take a pool's nodes, devices, atoms and bookings away."""
    s = f'"{base.SCHEMA}"'
    for table in ("bookings", "atoms", "devices", "nodes"):
        conn.execute(f"DELETE FROM {s}.{table} WHERE pool_id = %s", (pool,))


def bench_placement(setup: Setup, args: argparse.Namespace) -> tuple[list[Placement], float]:
    """Each size alone: its fleet seeded (with its history), timed empty and half booked, then taken away again,
    so that no other pool's atoms are in the tables (they would change the query plans being measured)."""
    start = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(minutes=5)
    results = []
    with connect() as conn:
        t0 = time.perf_counter()
        for _ in range(200):
            conn.execute("SELECT 1")
        round_trip = 1000 * (time.perf_counter() - t0) / 200
        remove_fleet(conn, setup.pool)
        for size, pool in setup.place_pools.items():
            say(f"placement: seeding {size} nodes")
            seed_fleet(conn, tenant=setup.tenant, pool=pool, nodes=size, prefix=f"p{size}-")
            seed_history(conn, pool)
            for table in ("nodes", "devices", "atoms", "bookings", "placement_holds", "placement_nodes"):
                conn.execute(f'VACUUM ANALYZE "{base.SCHEMA}".{table}')
            for layout in ("empty", "front", "spread"):
                say(f"placement: {size} nodes, {layout}")
                if layout != "empty":
                    book_half(conn, setup, pool, layout=layout, start=start)
                place_ms, admit_ms, candidates, calls = time_placement(
                    conn, setup, pool, gpus=args.gpus, calls=args.calls, start=start
                )
                results.append(
                    Placement(
                        nodes=size,
                        layout=layout,
                        place_ms=place_ms,
                        admit_ms=admit_ms,
                        candidates=candidates,
                        calls=calls,
                    )
                )
            remove_fleet(conn, pool)
    return results, round_trip
