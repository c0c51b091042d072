"""How many node sessions one gateway process holds, and what they cost it: sessions held, the gateway's CPU, its
memory per session, its liveness writes per second, and how fast sessions open.

Figures (2 cores shared with other engineers' test runs; gateway at this branch's head unless said; "GC" is the
part of the gateway's CPU spent in the garbage collector; handshakes/s with the gateway's CPU per opening):

    command (python bench/gateway.py ...)       held  gateway CPU (GC)  RSS/sess.  writes/s  handshakes/s   load, busy
    (defaults: 1,000 sessions)                  1000     7.5 % (0.0)     100.3 KB      0.90   60 (8.0 ms)    5.1, 93 %
    --sessions 15000 --settle 150 --window 60  15000    48.8 % (0.0)     116.8 KB      0.62   82 (10.4 ms)   3.2, 95 %
      the same, another run                    15000    57.4 % (0.0)     116.2 KB      0.75   92 (9.4 ms)    1.1, 51 %
      the same, --gc-young 0 (Python's 700)    15000    55.5 % (13.6)    119.1 KB      0.67   56 (15.8 ms)   1.0, 46 %
    --sessions 15000, gc threshold 50,000 (*)  15000    33.0 % (0.0)     114.7 KB      0.87   122 (7.1 ms)   2.1, 31 %
      the same, Python's thresholds (*)        15000    42.2 % (11.0)    115.6 KB      0.77   98 (9.1 ms)    2.2, 36 %
    --sessions 2000 --loop asyncio              2000    13.4 % (0.0)     340.7 KB      0.90   58 (8.3 ms)    6.2, 96 %

    (*) before gc_young_threshold existed: the threshold set by the bench itself (50,000, 20, 100); 15 s settling,
        30 s window. Load: the 1-minute load average at the end of the window, and how busy the machine's two cores
        were over it (all processes: the gateway, the clients, PostgreSQL and anything else).

Reading them. Every run held every session it opened, with no session lost and liveness written for all of them in
the window (the database agrees). The gateway's CPU for the same work varied from run to run by more than the
changes measured (33-43 % at 15,000 sessions in the first hour of runs, 49-57 % later with the same code, the
clients' CPU rising with it): the cores are shared with other engineers' runs and, it seems, with work this machine
cannot see (its load average stayed low in some slow runs), so the low figures are the better estimate of the
code's own cost, and the GC column, which is measured directly, is the one to compare between code versions.
Against the issue's aim (15,000 sessions at <= 25 % of one core with 10 s heartbeats, <= 100 KB each, <= 2 liveness
writes/s): the sessions and the liveness writes meet it (one ``Edge.seen`` a flush, fewer than one a second);
the CPU does not (about a third of a core at best), nor the memory (about 115 KB a session at 15,000, 97-100 KB at
1,000-2,000; ``malloc_trim`` gives back next to nothing, so it is live memory). Where the CPU goes at 15,000
sessions (py-spy, 30 s of the window): about a third of it in uvloop's own C code (sockets, TLS, timers), about 30
% in the frame path in Python (h2, grpclib's streams, betterproto, the per-frame ``asyncio.timeout``), about 17 %
in the flush loop, whose statements take every session each pass (``revoked_among`` with 15,000 serials and
``dispatch_many`` with 15,000 pairs each second, the serials and ids dumped as arrays by psycopg in Python), and
about 5 % in grpclib's keepalive pings in the two minutes after the sessions open. The standard library's loop
costs about 340 KB a session (its 256 KiB TLS buffer), as DESIGN §12 says.

Three kinds of OS process, all on this machine:

- this one (the conductor): makes the control plane, joins the nodes, starts the others, measures, and reports;
- one gateway process: a control plane over the same PostgreSQL schema (``better_compute(...)``, no migrations,
  no worker roles, no notifier, so desired states are polled each flush: what ``better-compute serve --roles
  gateway`` builds without a notifier) and ``create_gateway(...).start(...)`` on uvloop (``--loop asyncio`` for
  the standard library's loop), with its own server certificate issued by the plane's CA for ``localhost``, as
  the gateway tests make it; ``GatewayOptions`` at their defaults but for the heartbeat interval (``--heartbeat``),
  its name and, as an experiment, ``gc_young_threshold`` (``--gc-young``; 0 leaves Python's 700);
- ``--clients`` client processes (uvloop), each holding its share of the sessions.

Nodes. Every simulated node is a real node: it joins through ``compute.gateway_services.join`` in the conductor (a
fresh P-256 key, its CSR, the token sealed to JoinService's key and bound to them, as ``bcd join`` does; 8
concurrent callers, one join token each), so it has a node record and a certificate from the plane's CA, and the
gateway's admission (``node_of``, ``Sessions.open``) takes it. The join is not part of the measurement, and nothing
is kept across runs: the schema ``bc_bench_gateway`` is dropped before and after.

Clients. One TLS connection per node (its certificate is its identity), made with the standard ``ssl`` module and
spoken to with the ``h2`` package's HTTP/2 state machine: a POST on ``/bcnode.v1.Node/Session`` with gRPC's
headers, and gRPC's framing (a 5-byte prefix per message) around the ``bettercompute_proto`` messages. A session
sends ``Hello``, reads ``Welcome``, answers the ``InventoryRequest`` with one small section (marked ``fake``: these
nodes have no hardware), and then sends a ``Heartbeat`` every interval ``Welcome`` gave it, the first one after a
random part of an interval so the beats spread out. No grpclib channel on this side: one per session costs more
than the gateway it measures. A client process opens its sessions ``--concurrency`` / ``--clients`` at a time.

Measurement, in order:

- RSS idle: the gateway's resident memory (``VmRSS`` of ``/proc/<pid>/status``) once it listens, before the first
  connection.
- Handshakes/s: all clients connect at once; the rate is the sessions opened (TLS handshake with the client
  certificate, ``Hello``, the gateway's admission with its statements, ``Welcome`` read by the client) over the
  wall time from the first connection to the last ``Welcome``. The gateway's CPU over that phase, divided by the
  sessions, is the cost of one opening.
- Then a settling time (``--settle``; one heartbeat interval and 5 s by default), so that every session has beaten
  and the opening's backlog is done. grpclib pings each connection one and two keepalive intervals (60 s) after
  it opened and then stops, as the gateway sends it no data (``max_pings_without_data`` is 2): 250 pings a
  second for two minutes after 15,000 sessions open, which is why the figures below waited 150 s.
- Steady state, over ``--window`` seconds: the gateway's CPU time (``utime`` + ``stime`` of ``/proc/<pid>/stat``,
  every thread of that process and nothing else) over the wall time, as a percentage of one core; the clients'
  CPU the same way, reported apart; the machine's busy share from ``/proc/stat`` and the load average, since the
  two cores are shared with whatever else runs. Of the gateway's CPU, the time in the garbage collector is
  measured apart, by generation (``gc.callbacks`` around each collection, timed by ``time.thread_time``).
- Liveness writes/s: every statement the gateway process sends is counted by a wrapper around psycopg's
  ``AsyncCursor.execute`` installed in that process (the store sends every statement through it), by its text; the
  liveness writes are the ``Edge.seen`` statements over the window. The other statements of the window (the
  flush loop's revocation check, command dispatch and desired-state reads) are reported beside it, with the wall
  time each took from send to result.
- Sessions held, at the end of the window, three ways: the gateway's own count, the clients' count of sessions
  that got ``Welcome`` and were neither closed nor cut, and the database's count of the gateway's open sessions
  whose ``last_seen_at`` advanced during the window (proof that liveness is really written for each of them).
- RSS per session: (RSS at the end of the window - RSS idle) / sessions held by the gateway.
- With ``--reports-every N``, a second window after the first: each session also sends an inventory section signed
  by its node key every ``N`` heartbeats (``N`` = 6 is once a minute at 10 s heartbeats), which the gateway checks
  against the session's key and writes with its signature, as it does every signed fact; one heartbeat's settling
  first. Its gateway CPU a session a minute beside the first window's is what signed reports cost at that rate
  (``with_signed_reports`` in ``--json``).

Then every process is killed and the schema dropped: the bench does not wait for the gateway to close thousands of
sessions one by one. ``--census`` also prints, after the figures, the objects the collector tracks in the gateway
by type (idle and held, per session) and its RSS after ``malloc_trim(0)`` (how much of it is free heap).

Limits. One file descriptor per session in the gateway, and one per session in its client process: every process
raises its open-files limit to what it needs (the soft limit up to the hard one; as root, the hard one too). The
hard limit here is 20,000, enough for 15,000 sessions without root; past it, run as root or raise ``ulimit -Hn``.
Loopback connections come from one address, so the ephemeral port range (``net.ipv4.ip_local_port_range``, about
28,000 ports here) caps the sessions too.

    python bench/gateway.py                      # 1,000 sessions; BETTERCOMPUTE_DATABASE_URL, else
                                                 # postgresql://postgres@127.0.0.1:5432/test
    python bench/gateway.py --sessions 15000 --settle 150 --window 60 --json

Takes about a minute with the defaults, joins included (joining runs at 200-350 a second), and about 7 minutes
for the 15,000-session line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import psycopg

from bench._gateway_parts import (
    GATEWAY_NAME,
    OPEN_TIMEOUT,
    SCHEMA,
    SPARE_FILES,
    URL,
    Node,
    drop_schema,
    open_plane,
    raise_open_files,
)
from bench._gateway_roles import run_role
from bench._procfs import cpu_seconds, load_average, machine_ticks, rss_bytes
from bettercompute.modules.nodes import JOIN_KEYS, CreatedJoinToken, CreateJoinTokenInput
from bettercompute.modules.pools import CreatePoolInput, Pool
from bettercompute_daemon.identity import NodeKey, join_binding, seal_token
from bettercompute_gateway import GatewayOptions
from bettercompute_iam import CreateTenantInput, EmbeddedIam, IamGroups
from bettercompute_store_pg import PgStore

SESSIONS_DEFAULT = 1000
HEARTBEAT_DEFAULT = 10.0
WINDOW_DEFAULT = 30.0
CLIENTS_DEFAULT = 2
CONCURRENCY_DEFAULT = 64  # sessions being opened at once, all client processes together
JOIN_CALLERS = 8
SETTLE_EXTRA = 5.0  # seconds after the opening, beyond one heartbeat interval, before the window starts

log = logging.getLogger("bench.gateway")


# --- the nodes --------------------------------------------------------------------------------------------------


async def join_nodes(folder: Path, count: int) -> tuple[list[Node], float]:
    """Join ``count`` nodes as ``bcd join`` would (see the docstring); the nodes, and the joins per second."""
    pems = folder / "nodes"
    pems.mkdir()
    async with open_plane(folder, pool_size=JOIN_CALLERS, instance="bench-conductor", migrate=True) as compute:
        store = compute.options.store
        iam = compute.options.iam
        assert isinstance(store, PgStore) and isinstance(iam, EmbeddedIam)
        boot = await iam.bootstrap()
        assert boot.credential is not None
        root = boot.credential
        tenant = (await IamGroups(compute.api).tenants.create(root, CreateTenantInput(name="bench"))).id
        pool: Pool = await compute.api.pools.create(root, CreatePoolInput(tenant=tenant, name="gpus"))
        join_key = await store.repository(JOIN_KEYS).active()
        assert join_key is not None
        callers = min(JOIN_CALLERS, count)
        shares = [range(c, count, callers) for c in range(callers)]
        nodes: list[Node | None] = [None] * count
        services = compute.gateway_services
        done = 0

        async def caller(share: range) -> None:
            nonlocal done
            created: CreatedJoinToken = await compute.api.join_tokens.create(
                root, CreateJoinTokenInput(pool_id=pool.id, uses=len(share), expires_in_seconds=3600)
            )
            for n in share:
                key = NodeKey()
                csr_pem = key.csr_pem(f"bench-{n}")
                claims = {"hostname": f"bench-{n}", "serial": f"SN-BENCH-{n:06d}", "product": "bench"}
                sealed = seal_token(join_key.public_key, created.token, binding=join_binding(csr_pem, claims))
                result = await services.join(sealed_token=sealed, csr_pem=csr_pem, claims=claims)
                path = pems / f"{n}.pem"
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as file:
                    file.write(key.private_key_pem() + b"\n" + (result.certificate_pem + result.chain_pem).encode())
                nodes[n] = Node(node_id=result.node_id, pem_path=str(path))
                done += 1
                if done % 1000 == 0:
                    print(f"  joined {done}/{count}", file=sys.stderr, flush=True)

        started = time.perf_counter()
        await asyncio.gather(*(caller(share) for share in shares))
        rate = count / (time.perf_counter() - started)
        (folder / "bundle.pem").write_text(await services.trust_bundle_pem())
    return [n for n in nodes if n is not None], rate


# --- the conductor (the gateway and client processes: bench/_gateway_roles.py) -------------


@attrs.define(kw_only=True)
class Child:
    """A child process spoken to in JSON lines."""

    process: asyncio.subprocess.Process
    name: str

    @classmethod
    async def start(cls, name: str, role: str, config: Mapping[str, Any], folder: Path) -> Child:
        path = folder / f"{name}.json"
        path.write_text(json.dumps(config))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--role",
            role,
            "--config",
            str(path),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 24,
        )
        return cls(process=process, name=name)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def read(self, within: float) -> dict[str, Any]:
        """The process's next line, which must come ``within`` seconds."""
        assert self.process.stdout is not None
        try:
            async with asyncio.timeout(within):
                line = await self.process.stdout.readline()
        except TimeoutError:
            raise SystemExit(f"the {self.name} process said nothing for {within:.0f} s") from None
        if not line:
            raise SystemExit(f"the {self.name} process ended (exit {await self.process.wait()}): see its stderr")
        value: dict[str, Any] = json.loads(line)
        return value

    async def ask(self, command: str, within: float = 30.0) -> dict[str, Any]:
        """Send ``command``; the answer, which must come ``within`` seconds."""
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        await self.process.stdin.drain()
        return await self.read(within)

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


