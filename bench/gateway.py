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
writes/s): the sessions and the liveness writes meet it (one ``Sessions.seen`` a flush, fewer than one a second);
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
  liveness writes are the ``Sessions.seen`` statements over the window. The other statements of the window (the
  flush loop's revocation check, command dispatch and desired-state reads) are reported beside it, with the wall
  time each took from send to result.
- Sessions held, at the end of the window, three ways: the gateway's own count, the clients' count of sessions
  that got ``Welcome`` and were neither closed nor cut, and the database's count of the gateway's open sessions
  whose ``last_seen_at`` advanced during the window (proof that liveness is really written for each of them).
- RSS per session: (RSS at the end of the window - RSS idle) / sessions held by the gateway.

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
import contextlib
import ctypes
import datetime as dt
import gc
import json
import logging
import os
import random
import resource
import ssl
import struct
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import attrs
import betterproto2
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import psycopg
import uvloop

import bettercompute_proto as wire
from bettercompute import BetterCompute, JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute.modules.commands import COMMANDS, SESSIONS
from bettercompute.modules.nodes import CERTIFICATES, JOIN_KEYS, NODES, CreatedJoinToken, CreateJoinTokenInput
from bettercompute.modules.pools import CreatePoolInput, Pool
from bettercompute.ports import Repository
from bettercompute_daemon.identity import NodeKey, join_binding, seal_token
from bettercompute_gateway import GatewayOptions, create_gateway, issue_tls
from bettercompute_iam import CreateTenantInput, EmbeddedIam, IamGroups
from bettercompute_store_pg import PgStore

URL = os.environ.get("BETTERCOMPUTE_DATABASE_URL", "").strip() or "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = "bc_bench_gateway"
TRUST_DOMAIN = "bench.example.test"
GATEWAY_NAME = "bench-gw"
SERVER_NAME = "localhost"  # the name clients check the gateway's certificate for
SESSIONS_DEFAULT = 1000
HEARTBEAT_DEFAULT = 10.0
WINDOW_DEFAULT = 30.0
CLIENTS_DEFAULT = 2
CONCURRENCY_DEFAULT = 64  # sessions being opened at once, all client processes together
JOIN_CALLERS = 8
SETTLE_EXTRA = 5.0  # seconds after the opening, beyond one heartbeat interval, before the window starts
OPEN_TIMEOUT = 120.0  # a session that has no Welcome by then counts as failed
SPARE_FILES = 1024  # file descriptors beyond one per session (the database pool, the loop, stdio, libraries)
SESSION_PATH = f"/{wire.SERVICE}/Session"
INVENTORY = json.dumps({"cores": 64, "model": "bench"}, separators=(",", ":"))

log = logging.getLogger("bench.gateway")


# --- small things -----------------------------------------------------------------------------------------------


def raise_open_files(needed: int) -> None:
    """Make ``needed`` file descriptors available to this process, or stop with what to do about it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))  # allowed as root
            return
        except (ValueError, OSError):
            raise SystemExit(
                f"{needed} open files are needed and the hard limit is {hard}: run as root, or raise it "
                f"(ulimit -Hn {needed}), or ask for fewer sessions"
            ) from None
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) a process has used so far, every thread of it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime 14 and stime 15 (1-based, as proc(5) counts them).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, every core."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def drop_schema() -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


def plane_options(folder: Path, *, pool_size: int, instance: str) -> Options:
    """The control plane's options, the same in the conductor and the gateway process (the KMS key file is
    shared, so both can read the CA's key)."""
    return Options(
        store=PgStore(URL, schema=SCHEMA, pool_size=pool_size),
        iam=EmbeddedIam(),
        instance=instance,
        kms=LocalKeyKms(folder / "kms.key"),
        join=JoinSettings(gateway_address=f"{SERVER_NAME}:443", trust_domain=TRUST_DOMAIN),
    )


@contextlib.asynccontextmanager
async def open_plane(folder: Path, *, pool_size: int, instance: str, migrate: bool) -> AsyncIterator[BetterCompute]:
    compute = better_compute(plane_options(folder, pool_size=pool_size, instance=instance))
    await compute.initialize(migrate=migrate)
    try:
        yield compute
    finally:
        await compute.close()


# --- the nodes --------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Node:
    """A joined node: its id, and the file holding its private key and certificate (PEM, mode 0600)."""

    node_id: str
    pem_path: str


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
                    file.write(key.private_key_pem() + b"\n" + result.certificate_pem.encode())
                nodes[n] = Node(node_id=result.node_id, pem_path=str(path))
                done += 1
                if done % 1000 == 0:
                    print(f"  joined {done}/{count}", file=sys.stderr, flush=True)

        started = time.perf_counter()
        await asyncio.gather(*(caller(share) for share in shares))
        rate = count / (time.perf_counter() - started)
        (folder / "bundle.pem").write_text(await services.trust_bundle_pem())
    return [n for n in nodes if n is not None], rate


# --- the gateway process ----------------------------------------------------------------------------------------


class StatementCounter:
    """Counts every statement this process sends, by its text: wraps psycopg's ``AsyncCursor.execute``, which the
    store sends each statement through (on its own, in a transaction or in a pipeline)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)  # send to result, summed

    def install(self) -> None:
        original = psycopg.AsyncCursor.execute
        counts, seconds = self.counts, self.seconds

        async def counted(cursor: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            text = query if isinstance(query, str) else repr(query)
            counts[text] += 1
            started = time.perf_counter()
            try:
                return await original(cursor, query, params, **kwargs)
            finally:
                seconds[text] += time.perf_counter() - started

        psycopg.AsyncCursor.execute = counted  # type: ignore[assignment,method-assign]


class GcClock:
    """The CPU time this process's main thread spends in the garbage collector, by generation (``gc.callbacks``
    around each collection, timed by ``time.thread_time``, so that being preempted on a busy machine is not
    counted)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.runs = [0, 0, 0]
        self._started = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: Mapping[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            generation = int(info["generation"])
            self.seconds[generation] += time.thread_time() - self._started
            self.runs[generation] += 1


FLUSH_STATEMENTS: list[tuple[Repository[Any], str, str]] = [
    (SESSIONS, "_seen", "Sessions.seen"),
    (CERTIFICATES, "_revoked_among", "Certificates.revoked_among"),
    (COMMANDS, "_dispatch_many", "Commands.dispatch_many"),
    (NODES, "_desired_since", "Nodes.desired_since"),
    (NODES, "_desired_newer", "Nodes.desired_newer"),
]


async def run_gateway(config: Mapping[str, Any]) -> None:
    """The gateway process: say its port on stdout, then answer ``stats`` lines on stdin until stdin closes."""
    counter = StatementCounter()
    counter.install()
    gc_clock = GcClock()
    gc_clock.install()
    folder = Path(config["folder"])
    async with open_plane(folder, pool_size=10, instance=GATEWAY_NAME, migrate=False) as compute:
        store = compute.options.store
        assert store is not None
        services = compute.gateway_services
        tls, _ = await issue_tls(services, name=GATEWAY_NAME, hosts=["127.0.0.1", SERVER_NAME])
        options = GatewayOptions(name=GATEWAY_NAME, heartbeat_interval=float(config["heartbeat"]))
        if config["gc_young"] is not None:
            options = attrs.evolve(options, gc_young_threshold=config["gc_young"] or None)
        gateway = create_gateway(services, store, tls, options)
        # The flush loop's statements get their repository method's name (read from the store's own statements);
        # any other statement is named by its first words.
        labels: dict[str, str] = {}
        for repository, attribute, label in FLUSH_STATEMENTS:
            statement = getattr(store.repository(repository), attribute, None)
            if statement is not None:
                labels[statement.query] = label
        port = await gateway.start("127.0.0.1", 0)
        reply({"port": port, "loop": type(asyncio.get_running_loop()).__module__})
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        try:
            while line := await reader.readline():
                if line.strip() == b"census":  # not part of the figures: what the collector tracks, by type
                    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
                    top = types.most_common(40)
                    reply({"objects": sum(types.values()), "top": top, "sessions": len(gateway.sessions)})
                elif line.strip() == b"trim":  # not part of the figures: give free heap back to the system
                    ctypes.CDLL("libc.so.6").malloc_trim(0)
                    reply({"rss": rss_bytes(os.getpid())})
                elif line.strip() == b"stats":
                    by_label: collections.Counter[str] = collections.Counter()
                    wall: collections.defaultdict[str, float] = collections.defaultdict(float)
                    for query, count in counter.counts.items():
                        label = labels.get(query) or " ".join(query.split())[:40]
                        by_label[label] += count
                        wall[label] += counter.seconds[query]
                    reply(
                        {
                            "sessions": len(gateway.sessions),
                            "statements": dict(by_label),
                            "statement_seconds": dict(wall),
                            "gc_seconds": gc_clock.seconds,
                            "gc_runs": gc_clock.runs,
                        }
                    )
        finally:
            await gateway.close()


def reply(message: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


# --- the client processes ---------------------------------------------------------------------------------------


@attrs.define(eq=False)
class ClientStats:
    opened: int = 0
    heartbeats: int = 0
    failed: collections.Counter[str] = attrs.field(factory=collections.Counter)  # why a session did not open
    ended: collections.Counter[str] = attrs.field(factory=collections.Counter)  # why an open session ended
    alive: set[NodeSession] = attrs.field(factory=set)


class NodeSession(asyncio.Protocol):
    """One node's session over its own TLS connection: HTTP/2 by ``h2``, gRPC framing by hand (see the docstring)."""

    def __init__(self, node_id: str, authority: str, stats: ClientStats) -> None:
        self.node_id = node_id
        self.authority = authority
        self.stats = stats
        self.welcomed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.welcomed.add_done_callback(_retrieved)  # a connection that failed early is counted, not logged
        self.transport: asyncio.Transport | None = None
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.buffer = bytearray()
        self.interval = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.ended: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TLS transport is no asyncio.Transport
        conn = self.conn
        conn.initiate_connection()
        headers = [
            (":method", "POST"),
            (":scheme", "https"),
            (":path", SESSION_PATH),
            (":authority", self.authority),
            ("content-type", "application/grpc+proto"),
            ("te", "trailers"),
        ]
        conn.send_headers(1, headers)
        hello = wire.Hello(node_id=self.node_id, session_nonce=os.urandom(16), software_version="bench")
        self.send(wire.NodeFrame(hello=hello))

    def send(self, frame: wire.NodeFrame) -> None:
        if self.ended is not None or self.transport is None:
            return
        body = bytes(frame)
        try:
            self.conn.send_data(1, struct.pack(">?I", False, len(body)) + body)
        except h2.exceptions.H2Error as exc:  # the gateway stopped reading (its window is full): say so
            self.end(f"send: {type(exc).__name__}")
            return
        self.transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.H2Error as exc:
            self.end(f"http2: {type(exc).__name__}")
            return
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                if event.flow_controlled_length:
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                self.buffer += event.data or b""
                self.take_frames()
            elif isinstance(event, h2.events.TrailersReceived):
                status = dict(event.headers or []).get(b"grpc-status", b"?")
                self.end(f"grpc-status {status.decode(errors='replace')}")
            elif isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                self.end(type(event).__name__)
        out = self.conn.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def take_frames(self) -> None:
        while len(self.buffer) >= 5:
            compressed, length = struct.unpack_from(">?I", self.buffer)
            if len(self.buffer) < 5 + length:
                return
            body = bytes(self.buffer[5 : 5 + length])
            del self.buffer[: 5 + length]
            if compressed:
                self.end("compressed frame")
                return
            kind, content = betterproto2.which_one_of(wire.ControlFrame.parse(body), "frame")
            if isinstance(content, wire.Welcome):
                self.interval = content.heartbeat_interval_ms / 1000
                loop = asyncio.get_running_loop()
                self.timer = loop.call_later(random.uniform(0, self.interval), self.beat)
                if not self.welcomed.done():
                    self.welcomed.set_result(None)
            elif isinstance(content, wire.InventoryRequest):
                self.send(
                    wire.NodeFrame(inventory=wire.InventorySection(section="cpu", content_json=INVENTORY, fake=True))
                )
            elif isinstance(content, wire.Close):
                self.end(f"close: {content.reason}")
            elif kind != "":
                pass  # desired state, commands: none are sent in this bench

    def beat(self) -> None:
        if self.ended is not None:
            return
        self.send(wire.NodeFrame(heartbeat=wire.Heartbeat(sent_at_ms=int(time.time() * 1000))))
        self.stats.heartbeats += 1
        self.timer = asyncio.get_running_loop().call_later(self.interval, self.beat)

    def end(self, why: str) -> None:
        if self.ended is not None:
            return
        self.ended = why
        if self.timer is not None:
            self.timer.cancel()
        if self.welcomed.done():
            self.stats.ended[why] += 1
            self.stats.alive.discard(self)
        else:
            self.welcomed.set_exception(ConnectionError(why))
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.end("connection lost")


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


async def run_client(config: Mapping[str, Any]) -> None:
    """A client process: make every node's TLS context, say ``ready``; on ``connect``, open every session and
    report; on ``stats``, report; stop when stdin closes."""
    nodes = [Node(**n) for n in config["nodes"]]
    port = int(config["port"])
    bundle = config["bundle"]
    contexts = []
    for node in nodes:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=bundle)
        context.set_alpn_protocols(["h2"])
        context.load_cert_chain(node.pem_path)
        contexts.append(context)
    stats = ClientStats()
    loop = asyncio.get_running_loop()
    authority = f"{SERVER_NAME}:{port}"
    gate = asyncio.Semaphore(int(config["concurrency"]))

    async def open_one(node: Node, context: ssl.SSLContext) -> None:
        async with gate:
            try:
                _, session = await loop.create_connection(
                    lambda: NodeSession(node.node_id, authority, stats),
                    "127.0.0.1",
                    port,
                    ssl=context,
                    server_hostname=SERVER_NAME,
                    ssl_handshake_timeout=OPEN_TIMEOUT,
                )
                async with asyncio.timeout(OPEN_TIMEOUT):
                    await session.welcomed
            except Exception as exc:
                stats.failed[str(exc) if isinstance(exc, ConnectionError) else type(exc).__name__] += 1
                return
        transport = session.transport
        alpn = transport.get_extra_info("ssl_object").selected_alpn_protocol() if transport is not None else None
        if alpn != "h2":
            stats.failed[f"alpn {alpn}"] += 1
            session.end("alpn")
            return
        stats.opened += 1
        stats.alive.add(session)

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    reply({"ready": len(nodes)})
    while line := await reader.readline():
        command = line.strip()
        if command == b"connect":
            started = time.time()
            await asyncio.gather(*(open_one(n, c) for n, c in zip(nodes, contexts, strict=True)))
            reply({"opened": stats.opened, "failed": dict(stats.failed), "started": started, "finished": time.time()})
        elif command == b"stats":
            reply({"alive": len(stats.alive), "heartbeats": stats.heartbeats, "ended": dict(stats.ended)})


# --- the conductor ----------------------------------------------------------------------------------------------


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


async def conduct(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Join the nodes, start the processes, measure; the figures."""
    print(f"joining {args.sessions} nodes ...", file=sys.stderr, flush=True)
    nodes, join_rate = await join_nodes(folder, args.sessions)
    children: list[Child] = []
    try:
        gateway = await Child.start(
            "gateway",
            "gateway",
            {
                "folder": str(folder),
                "heartbeat": args.heartbeat,
                "loop": args.loop,
                "gc_young": args.gc_young,
                "files": args.sessions + SPARE_FILES,
            },
            folder,
        )
        children.append(gateway)
        port = (await gateway.read(60))["port"]
        await asyncio.sleep(1.0)
        rss_idle = rss_bytes(gateway.pid)
        census_idle = (await gateway.ask("census")) if args.census else None
        clients = []
        for c in range(args.clients):
            share = nodes[c :: args.clients]
            config = {
                "port": port,
                "bundle": (folder / "bundle.pem").read_text(),
                "concurrency": max(1, args.concurrency // args.clients),
                "nodes": [attrs.asdict(n) for n in share],
            }
            client = await Child.start(f"client-{c}", "client", config, folder)
            children.append(client)
            clients.append(client)
        for client in clients:
            await client.read(300)

        print(f"opening {args.sessions} sessions ...", file=sys.stderr, flush=True)
        before = Sample.take(gateway, clients)
        opened = await asyncio.gather(*(c.ask("connect", within=OPEN_TIMEOUT + 600) for c in clients))
        after = Sample.take(gateway, clients)
        sessions_opened = sum(o["opened"] for o in opened)
        failed: collections.Counter[str] = collections.Counter()
        for o in opened:
            failed.update(o["failed"])
        opening = max(o["finished"] for o in opened) - min(o["started"] for o in opened)

        settle = args.settle if args.settle is not None else args.heartbeat + SETTLE_EXTRA
        print(f"settling for {settle:.0f} s, then measuring for {args.window:.0f} s ...", file=sys.stderr, flush=True)
        await trace(gateway, clients, Sample.take(gateway, clients), settle, "settling")
        with psycopg.connect(URL, autocommit=True) as conn:
            row = conn.execute("SELECT now()").fetchone()
            assert row is not None
            window_start_db: dt.datetime = row[0]
        gateway_start = await gateway.ask("stats")
        statements_start = gateway_start["statements"]
        heartbeats_start = sum([(await c.ask("stats"))["heartbeats"] for c in clients])
        load_start = load_average()
        start = Sample.take(gateway, clients)
        await trace(gateway, clients, start, args.window, "window")
        end = Sample.take(gateway, clients)
        load_end = load_average()
        gateway_stats = await gateway.ask("stats")
        rss_held = rss_bytes(gateway.pid)
        census_held = (await gateway.ask("census", within=300)) if args.census else None
        if census_held is not None:  # after the figures: how much RSS the allocator holds free (changes the process)
            trimmed = (await gateway.ask("trim", within=300))["rss"]
            print(
                f"RSS after malloc_trim(0): {trimmed / 2**20:.1f} MB "
                f"({(trimmed - rss_idle) / max(1, int(census_held['sessions'])) / 1024:.1f} KB a session)",
                file=sys.stderr,
            )
        client_stats = [await c.ask("stats") for c in clients]
        with psycopg.connect(URL, autocommit=True) as conn:
            row = conn.execute(
                f"SELECT count(*) FILTER (WHERE closed_at IS NULL), count(*) FILTER (WHERE closed_at IS NULL AND "
                f'last_seen_at >= %s) FROM "{SCHEMA}".sessions WHERE gateway = %s',
                (window_start_db, GATEWAY_NAME),
            ).fetchone()
            assert row is not None
            db_open, db_seen = int(row[0]), int(row[1])
    finally:
        for child in reversed(children):
            await child.kill()

    seconds = end.at - start.at
    statements = {
        label: (count - statements_start.get(label, 0)) / seconds
        for label, count in gateway_stats["statements"].items()
    }
    held = int(gateway_stats["sessions"])
    wall_start = gateway_start["statement_seconds"]
    statement_ms = {
        label: round(1000 * (total - wall_start.get(label, 0.0)) / made, 1)
        for label, total in gateway_stats["statement_seconds"].items()
        if (made := gateway_stats["statements"][label] - statements_start.get(label, 0)) > 0
    }
    ended: collections.Counter[str] = collections.Counter()
    for s in client_stats:
        ended.update(s["ended"])
    machine = (end.machine_busy - start.machine_busy) / (end.machine_total - start.machine_total)
    if census_idle is not None and census_held is not None:
        idle_types = dict(census_idle["top"])
        print(
            f"objects the collector tracks: {census_idle['objects']} idle, {census_held['objects']} held "
            f"({(census_held['objects'] - census_idle['objects']) / max(1, held):.0f} a session); the most held:",
            file=sys.stderr,
        )
        for name, count in census_held["top"]:
            print(f"  {(count - idle_types.get(name, 0)) / max(1, held):8.1f} a session  {name}", file=sys.stderr)
    return {
        "sessions_asked": args.sessions,
        "heartbeat_s": args.heartbeat,
        "window_s": round(seconds, 1),
        "settle_s": settle,
        "loop": args.loop,
        "gc_young_threshold": GatewayOptions().gc_young_threshold if args.gc_young is None else args.gc_young or None,
        "clients": args.clients,
        "joins_per_s": round(join_rate, 1),
        "sessions_held": {
            "gateway": held,
            "clients": sum(s["alive"] for s in client_stats),
            "database_open": db_open,
            "database_seen_in_window": db_seen,
        },
        "open": {
            "opened": sessions_opened,
            "failed": dict(failed),
            "seconds": round(opening, 2),
            "handshakes_per_s": round(sessions_opened / opening, 1) if opening > 0 else None,
            "gateway_cpu_ms_per_open": round(
                1000 * (after.gateway_cpu - before.gateway_cpu) / max(1, sessions_opened), 2
            ),
        },
        "gateway_cpu_percent": round(100 * (end.gateway_cpu - start.gateway_cpu) / seconds, 1),
        "clients_cpu_percent": round(100 * (end.clients_cpu - start.clients_cpu) / seconds, 1),
        "machine_busy_percent_of_all_cores": round(100 * machine, 1),
        "cores": os.cpu_count(),
        "load_average_1m": [load_start, load_end],
        "rss_idle_mb": round(rss_idle / 2**20, 1),
        "rss_held_mb": round(rss_held / 2**20, 1),
        "rss_per_session_kb": round((rss_held - rss_idle) / max(1, held) / 1024, 1),
        "gateway_gc_percent_by_generation": [
            round(100 * (b - a) / seconds, 1)
            for a, b in zip(gateway_start["gc_seconds"], gateway_stats["gc_seconds"], strict=True)
        ],
        "gateway_gc_runs_per_s_by_generation": [
            round((b - a) / seconds, 2) for a, b in zip(gateway_start["gc_runs"], gateway_stats["gc_runs"], strict=True)
        ],
        "liveness_writes_per_s": round(statements.get("Sessions.seen", 0.0), 2),
        "statements_per_s": {k: round(v, 2) for k, v in sorted(statements.items()) if v > 0},
        "statement_ms": dict(sorted(statement_ms.items())),
        "heartbeats_per_s": round((sum(s["heartbeats"] for s in client_stats) - heartbeats_start) / seconds, 1),
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
            "Sessions.seen statements; all, per second (ms each): "
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


def run_role(role: str, config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    logging.basicConfig(level=logging.WARNING, format=f"{role}: %(levelname)s %(name)s: %(message)s")
    if role == "gateway":
        raise_open_files(int(config.get("files", 0)) or SPARE_FILES)
        main: Callable[[], Coroutine[Any, Any, None]] = lambda: run_gateway(config)  # noqa: E731
        if config["loop"] == "uvloop":
            uvloop.run(main())
        else:
            asyncio.run(main())
    else:
        raise_open_files(len(config["nodes"]) + SPARE_FILES)
        uvloop.run(run_client(config))


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
