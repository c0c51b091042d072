"""A simulated fleet against a control plane of separate processes: how long until every node is adopted, and what
holding the fleet costs in steady state (each gateway's CPU, PostgreSQL's writes, the control plane's CPU per node).

Figures (this 2-core machine, shared with other engineers' test runs; two gateway processes, one worker, two sims;
10 s heartbeats; "adopted": seconds from the sims' start until every node is ``adopted``, "acked": until every one
has also acknowledged desired-state generation 1; the steady state's CPU in % of one core; "plane": the two
gateways' and the worker's CPU per node per minute, in ms; "rows/s": rows written per second in the schema;
"busy": how busy the machine's two cores were while the fleet was adopted / over the window, and the 1-minute load
at the window's end):

    python bench/fleet.py ...      joined adopted  adopted  acked | gateways CPU  worker  sims  plane  rows/s  busy,load
    (defaults: 1000, 2 minutes)     1000    1000     57 s   58 s | 3.4 + 3.5      1.5   4.4   5.02     268  94/10 %, 2.0
    --nodes 5000 --settle 30        5000    5000    264 s  266 s | 8.1 + 8.1      1.6  10.3   2.14    1108   -/19 %, 1.6
      --window 60
    --nodes 10000 --settle 40      10000   10000    595 s  597 s | 14.4 + 14.1    1.5  17.3   1.80    2125  98/31 %, 2.3
      --window 60 --adopt-timeout 1800
    1000, before the two fixes      1000    1000     98 s  100 s | 2.7 + 2.7      1.4   2.8   4.11     272   -/74 %, 3.1
      below (--settle 30 --window 60)

No node was quarantined (no fault is injected), every node held its session to the end (the database saw each one's
liveness written during the window), and every one acknowledged generation 1. Gateway memory: 126 KB a session at
5,000 sessions each (710 MB per gateway), 116 KB at 500; before the uvloop fix about 340 KB (264 MB for 500). ``-``:
not measured in that run. So the aim, 10,000 nodes held steady with 10 s heartbeats on this machine, is met: holding
them costs the whole control plane about 30 % of one core (each gateway about 14 %) and 2,100 rows written a second;
it is adopting them that takes the machine (ten minutes at 10,000, both cores busy throughout).

Reading them.

- The steady state grows with the fleet and is cheap: each gateway's CPU is about what ``bench/gateway.py``
  measured for as many sessions (heartbeat frames, and the once-a-second flush), the worker's is flat (about 1 s of
  CPU a minute, mostly its 256 shard leases renewed every 5 s: 60-66 rows/s whatever the fleet), and PostgreSQL
  writes two rows per heartbeat (the session's and the node's ``last_seen_at``, one statement a second per gateway),
  so rows/s is about 2 x nodes / 10, plus the leases (at 10,000, also 20/s of join nonces expiring). Per node it
  falls as the fixed part spreads: 1.8 ms of control-plane CPU per node per minute at 10,000.
- Adoption is where the time goes, and the limit is the machine's CPU, not one process (98 % busy while 10,000 were
  adopted): each node costs the control plane about 58 ms of CPU to join, open its session, record its inventory,
  answer ``diag.nvml`` and be adopted (at 10,000: 37 ms in the gateways, 21 ms in the worker), its simulated daemon
  another 25 ms (key, CSR, sealing, two TLS handshakes), and PostgreSQL its own share; two cores give 15-25 joins a
  second (16 under way at once, ``bcd sim``'s default of 8 per sim; 32 per sim joined no faster, tried once at
  1,000). The worker adopts about 10 nodes a second while the joins run beside it and about 30 a second once they
  are done. Its reconcile loops are not CPU-bound (20-60 % of a core): each item waits on several statements in
  turn, eight items at a time per loop (``bettercompute._runtime.workers.CONCURRENCY``), so its rate follows
  PostgreSQL's latency on a loaded machine.
- Where a gateway's CPU goes in steady state (py-spy, 25 s, 5,000 sessions at 10,000 nodes, 16 % of a core): about
  40 % in uvloop's own C code (sockets, TLS, timers), about 25 % in the flush loop (``revoked_among`` and
  ``dispatch_many`` take every session's serial and id each second, and psycopg builds those arrays in Python), and
  the rest in each frame's Python path (h2, grpclib, betterproto); the same split ``bench/gateway.py`` found.
- Two faults this bench found, fixed in commits of their own, each with a test: ``better-compute serve`` and
  ``dev`` ran the gateway on asyncio's own loop rather than uvloop as DESIGN says (three times the memory per
  session); and every commit that enqueued work or published an event waited for its NOTIFY poke, sent one at a
  time over one connection with a 2 s limit, so while 1,000 nodes joined each gateway logged about 1,900 pokes that
  timed out after holding their request for 2 s. Identical pokes waiting for that connection are now sent once.
  Neither moved the join rate much here, where the CPU is the limit, but both were waste growing with the fleet.

Processes, all on this machine, all over one PostgreSQL schema (``bc_bench_fleet``, dropped before and after):

- the conductor (this one): writes a configuration file, runs ``better-compute migrate`` with it, makes the root
  admin, a tenant, a pool and one join token with a use per node (in process, through the public API, as
  ``bench/gateway.py`` does), starts the others, watches the database, measures and reports;
- two gateway processes, ``better-compute serve --roles gateway --gateway-port P --no-migrate`` (each with its own
  instance name, hence its own gateway name; no KMS key: each enrols with a one-time token from
  ``better-compute gateways token`` on the internal listener of one api process, ``serve --roles api``, which
  issues its certificate and answers its joins and session checks), so what is measured
  is exactly what an operator runs: uvloop, the LISTEN/NOTIFY notifier, ``GatewayOptions`` at their defaults (10 s
  heartbeats, the raised young-generation GC threshold);
- one worker process, ``better-compute serve --roles controllers,sinks --no-migrate``: the inventory and lifecycle
  controllers, the command and session sweepers, and the outbox dispatcher (no webhook is subscribed, but the outbox
  is drained as in a real deployment);
- two ``bcd sim`` processes, one per gateway, each with half of the nodes (its own seed, so no two nodes claim the
  same machine), joining with the one token through their own gateway, then holding their sessions; no fault is
  injected (every node should be adopted).

The real entry points rather than processes composed by the bench (as ``bench/gateway.py`` does) because the
question is what the deployed control plane costs, and the command composes it (notifier, gateway certificate,
module set) in ways a hand-made composition could miss. The price: no statement counter can be put inside those
processes, so PostgreSQL's writes are read from PostgreSQL itself (below).

Measured, per fleet size:

- adoption: from the start of the sims until every node's state is ``adopted`` (or ``quarantined``) and, a figure
  apart, until every adopted node has acknowledged desired-state generation 1; with the counts of nodes joined,
  adopted and quarantined at that point (or when ``--adopt-timeout`` gave up, which the report then says), and the
  CPU each process spent over that phase;
- then ``--settle`` seconds, then the steady state over ``--window`` seconds: each process's CPU time (``utime`` +
  ``stime`` from ``/proc/<pid>/stat``) over the wall time, in % of one core; the control plane's CPU (two gateways
  and the worker) per node per minute, in milliseconds; each gateway's resident memory; the rows written per second
  in the bench's schema (``n_tup_ins + n_tup_upd + n_tup_del`` of ``pg_stat_user_tables``, which PostgreSQL counts
  per table, so other engineers' tests in other schemas of the same database do not count; the busiest tables are
  listed); the machine's busy share (``/proc/stat``) and load average, since the two cores are shared; and the nodes
  still in session at the end of the window whose liveness was written during it (``sessions.last_seen_at``);
- with ``--reservations N``, after the window: placed -> bound. The conductor makes N reservations one after another
  (one GPU each, for an hour from now) with ``reservations.create`` in process, on a control plane with the
  LISTEN/NOTIFY notifier as the api role has, so its commit wakes the worker as a request would. Each is timed from
  ``create`` returning it ``placed`` until its row reads ``bound`` (or ``active``, which one starting now reaches in
  the same controller pass), read every 5 ms: the worker's controller writes the node's desired state and pokes the
  gateways, the gateway sends it down the node's session, the ``bcd sim`` daemon applies and acknowledges it, the
  gateway records the acknowledgement (in its once-a-second flush), and the controller binds. On this machine that
  took about a second each time (p50 and max within a few percent of each other); this bench does not break the
  second down. There is no pgbench baseline for it: it is mostly waiting on those steps, not SQL.

    python bench/fleet.py                        # 1,000 nodes; BETTERCOMPUTE_DATABASE_URL, else
                                                 # postgresql://postgres@127.0.0.1:5432/test
    python bench/fleet.py --nodes 100 --settle 5 --window 10 --reservations 30 --json   # as bench/run.py runs it
    python bench/fleet.py --nodes 10000 --settle 40 --window 60 --adopt-timeout 1800 --json

Takes about 2 minutes with the defaults on a quiet machine, about 5 for 5,000 nodes and 12 for 10,000 (the sims'
state folders take about 40 KB a node in a temporary folder; ``--keep`` keeps it and the processes' logs). Each
process's open-files limit is raised towards one per node plus 1,024 (the hard limit here is 20,000).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import psycopg

from bench._fleet_parts import (
    BIN,
    SCHEMA,
    START_TIMEOUT,
    URL,
    Made,
    Proc,
    conductor_options,
    drop_schema,
    free_port,
    make_token,
    raise_open_files,
    say,
    sim_flags,
    write_config,
)
from bench._procfs import load_average, machine_ticks, rss_bytes
from bettercompute import better_compute
from bettercompute.modules.reservations import CreateReservationInput, ReservationsGroup

NODES_DEFAULT = "1000"
SETTLE_DEFAULT = 20.0
WINDOW_DEFAULT = 30.0
ADOPT_TIMEOUT_DEFAULT = 900.0
JOIN_CONCURRENCY_DEFAULT = 8
GATEWAYS = 2
SPARE_FILES = 1024
BIND_POLL = 0.005  # seconds between two reads of a reservation's state
BIND_TIMEOUT = 30.0  # seconds a reservation may take to bind before it counts as not bound


# --- watching the database --------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Census:
    joined: int
    states: dict[str, int]
    acked: int  # adopted nodes whose observed generation reached their desired one (>= 1)
    in_session: int

    @property
    def settled(self) -> int:
        return self.states.get("adopted", 0) + self.states.get("quarantined", 0)


def census(conn: psycopg.Connection[Any]) -> Census:
    states = dict(conn.execute(f"SELECT state, count(*) FROM {SCHEMA}.nodes GROUP BY state").fetchall())
    acked = conn.execute(
        f"SELECT count(*) FROM {SCHEMA}.nodes WHERE state = 'adopted' AND desired_generation >= 1"
        " AND observed_generation = desired_generation"
    ).fetchone()
    open_ = conn.execute(f"SELECT count(*) FROM {SCHEMA}.sessions WHERE closed_at IS NULL").fetchone()
    return Census(
        joined=sum(states.values()),
        states={str(k): int(v) for k, v in states.items()},
        acked=int(acked[0]) if acked else 0,
        in_session=int(open_[0]) if open_ else 0,
    )


def rows_written(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Rows inserted, updated and deleted so far, by table of the bench's schema (PostgreSQL's own counts)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    found = conn.execute(
        "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE schemaname = %s",
        (SCHEMA,),
    ).fetchall()
    return {str(name): int(n) for name, n in found}


# --- one fleet size ---------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Plane:
    """The control plane's processes: the worker and the gateways, each gateway's port and its memory when idle."""

    worker: Proc
    gateways: list[Proc]
    ports: list[int]
    idle_rss: dict[str, int]


def prepare(nodes: int, folder: Path, ports: Sequence[int]) -> tuple[Path, Made]:
    """A fresh schema, migrated by ``better-compute migrate``, and what the fleet joins with; the configuration file."""
    drop_schema()
    config = write_config(folder, ports[0])
    migrate = subprocess.run(
        [str(BIN / "better-compute"), "--config", str(config), "migrate"], capture_output=True, check=False
    )
    if migrate.returncode != 0:
        raise SystemExit(f"better-compute migrate failed: {migrate.stderr.decode(errors='replace')[-2000:]}")
    return config, asyncio.run(make_token(folder, nodes, ports[0]))


def start_plane(config: Path, folder: Path, ports: Sequence[int], procs: list[Proc]) -> Plane:
    """Start the worker, the api process whose internal listener the gateways enrol on and ask (they hold no KMS
    key), and the gateways (each put in ``procs`` as soon as it runs); wait until they run."""
    serve = [str(BIN / "better-compute"), "--config", str(config), "serve", "--no-migrate"]
    worker = Proc.start(
        "worker", [*serve, "--roles", "controllers,sinks"], folder, {"BETTERCOMPUTE_INSTANCE": "bench-worker"}
    )
    procs.append(worker)
    internal = free_port()
    api = Proc.start(
        "api",
        [*serve, "--roles", "api", "--port", str(free_port())],
        folder,
        {"BETTERCOMPUTE_INSTANCE": "bench-api", "BETTERCOMPUTE_INTERNAL_PORT": str(internal)},
    )
    procs.append(api)
    api.wait_for_log("serving ", START_TIMEOUT)
    edge = folder / "edge.toml"
    lines = [line for line in config.read_text().splitlines() if not line.startswith("kms_key_file")]
    edge.write_text("\n".join([*lines, f'internal_address = "127.0.0.1:{internal}"']) + "\n")
    gateways = []
    for i, port in enumerate(ports):
        name = f"bench-gw-{i + 1}"
        minted = subprocess.run(
            [str(BIN / "better-compute"), "--config", str(config), "gateways", "token", name],
            capture_output=True,
            check=False,
        )
        if minted.returncode != 0:
            raise SystemExit(f"better-compute gateways token failed: {minted.stderr.decode(errors='replace')[-2000:]}")
        env = {
            "BETTERCOMPUTE_INSTANCE": name,
            "BETTERCOMPUTE_GATEWAY_TOKEN": minted.stdout.decode().strip(),
            "BETTERCOMPUTE_GATEWAY_STATE_DIR": str(folder / f"{name}.state"),
        }
        edge_serve = [str(BIN / "better-compute"), "--config", str(edge), "serve", "--no-migrate"]
        gateways.append(
            Proc.start(
                f"gateway-{i + 1}", [*edge_serve, "--roles", "gateway", "--gateway-port", str(port)], folder, env
            )
        )
    procs += gateways
    for proc in procs:
        proc.wait_for_log("running " if proc is not api else "serving ", START_TIMEOUT)
    idle_rss = {p.name: rss_bytes(p.pid) for p in gateways}
    return Plane(worker=worker, gateways=gateways, ports=list(ports), idle_rss=idle_rss)


def start_sims(args: argparse.Namespace, nodes: int, folder: Path, plane: Plane, made: Made) -> list[Proc]:
    """One ``bcd sim`` per gateway, each with its share of the nodes and its own seed."""
    shares = [nodes // GATEWAYS + (1 if i < nodes % GATEWAYS else 0) for i in range(GATEWAYS)]
    return [
        Proc.start(
            f"sim-{i + 1}",
            [
                str(BIN / "bcd"),
                "sim",
                "--nodes",
                str(share),
                "--seed",
                str(i + 1),
                "--state-dir",
                str(folder / f"sim-{i + 1}"),
                "--join-concurrency",
                str(args.join_concurrency),
                *sim_flags(made.join_command, port),
            ],
            folder,
        )
        for i, (share, port) in enumerate(zip(shares, plane.ports, strict=True))
    ]


def adopt(
    args: argparse.Namespace, nodes: int, folder: Path, plane: Plane, made: Made, procs: list[Proc]
) -> tuple[list[Proc], dict[str, Any], dict[str, float]]:
    """Start the sims (put in ``procs``) and watch until the fleet is adopted; the sims, the adoption's figures and
    the CPU each process spent over it."""
    started = time.monotonic()
    cpu_start = {p.name: p.cpu() for p in procs}
    busy_start, total_start = machine_ticks()
    sims = start_sims(args, nodes, folder, plane, made)
    procs += sims
    adoption = watch_adoption(args, nodes, started)
    cpu_adopt = {p.name: p.cpu() - cpu_start.get(p.name, 0.0) for p in procs}
    busy_end, total_end = machine_ticks()
    adoption["machine_busy_percent"] = round(100 * (busy_end - busy_start) / max(1, total_end - total_start), 1)
    return sims, adoption, cpu_adopt


def stop_sims(sims: Sequence[Proc]) -> list[Any]:
    """Stop the sims; the summary each printed last."""
    summaries = []
    for sim in sims:
        out = sim.stop()
        lines = out.decode(errors="replace").strip().splitlines()
        with contextlib.suppress(ValueError, IndexError):
            summaries.append(json.loads(lines[-1]))
    return summaries


def run_size(args: argparse.Namespace, nodes: int, folder: Path) -> dict[str, Any]:
    ports = [free_port() for _ in range(GATEWAYS)]
    config, made = prepare(nodes, folder, ports)
    procs: list[Proc] = []
    try:
        plane = start_plane(config, folder, ports, procs)
        say(f"{nodes} nodes: worker and {GATEWAYS} gateways running (ports {ports})")
        sims, adoption, cpu_adopt = adopt(args, nodes, folder, plane, made, procs)

        say(f"{nodes} nodes: settling {args.settle:.0f} s")
        time.sleep(args.settle)
        steady = measure_window(args, nodes, plane.gateways, plane.worker, sims)
        live = steady["sessions_live_in_window"]
        held = {f"gateway-{i + 1}": live.get(f"bench-gw-{i + 1}", 0) for i in range(GATEWAYS)}
        steady["gateway_kb_per_session"] = {
            name: round((steady["gateway_rss_mb"][name] * 2**20 - plane.idle_rss[name]) / 1024 / count, 1)
            for name, count in held.items()
            if count
        }

        binding = None
        if args.reservations:
            say(f"{nodes} nodes: {args.reservations} reservations, placed -> bound")
            binding = asyncio.run(measure_binding(folder, ports[0], made, args.reservations))
        return {
            "nodes": nodes,
            "gateways": GATEWAYS,
            "adoption": adoption,
            "adoption_cpu_seconds": {k: round(v, 1) for k, v in cpu_adopt.items()},
            "steady": steady,
            "placed_to_bound": binding,
            "sims": stop_sims(sims),
        }
    finally:
        for proc in reversed(procs):
            proc.stop(within=15)
        drop_schema()


def watch_adoption(args: argparse.Namespace, nodes: int, started: float) -> dict[str, Any]:
    """Poll the database until every node is adopted (or quarantined) and every adopted node acked generation 1."""
    settled_at: float | None = None
    acked_at: float | None = None
    joined_at: float | None = None
    last_print = 0.0
    with psycopg.connect(URL, autocommit=True) as conn:
        while True:
            now = time.monotonic() - started
            seen = census(conn)
            if joined_at is None and seen.joined >= nodes:
                joined_at = now
            if settled_at is None and seen.settled >= nodes:
                settled_at = now
            if acked_at is None and seen.settled >= nodes and seen.acked >= seen.states.get("adopted", 0):
                acked_at = now
            if now - last_print >= 10:
                last_print = now
                say(
                    f"  {now:5.0f} s: joined {seen.joined}, in session {seen.in_session}, {seen.states}, "
                    f"acked {seen.acked}"
                )
            if acked_at is not None or now > args.adopt_timeout:
                break
            time.sleep(1.0)
    return {
        "all_settled": settled_at is not None,
        "seconds_to_joined": None if joined_at is None else round(joined_at, 1),
        "seconds_to_adopted": None if settled_at is None else round(settled_at, 1),
        "seconds_to_acked": None if acked_at is None else round(acked_at, 1),
        "gave_up_after": None if settled_at is not None else round(args.adopt_timeout),
        "joined": seen.joined,
        "adopted": seen.states.get("adopted", 0),
        "quarantined": seen.states.get("quarantined", 0),
        "other_states": {k: v for k, v in seen.states.items() if k not in ("adopted", "quarantined")},
        "acked": seen.acked,
        "in_session": seen.in_session,
    }


def measure_window(
    args: argparse.Namespace, nodes: int, gateways: Sequence[Proc], worker: Proc, sims: Sequence[Proc]
) -> dict[str, Any]:
    """The steady state over ``--window`` seconds."""
    everyone = [*gateways, worker, *sims]
    with psycopg.connect(URL, autocommit=True) as conn:
        window_start_db = conn.execute("SELECT now()").fetchone()
        rows_before = rows_written(conn)
        cpu_before = {p.name: p.cpu() for p in everyone}
        busy_before, total_before = machine_ticks()
        t0 = time.monotonic()
        say(f"{nodes} nodes: measuring {args.window:.0f} s")
        time.sleep(args.window)
        wall = time.monotonic() - t0
        cpu_after = {p.name: p.cpu() for p in everyone}
        busy_after, total_after = machine_ticks()
        load = load_average()
        # Stats reach the shared counters when a backend goes idle, at most once a second: give them that second.
        time.sleep(1.5)
        rows_after = rows_written(conn)
        assert window_start_db is not None
        fresh = conn.execute(
            f"SELECT gateway, count(*) FROM {SCHEMA}.sessions WHERE closed_at IS NULL AND last_seen_at > %s"
            " GROUP BY gateway",
            (window_start_db[0],),
        ).fetchall()
        after = census(conn)
    percent = {name: 100 * (cpu_after[name] - cpu_before[name]) / wall for name in cpu_after}
    plane = sum(cpu_after[p.name] - cpu_before[p.name] for p in [*gateways, worker])
    deltas = {t: rows_after.get(t, 0) - rows_before.get(t, 0) for t in rows_after}
    busiest = sorted(((t, d) for t, d in deltas.items() if d > 0), key=lambda x: -x[1])[:8]
    return {
        "window_seconds": round(wall, 1),
        "cpu_percent": {k: round(v, 1) for k, v in percent.items()},
        "control_plane_percent": round(100 * plane / wall, 1),
        "control_plane_ms_per_node_minute": round(1000 * plane / wall * 60 / nodes, 3),
        "gateway_rss_mb": {p.name: round(rss_bytes(p.pid) / 2**20, 1) for p in gateways},
        "worker_rss_mb": round(rss_bytes(worker.pid) / 2**20, 1),
        "rows_written_per_second": round(sum(deltas.values()) / wall, 1),
        "rows_by_table_per_second": {t: round(d / wall, 2) for t, d in busiest},
        "sessions_live_in_window": {str(g): int(n) for g, n in sorted(fresh)},
        "states_at_end": after.states,
        "machine_busy_percent": round(100 * (busy_after - busy_before) / max(1, total_after - total_before), 1),
        "load_average": load,
    }


# --- placed -> bound ----------------------------------------------------------------------------------------------


async def measure_binding(folder: Path, gateway_port: int, made: Made, count: int) -> dict[str, Any]:
    """``count`` reservations made one after another, each of one GPU for an hour from now: from
    ``reservations.create`` returning it ``placed`` until the database shows it ``bound`` (or already ``active``,
    which a reservation starting now reaches in the same pass), polled every ``BIND_POLL`` seconds."""
    options = conductor_options(folder, gateway_port, notifier=True)
    compute = better_compute(options)
    await compute.initialize(migrate=False)
    created_ms: list[float] = []
    bound_ms: list[float] = []
    states: dict[str, int] = {}
    busy_start, total_start = machine_ticks()
    try:
        group: ReservationsGroup[Any] = compute.api.group(ReservationsGroup)
        async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
            for _ in range(count):
                asked = time.perf_counter()
                made_one = await group.create(
                    made.root, CreateReservationInput(tenant=made.tenant, pool_id=made.pool, gpus=1, duration="PT1H")
                )
                placed = time.perf_counter()
                created_ms.append(1000 * (placed - asked))
                if made_one.state != "placed":
                    states[made_one.state] = states.get(made_one.state, 0) + 1
                    continue
                deadline = placed + BIND_TIMEOUT
                state = made_one.state
                while time.perf_counter() < deadline:
                    row = await (
                        await conn.execute(f"SELECT state FROM {SCHEMA}.reservations WHERE id = %s", (made_one.id,))
                    ).fetchone()
                    state = str(row[0]) if row else "missing"
                    if state != "placed":
                        break
                    await asyncio.sleep(BIND_POLL)
                seen = time.perf_counter()
                states[state] = states.get(state, 0) + 1
                if state in ("bound", "active"):
                    bound_ms.append(1000 * (seen - placed))
    finally:
        await compute.close()
    busy_end, total_end = machine_ticks()
    ordered = sorted(bound_ms)

    def at(q: float) -> float | None:
        return round(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))], 1) if ordered else None

    return {
        "reservations": count,
        "bound": len(bound_ms),
        "states": states,
        "create_p50_ms": round(sorted(created_ms)[len(created_ms) // 2], 1) if created_ms else None,
        "min_ms": round(ordered[0], 1) if ordered else None,
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "max_ms": at(1.0),
        "poll_ms": 1000 * BIND_POLL,
        "machine_busy_percent": round(100 * (busy_end - busy_start) / max(1, total_end - total_start), 1),
    }


# --- the report -------------------------------------------------------------------------------------------------


def report(results: Sequence[Mapping[str, Any]]) -> None:
    print(
        "  nodes  joined adopted quar.  adopted  acked  | steady: gateway CPU %  worker %  sims %  plane ms/node/min"
        "  rows/s  in session  load, busy"
    )
    for r in results:
        a, s = r["adoption"], r["steady"]
        cpu = s["cpu_percent"]
        sims = sum(v for k, v in cpu.items() if k.startswith("sim-"))
        live = sum(s["sessions_live_in_window"].values())
        seconds = [f"{a[k]:.0f} s" if a[k] is not None else "-" for k in ("seconds_to_adopted", "seconds_to_acked")]
        gateways = " + ".join(f"{cpu[f'gateway-{i + 1}']:.1f}" for i in range(GATEWAYS))
        print(
            f"{r['nodes']:>7} {a['joined']:>7} {a['adopted']:>7} {a['quarantined']:>5} {seconds[0]:>8} {seconds[1]:>6}"
            f"  |  {gateways:>19}  {cpu['worker']:>7.1f}  {sims:>6.1f}"
            f"  {s['control_plane_ms_per_node_minute']:>17.2f}  {s['rows_written_per_second']:>6.0f}"
            f"  {live:>10}  {s['load_average']:.1f}, {s['machine_busy_percent']:.0f} %"
        )
        if not a["all_settled"]:
            print(
                f"        NOT REACHED within {a['gave_up_after']} s: {a['joined']} joined, {a['adopted']} adopted, "
                f"{a['quarantined']} quarantined, other states {a['other_states']}; the steady state is of those"
            )
        busiest = ", ".join(f"{t} {v:.0f}" for t, v in s["rows_by_table_per_second"].items())
        print(f"        rows/s by table: {busiest or 'none'}")
        print(
            f"        joined in {a['seconds_to_joined']} s; gateway RSS {s['gateway_rss_mb']} MB"
            f" ({s.get('gateway_kb_per_session')} KB a session), worker {s['worker_rss_mb']} MB"
        )
        print(
            f"        CPU seconds while adopting: {r['adoption_cpu_seconds']}, machine busy"
            f" {a.get('machine_busy_percent')} %"
        )
        bound = r.get("placed_to_bound")
        if bound:
            print(
                f"        placed -> bound: {bound['bound']}/{bound['reservations']} bound, p50 {bound['p50_ms']} ms, "
                f"p99 {bound['p99_ms']} ms, max {bound['max_ms']} ms (create itself p50 {bound['create_p50_ms']} ms; "
                f"states {bound['states']})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", default=NODES_DEFAULT, help=f"fleet sizes, comma-separated ({NODES_DEFAULT})")
    parser.add_argument("--settle", type=float, default=SETTLE_DEFAULT, help="seconds after adoption (default 20)")
    parser.add_argument("--window", type=float, default=WINDOW_DEFAULT, help="steady-state seconds (default 30)")
    parser.add_argument(
        "--adopt-timeout",
        type=float,
        default=ADOPT_TIMEOUT_DEFAULT,
        help="give up waiting for adoption after this many seconds from the sims' start (default 900)",
    )
    parser.add_argument(
        "--join-concurrency",
        type=int,
        default=JOIN_CONCURRENCY_DEFAULT,
        help=f"joins under way at once in each sim (default {JOIN_CONCURRENCY_DEFAULT}, as bcd sim's)",
    )
    parser.add_argument(
        "--reservations",
        type=int,
        default=0,
        help="after the window, make this many reservations one by one and time placed -> bound (default 0: none)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs and the sims' state (folder)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    try:
        sizes = [int(n) for n in args.nodes.split(",")]
    except ValueError:
        parser.error("--nodes: comma-separated whole numbers")
    if any(n < GATEWAYS for n in sizes):
        parser.error(f"--nodes: at least {GATEWAYS} (one per gateway)")
    raise_open_files(max(sizes) + SPARE_FILES)
    results = []
    for nodes in sizes:
        if args.keep:
            folder = Path(tempfile.mkdtemp(prefix="bc-fleet-"))
            say(f"{nodes} nodes: logs and state in {folder}")
            results.append(run_size(args, nodes, folder))
            continue
        with tempfile.TemporaryDirectory(prefix="bc-fleet-") as tmp:
            results.append(run_size(args, nodes, Path(tmp)))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        report(results)


if __name__ == "__main__":
    main()