@attrs.frozen(kw_only=True)
class Sample:
    """What is read at one instant: CPU seconds of the gateway and of the clients, the machine's ticks."""

    at: float
    gateway_cpu: float
    clients_cpu: float
    machine_busy: int
    machine_total: int

    @classmethod
    def take(cls, gateway: Child, clients: Sequence[Child]) -> Sample:
        busy, total = machine_ticks()
        return cls(
            at=time.perf_counter(),
            gateway_cpu=cpu_seconds(gateway.pid),
            clients_cpu=sum(cpu_seconds(c.pid) for c in clients),
            machine_busy=busy,
            machine_total=total,
        )


async def trace(gateway: Child, clients: Sequence[Child], start: Sample, seconds: float, phase: str) -> None:
    """Wait ``seconds``, printing the gateway's and the clients' CPU every 10 s of it (stderr), so that a drift
    within the window shows."""
    deadline = start.at + seconds
    last = start
    while (left := deadline - time.perf_counter()) > 0:
        await asyncio.sleep(min(10.0, left))
        now = Sample.take(gateway, clients)
        span = now.at - last.at
        print(
            f"  {phase} +{now.at - start.at:3.0f} s: gateway {100 * (now.gateway_cpu - last.gateway_cpu) / span:5.1f}"
            f" %, clients {100 * (now.clients_cpu - last.clients_cpu) / span:5.1f} %, load {load_average():.2f}",
            file=sys.stderr,
            flush=True,
        )
        last = now


@attrs.frozen(kw_only=True)
class Started:
    """The processes started, and what was read of the gateway before any session."""

    gateway: Child
    clients: list[Child]
    rss_idle: int
    census_idle: dict[str, Any] | None


@attrs.frozen(kw_only=True)
class Opening:
    """How the sessions opened: how many, why some did not, over how long, and the gateway's CPU around it."""

    opened: int
    failed: dict[str, int]
    seconds: float
    before: Sample
    after: Sample


@attrs.frozen(kw_only=True)
class Window:
    """What was read around the steady-state window."""

    settle: float
    start: Sample
    end: Sample
    load: tuple[float, float]
    gateway_start: dict[str, Any]
    gateway_end: dict[str, Any]
    heartbeats_start: int
    rss_held: int
    census_held: dict[str, Any] | None
    clients: list[dict[str, Any]]
    db_open: int
    db_seen: int


async def start_children(
    args: argparse.Namespace, folder: Path, nodes: Sequence[Node], children: list[Child]
) -> Started:
    """Start the gateway process, read its idle memory, then start the client processes with their shares of the
    nodes; each child is put in ``children`` as soon as it runs (the caller kills them)."""
    gateway_config = {
        "folder": str(folder),
        "heartbeat": args.heartbeat,
        "loop": args.loop,
        "gc_young": args.gc_young,
        "files": args.sessions + SPARE_FILES,
    }
    gateway = await Child.start("gateway", "gateway", gateway_config, folder)
    children.append(gateway)
    port = (await gateway.read(60))["port"]
    await asyncio.sleep(1.0)
    rss_idle = rss_bytes(gateway.pid)
    census_idle = (await gateway.ask("census")) if args.census else None
    clients = []
    for c in range(args.clients):
        share = nodes[c :: args.clients]
        client_config = {
            "port": port,
            "bundle": (folder / "bundle.pem").read_text(),
            "concurrency": max(1, args.concurrency // args.clients),
            "nodes": [attrs.asdict(n) for n in share],
        }
        client = await Child.start(f"client-{c}", "client", client_config, folder)
        children.append(client)
        clients.append(client)
    for client in clients:
        await client.read(300)
    return Started(gateway=gateway, clients=clients, rss_idle=rss_idle, census_idle=census_idle)


async def open_sessions(started: Started) -> Opening:
    """All clients open their sessions at once; how that went."""
    gateway, clients = started.gateway, started.clients
    before = Sample.take(gateway, clients)
    opened = await asyncio.gather(*(c.ask("connect", within=OPEN_TIMEOUT + 600) for c in clients))
    after = Sample.take(gateway, clients)
    failed: collections.Counter[str] = collections.Counter()
    for o in opened:
        failed.update(o["failed"])
    return Opening(
        opened=sum(o["opened"] for o in opened),
        failed=dict(failed),
        seconds=max(o["finished"] for o in opened) - min(o["started"] for o in opened),
        before=before,
        after=after,
    )


def database_now() -> dt.datetime:
    with psycopg.connect(URL, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        now: dt.datetime = row[0]
        return now


def sessions_seen(since: dt.datetime) -> tuple[int, int]:
    """The gateway's open sessions in the database, and how many of them were seen ``since``."""
    with psycopg.connect(URL, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT count(*) FILTER (WHERE closed_at IS NULL), count(*) FILTER (WHERE closed_at IS NULL AND "
            f'last_seen_at >= %s) FROM "{SCHEMA}".sessions WHERE gateway = %s',
            (since, GATEWAY_NAME),
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def measure_window(args: argparse.Namespace, started: Started) -> Window:
    """Settle, then measure the steady state over ``--window`` seconds."""
    gateway, clients = started.gateway, started.clients
    settle = args.settle if args.settle is not None else args.heartbeat + SETTLE_EXTRA
    print(f"settling for {settle:.0f} s, then measuring for {args.window:.0f} s ...", file=sys.stderr, flush=True)
    await trace(gateway, clients, Sample.take(gateway, clients), settle, "settling")
    window_start_db = database_now()
    gateway_start = await gateway.ask("stats")
    heartbeats_start = sum([(await c.ask("stats"))["heartbeats"] for c in clients])
    load_start = load_average()
    start = Sample.take(gateway, clients)
    await trace(gateway, clients, start, args.window, "window")
    end = Sample.take(gateway, clients)
    load_end = load_average()
    gateway_end = await gateway.ask("stats")
    rss_held = rss_bytes(gateway.pid)
    census_held = (await gateway.ask("census", within=300)) if args.census else None
    if census_held is not None:  # after the figures: how much RSS the allocator holds free (changes the process)
        trimmed = (await gateway.ask("trim", within=300))["rss"]
        print(
            f"RSS after malloc_trim(0): {trimmed / 2**20:.1f} MB "
            f"({(trimmed - started.rss_idle) / max(1, int(census_held['sessions'])) / 1024:.1f} KB a session)",
            file=sys.stderr,
        )
    client_stats = [await c.ask("stats") for c in clients]
    db_open, db_seen = sessions_seen(window_start_db)
    return Window(
        settle=settle,
        start=start,
        end=end,
        load=(load_start, load_end),
        gateway_start=gateway_start,
        gateway_end=gateway_end,
        heartbeats_start=heartbeats_start,
        rss_held=rss_held,
        census_held=census_held,
        clients=client_stats,
        db_open=db_open,
        db_seen=db_seen,
    )


async def conduct(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Join the nodes, start the processes, measure; the figures."""
    print(f"joining {args.sessions} nodes ...", file=sys.stderr, flush=True)
    nodes, join_rate = await join_nodes(folder, args.sessions)
    children: list[Child] = []
    try:
        started = await start_children(args, folder, nodes, children)
        print(f"opening {args.sessions} sessions ...", file=sys.stderr, flush=True)
        opening = await open_sessions(started)
        window = await measure_window(args, started)
        reports = await measure_reports(args, started) if args.reports_every else None
    finally:
        for child in reversed(children):
            await child.kill()
    held = int(window.gateway_end["sessions"])
    if started.census_idle is not None and window.census_held is not None:
        print_census(started.census_idle, window.census_held, held)
    made = figures(args, join_rate, started, opening, window)
    if reports is not None:
        made["with_signed_reports"] = reports
    return made


async def measure_reports(args: argparse.Namespace, started: Started) -> dict[str, Any]:
    """The same sessions, now each also sending an inventory section signed by its node key every
    ``--reports-every`` heartbeats (once a minute by default at 10 s heartbeats: a node reports at session start and
    acknowledges each new desired state, which is far less often in steady state): settle one heartbeat, then a
    second window of the same length. Its gateway CPU beside the first window's is the cost of signed reports."""
    gateway, clients = started.gateway, started.clients
    for client in clients:
        await client.ask(f"reports {args.reports_every}")
    settle = args.heartbeat + SETTLE_EXTRA
    print(
        f"signed reports on; settling for {settle:.0f} s, then measuring for {args.window:.0f} s ...", file=sys.stderr
    )
    await trace(gateway, clients, Sample.take(gateway, clients), settle, "settling (reports)")
    reports_start = sum([(await c.ask("stats"))["reports"] for c in clients])
    gateway_start = await gateway.ask("stats")
    start = Sample.take(gateway, clients)
    await trace(gateway, clients, start, args.window, "window (reports)")
    end = Sample.take(gateway, clients)
    gateway_end = await gateway.ask("stats")
    reports_end = sum([(await c.ask("stats"))["reports"] for c in clients])
    seconds = end.at - start.at
    held = int(gateway_end["sessions"])
    cpu = 100 * (end.gateway_cpu - start.gateway_cpu) / seconds
    machine = (end.machine_busy - start.machine_busy) / (end.machine_total - start.machine_total)
    counts_start, counts_end = gateway_start["statements"], gateway_end["statements"]
    return {
        "window_s": round(seconds, 1),
        "sessions_held": held,
        "reports_per_s": round((reports_end - reports_start) / seconds, 1),
        "reports_per_session_minute": round((reports_end - reports_start) / seconds * 60 / max(1, held), 2),
        "gateway_cpu_percent": round(cpu, 1),
        "gateway_cpu_ms_per_session_minute": round(cpu / 100 * 60_000 / max(1, held), 2),
        "machine_busy_percent_of_all_cores": round(100 * machine, 1),
        "statements_per_s": {
            k: round((v - counts_start.get(k, 0)) / seconds, 2)
            for k, v in sorted(counts_end.items())
            if v > counts_start.get(k, 0)
        },
    }


def print_census(idle: Mapping[str, Any], held: Mapping[str, Any], sessions: int) -> None:
    """The objects the collector tracks in the gateway, idle and held, per session (stderr)."""
    idle_types = dict(idle["top"])
    print(
        f"objects the collector tracks: {idle['objects']} idle, {held['objects']} held "
        f"({(held['objects'] - idle['objects']) / max(1, sessions):.0f} a session); the most held:",
        file=sys.stderr,
    )
    for name, count in held["top"]:
        print(f"  {(count - idle_types.get(name, 0)) / max(1, sessions):8.1f} a session  {name}", file=sys.stderr)


def statement_figures(window: Window, seconds: float) -> tuple[dict[str, float], dict[str, float]]:
    """Each statement's rate over the window (per second), and the wall time each took on average (ms)."""
    counts_start, counts_end = window.gateway_start["statements"], window.gateway_end["statements"]
    wall_start = window.gateway_start["statement_seconds"]
    rates = {label: (count - counts_start.get(label, 0)) / seconds for label, count in counts_end.items()}
    wall_ms = {
        label: round(1000 * (total - wall_start.get(label, 0.0)) / made, 1)
        for label, total in window.gateway_end["statement_seconds"].items()
        if (made := counts_end[label] - counts_start.get(label, 0)) > 0
    }
    return rates, wall_ms


def figures(
    args: argparse.Namespace, join_rate: float, started: Started, opening: Opening, window: Window
) -> dict[str, Any]:
    """The figures of a run, as ``--json`` prints them."""
    start, end = window.start, window.end
    seconds = end.at - start.at
    statements, statement_ms = statement_figures(window, seconds)
    held = int(window.gateway_end["sessions"])
    ended: collections.Counter[str] = collections.Counter()
    for s in window.clients:
        ended.update(s["ended"])
    machine = (end.machine_busy - start.machine_busy) / (end.machine_total - start.machine_total)
    gc_start, gc_end = window.gateway_start, window.gateway_end
    return {
        "sessions_asked": args.sessions,
        "heartbeat_s": args.heartbeat,
        "window_s": round(seconds, 1),
        "settle_s": window.settle,
        "loop": args.loop,
        "gc_young_threshold": GatewayOptions().gc_young_threshold if args.gc_young is None else args.gc_young or None,
        "clients": args.clients,
        "joins_per_s": round(join_rate, 1),
        "sessions_held": {
            "gateway": held,
            "clients": sum(s["alive"] for s in window.clients),
            "database_open": window.db_open,
            "database_seen_in_window": window.db_seen,
        },
        "open": {
            "opened": opening.opened,
            "failed": opening.failed,
            "seconds": round(opening.seconds, 2),
            "handshakes_per_s": round(opening.opened / opening.seconds, 1) if opening.seconds > 0 else None,
            "gateway_cpu_ms_per_open": round(
                1000 * (opening.after.gateway_cpu - opening.before.gateway_cpu) / max(1, opening.opened), 2
            ),
        },
        "gateway_cpu_percent": round(100 * (end.gateway_cpu - start.gateway_cpu) / seconds, 1),
        "clients_cpu_percent": round(100 * (end.clients_cpu - start.clients_cpu) / seconds, 1),
        "machine_busy_percent_of_all_cores": round(100 * machine, 1),
        "cores": os.cpu_count(),
        "load_average_1m": list(window.load),
        "rss_idle_mb": round(started.rss_idle / 2**20, 1),
        "rss_held_mb": round(window.rss_held / 2**20, 1),
        "rss_per_session_kb": round((window.rss_held - started.rss_idle) / max(1, held) / 1024, 1),
        "gateway_gc_percent_by_generation": [
            round(100 * (b - a) / seconds, 1) for a, b in zip(gc_start["gc_seconds"], gc_end["gc_seconds"], strict=True)
        ],
        "gateway_gc_runs_per_s_by_generation": [
            round((b - a) / seconds, 2) for a, b in zip(gc_start["gc_runs"], gc_end["gc_runs"], strict=True)
        ],
        "liveness_writes_per_s": round(statements.get("Edge.seen", 0.0), 2),
        "statements_per_s": {k: round(v, 2) for k, v in sorted(statements.items()) if v > 0},
        "statement_ms": dict(sorted(statement_ms.items())),
        "heartbeats_per_s": round(
            (sum(s["heartbeats"] for s in window.clients) - window.heartbeats_start) / seconds, 1
        ),
        "ended_during_run": dict(ended),
    }


def report(figures: Mapping[str, Any]) -> None:
    held = figures["sessions_held"]
    opening = figures["open"]
    print(
        f"one gateway process ({figures['loop']}), {figures['sessions_asked']} simulated nodes over mutual TLS from "
        f"{figures['clients']} client processes, heartbeats every {figures['heartbeat_s']:g} s, "
        f"steady-state window {figures['window_s']:g} s"
    )
    rows = [
        (
            "sessions held",
            f"{held['gateway']}",
            f"clients {held['clients']}, database: {held['database_open']} open, "
            f"{held['database_seen_in_window']} seen in the window",
        ),
        (
            "gateway CPU",
            f"{figures['gateway_cpu_percent']:.1f} %",
            "of one core, steady state; of which garbage collection "
            + " + ".join(f"{p:.1f}" for p in figures["gateway_gc_percent_by_generation"])
            + " (generations 0, 1, 2)",
        ),
        (
            "RSS per session",
            f"{figures['rss_per_session_kb']:.1f} KB",
            f"({figures['rss_held_mb']:.1f} MB held - {figures['rss_idle_mb']:.1f} MB idle) / sessions held",
        ),
        (
            "liveness writes/s",
            f"{figures['liveness_writes_per_s']:.2f}",
            "Edge.seen statements; all, per second (ms each): "
            + ", ".join(
                f"{k} {v:.2f} ({figures['statement_ms'].get(k, 0):.0f})" for k, v in figures["statements_per_s"].items()
            ),
        ),
        (
            "handshakes/s",
            f"{opening['handshakes_per_s']}",
            f"{opening['opened']} opened in {opening['seconds']:.1f} s, {opening['gateway_cpu_ms_per_open']:.2f} ms "
            f"of gateway CPU each; failed: {opening['failed'] or 'none'}",
        ),
        (
            "load during the window",
            f"{figures['load_average_1m'][1]:.2f}",
            f"1-min load average (was {figures['load_average_1m'][0]:.2f}); machine busy "
            f"{figures['machine_busy_percent_of_all_cores']:.0f} % of {figures['cores']} cores; clients' CPU "
            f"{figures['clients_cpu_percent']:.1f} % of one core",
        ),
    ]
    for name, value, note in rows:
        print(f"  {name:<24} {value:>10}   {note}")
    print(
        f"  heartbeats {figures['heartbeats_per_s']:.0f}/s; sessions ended during the run: "
        f"{figures['ended_during_run'] or 'none'}; joins (setup, not measured) {figures['joins_per_s']:.0f}/s"
    )
    print("  aim (issue 11): 15,000 sessions at <= 25 % of one core, <= 100 KB each, <= 2 liveness writes/s")
    reports = figures.get("with_signed_reports")
    if reports is not None:
        base = figures["gateway_cpu_percent"] / 100 * 60_000 / max(1, held["gateway"])
        print(
            f"  with signed reports      {reports['gateway_cpu_ms_per_session_minute']:>7.2f} ms   gateway CPU a"
            f" session a minute ({base:.2f} without: x"
            f"{reports['gateway_cpu_ms_per_session_minute'] / max(base, 1e-9):.2f});"
            f" {reports['reports_per_s']:.0f} signed sections/s; machine busy"
            f" {reports['machine_busy_percent_of_all_cores']:.0f} %"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=SESSIONS_DEFAULT, help=f"default {SESSIONS_DEFAULT}")
    parser.add_argument("--heartbeat", type=float, default=HEARTBEAT_DEFAULT, help="seconds (default 10)")
    parser.add_argument("--window", type=float, default=WINDOW_DEFAULT, help="steady-state seconds (default 30)")
    parser.add_argument(
        "--settle", type=float, help="seconds between the last session opened and the window (default: heartbeat + 5)"
    )
    parser.add_argument("--clients", type=int, default=CLIENTS_DEFAULT, help="client processes (default 2)")
    parser.add_argument(
        "--concurrency", type=int, default=CONCURRENCY_DEFAULT, help="sessions opened at once, all clients (64)"
    )
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="the gateway's event loop")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--reports-every",
        type=int,
        default=0,
        help="then a second window in which each session also sends a signed inventory section every this many "
        "heartbeats (the cost of signed reports; 0, the default, skips it)",
    )
    parser.add_argument(
        "--gc-young",
        type=int,
        help="an experiment: the gateway's gc_young_threshold (default: the gateway's own; 0: Python's, untouched)",
    )
    parser.add_argument(
        "--census", action="store_true", help="also count the gateway's objects by type, idle and held (stderr)"
    )
    parser.add_argument("--role", choices=["gateway", "client"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role is not None:
        run_role(args.role, args.config)
        return
    if args.sessions < 1 or args.clients < 1 or args.heartbeat <= 0 or args.window <= 0 or args.concurrency < 1:
        parser.error("need --sessions, --clients and --concurrency >= 1, and --heartbeat and --window > 0")
    raise_open_files(SPARE_FILES)
    drop_schema()
    try:
        with tempfile.TemporaryDirectory(prefix="bc-bench-gateway-") as folder:
            figures = asyncio.run(conduct(args, Path(folder)))
    finally:
        drop_schema()
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        report(figures)


if __name__ == "__main__":
    main()
