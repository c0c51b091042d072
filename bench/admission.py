"""Admission: ``reservations.create`` over HTTP against one api process, next to pgbench running the same
statements, and the time of one placement as the fleet grows.

(1) HTTP. One ``better-compute serve --roles api --no-migrate`` process (uvicorn, the store's default pool of 10
    connections, so the default in-flight cap of 9 requests, the LISTEN/NOTIFY notifier: what an operator runs) over
    the bench's schema. The caller is a tenant admin (``compute.admin`` bound on the tenant) with its own
    credential; the embedded IAM caches the credential and the grants, but its decision on the draft reads the
    draft's projection row (a resource given by id is decided on its recorded tenant and pool), so a request costs
    the database transaction 1 (``Reservations.begin``, one statement), that read, and transaction 2 (one call of
    ``bc_admit_reservation``). Every request asks for ``--gpus`` GPUs (1) of one pool for an hour from now, without
    an idempotency key (``--with-key`` adds runs with a fresh ``Idempotency-Key`` on every request, whose answer
    ``idempotency.finish`` then stores: a fourth statement). The pool is a fleet seeded directly in SQL as the
    inventory controller leaves it (``--nodes`` adopted nodes, 8 available GPU atoms each), with one ended booking
    per atom from last week, as a pool in use has, so that the placer's statements are planned on a bookings table
    of a realistic size. Every run starts on the pool emptied of what the run before booked, after ``--warmup``
    seconds of the same load, and books far less than the pool holds (checked).

    The load comes from a client in a separate process (there is no ``ab``, ``wrk`` or ``oha`` here): uvloop, one
    HTTP/1.1 keep-alive connection per concurrent caller, the request's bytes made once, the answer read by its
    length. Saturation: ``--connections`` callers each sending its next request as soon as the last is answered,
    for ``--seconds``, giving reservations/s (only ``200`` answers count; any other is reported). Then half that
    rate, requests leaving on a fixed schedule whatever the answers (an open loop), each latency taken from when the
    schedule said to send it, so a stall is not hidden by the client waiting for it. Beside each run: the CPU of
    the api process and of the client over the window, how busy the machine's two cores were, and what PostgreSQL
    counted in ``pg_stat_user_functions`` (``track_functions = pl`` in the api's sessions, through ``PGOPTIONS``):
    ``bc_place`` calls per admission (more than one when concurrent admissions collide on the same atoms and
    place again) and the average time of one.

(2) pgbench, same run, same pool, same statements (imported from the packages, bound, prepared), as many clients
    as the api's in-flight cap, the same warm-up and length: transaction 1 (the store's ``_BEGIN`` with the api's
    parameters), then transaction 2 (``SELECT bc_admit_reservation(...)`` with the jsonb ``PgReservations.admit``
    builds: the caller's principal, the action, a decision id, the event type, the controller's work kind and
    shard, the notifier's channel, so its two ``pg_notify`` are sent too), each reservation under a fresh id
    (``\\set`` random). Runs: the two transactions (the baseline), with the IAM's projection read between them (what
    the api sends), the same with one client (no contention), and with ``--with-key`` the key's statements.
    pgbench cannot bind a NULL, so the absent key is bound as ``'null'`` through ``NULLIF``; the id is a 19-digit
    number rather than ``rsv_`` and 16 hex digits; the window is fixed when the run starts rather than at each
    request's ``now``. After each run every counted call must have placed its reservation. The ratio HTTP/pgbench
    is what Python, uvicorn, the dispatcher, the IAM, the codec and psycopg cost on top of PostgreSQL doing the
    same work; on two cores both share the machine with PostgreSQL.

(3) Placement. For each of ``--sizes`` (100, 1,000, 10,000 nodes x 8 GPUs), alone in the tables (its fleet seeded
    with its history, timed, then taken away): the time of one ``bc_place(...)`` call for ``--gpus`` GPUs over an
    hour, and of a whole ``bc_admit_reservation`` (transaction 2; a draft inserted by ``_BEGIN`` first in the same
    transaction, rolled back after, so the pool stays as it was), the median of ``--calls`` calls each (fewer, at
    least 5, when they take over 20 s), from this process over psycopg, so a local round trip (``SELECT 1``,
    printed) is in each figure. On the empty pool, then with 50 % of its atoms booked over the window two ways:
    "front", the first half of the nodes in the placer's order, which is where its best fit puts reservations that
    share a window (a pool filled by this placer looks like this); and "spread", every other node. The growth factor
    is the largest size's time over the smallest's.

Aims (issue 13), printed beside the figures: >= 1,000 reservations/s over HTTP, >= 0.8 x pgbench, p99 <= 50 ms at
half load, placement growing <= 1.5 x from 100 to 10,000 nodes.

    python bench/admission.py            # BETTERCOMPUTE_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/test
    python bench/admission.py --with-key --profile --seconds 10
    python bench/admission.py --json      # the figures as one JSON object on stdout (bench/run.py reads it)

``--profile`` also runs a saturation run against an api process under cProfile (slower, so not the figures above)
and prints where its wall time went. Takes about 5 minutes with the defaults, most of it placing on 10,000 nodes
half booked at the front (seconds a call). Uses (and drops) the schema ``bc_bench_admission``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import io
import json
import os
import pstats
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import psycopg

from bettercompute import JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute._assembly import effective_max_in_flight
from bettercompute._runtime.shards import SHARDS, shard_of
from bettercompute._runtime.workers import SINKS_POKE, WORK_CHANNEL
from bettercompute.modules.pools import CreatePoolInput
from bettercompute.modules.reservations import RESERVATION_KIND, event_type
from bettercompute_iam import (
    CreateBindingInput,
    CreateCredentialInput,
    CreatePrincipalInput,
    CreateTenantInput,
    EmbeddedIam,
    IamGroups,
)
from bettercompute_iam._pg import IamTables
from bettercompute_store_pg import PgNotifier, PgStore
from bettercompute_store_pg._idempotency import _FINISH
from bettercompute_store_pg.modules.reservations._repository import _BEGIN

URL = os.environ.get("BETTERCOMPUTE_DATABASE_URL", "").strip() or "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = "bc_bench_admission"
TRUST_DOMAIN = "admission.bench.test"
BIN = Path(sys.executable).parent
GPUS_PER_NODE = 8
MODEL = "NVIDIA H100 80GB HBM3"
MEMORY_MIB = 81920
HOUR = dt.timedelta(hours=1)
HORIZON = dt.timedelta(days=30)  # the admission's horizon (MAX_HORIZON), passed in its argument
ACTION = "compute:reservations:create"
START_TIMEOUT = 60.0
STATS_FLUSH = 2.0  # seconds for idle backends to report their function counts
SECONDS_DEFAULT = 5
WARMUP_DEFAULT = 2
CONNECTIONS_DEFAULT = 32
HTTP_NODES_DEFAULT = 4000
SIZES_DEFAULT = "100,1000,10000"
CALLS_DEFAULT = 30
CLIENT_GRACE = 60.0  # seconds a client may run past its window before it gives up
OPEN_LOOP_CONNECTIONS = 64  # callers of the rate-limited run: enough that none is ever waited for at half load
MIN_CALLS = 5  # placement calls timed at least, per pool and layout
CELL_SECONDS = 20.0  # ... and past this many seconds, no more than that
AIM_RATE = 1000.0
AIM_RATIO = 0.8
AIM_P99_MS = 50.0
AIM_GROWTH = 1.5
# Tables a run writes to, emptied before each run so that every run books into the same state.
PAST = "rsv_past_"  # the ended bookings every atom has (seed_history), kept across runs
RUN_TABLES = (
    "bookings",
    "reservations",
    "outbox",
    "outbox_keys",
    "work_queue",
    "audit",
    "idempotency_keys",
    "placement_holds",
    "placement_nodes",
)


# --- small things -----------------------------------------------------------------------------------------------


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) a process has used so far, every thread of it; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, every core."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def connect() -> psycopg.Connection[Any]:
    return psycopg.connect(URL, autocommit=True)


def drop_schema() -> None:
    with connect() as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


@attrs.frozen(kw_only=True)
class Placing:
    """What the database functions did over a run (PostgreSQL's ``pg_stat_user_functions``, counted with
    ``track_functions = pl`` in the sessions of the api process and of pgbench): placements per admission, and
    the average time of one ``bc_place``."""

    admissions: int
    placements: int
    place_ms: float

    @property
    def per_admission(self) -> float:
        return self.placements / self.admissions if self.admissions else float("nan")


def function_calls() -> dict[str, tuple[int, float]]:
    """Calls and total milliseconds of the schema's functions so far, as PostgreSQL counted them. Backends report
    their counts when they go idle, at most once a second: wait that long after a run before reading."""
    with connect() as conn:
        rows = conn.execute(
            "SELECT funcname, calls, total_time FROM pg_stat_user_functions WHERE schemaname = %s", (SCHEMA,)
        ).fetchall()
    return {str(name): (int(calls), float(total)) for name, calls, total in rows}


def placing_since(before: Mapping[str, tuple[int, float]]) -> Placing:
    time.sleep(STATS_FLUSH)
    after = function_calls()

    def delta(name: str) -> tuple[int, float]:
        calls, total = after.get(name, (0, 0.0))
        calls0, total0 = before.get(name, (0, 0.0))
        return calls - calls0, total - total0

    admissions, _ = delta("bc_admit_reservation")
    placements, place_total = delta("bc_place")
    return Placing(
        admissions=admissions, placements=placements, place_ms=place_total / placements if placements else 0.0
    )


def counting_env() -> dict[str, str]:
    """The environment of a process whose sessions count function calls (libpq reads ``PGOPTIONS``)."""
    options = f"{os.environ.get('PGOPTIONS', '')} -c track_functions=pl".strip()
    return {**os.environ, "PGOPTIONS": options}


def one_line(statement: str, renames: Mapping[str, str] | None = None) -> str:
    """``statement`` on one line, schema filled in, ``:name`` parameters replaced as ``renames`` says."""
    statement = statement.replace("{s}", f'"{SCHEMA}"')
    for old, new in (renames or {}).items():
        statement = re.sub(re.escape(old) + r"\b", new, statement)
    return " ".join(statement.split())


def pgbench_binary() -> str | None:
    found = shutil.which("pgbench")
    if found is not None:
        return found
    installed = sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))
    return str(installed[-1]) if installed else None


# --- the control plane and the fleet ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Setup:
    """The tenant, its admin (principal and credential), the pool the HTTP runs book into, the placement pools."""

    folder: Path
    config: Path
    tenant: str
    principal: str
    credential: str
    pool: str
    place_pools: dict[int, str]


def write_config(folder: Path) -> Path:
    """What ``serve`` and ``migrate`` read: node identity on (so the atoms tables exist), this schema."""
    path = folder / "bettercompute.toml"
    lines = {
        "database_url": URL,
        "schema": SCHEMA,
        "kms_key_file": str(folder / "kms.key"),
        "trust_domain": TRUST_DOMAIN,
        "gateway_address": "127.0.0.1:7443",
    }
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in lines.items()))
    return path


async def make_tenant(folder: Path, sizes: Sequence[int]) -> tuple[str, str, str, str, dict[int, str]]:
    """The root admin, a tenant, its admin with a credential, and the pools; through the public API in process."""
    options = Options(
        store=PgStore(URL, schema=SCHEMA, pool_size=2),
        iam=EmbeddedIam(),
        instance="bench-admission-setup",
        kms=LocalKeyKms(folder / "kms.key"),
        join=JoinSettings(gateway_address="127.0.0.1:7443", trust_domain=TRUST_DOMAIN),
    )
    compute = better_compute(options)
    await compute.initialize(migrate=False)
    try:
        iam = options.iam
        assert isinstance(iam, EmbeddedIam)
        boot = await iam.bootstrap()
        assert boot.credential is not None
        root = boot.credential
        groups = IamGroups(compute.api)
        tenant = (await groups.tenants.create(root, CreateTenantInput(name="acme"))).id
        principal = await groups.principals.create(root, CreatePrincipalInput(tenant=tenant, name="bench", kind="user"))
        await groups.bindings.create(
            root,
            CreateBindingInput(tenant=tenant, principal_id=principal.id, role="compute.admin", scope_type="tenant"),
        )
        created = await groups.credentials.create(
            root, CreateCredentialInput(tenant=tenant, principal_id=principal.id, expires_in_seconds=None)
        )
        pool = (await compute.api.pools.create(root, CreatePoolInput(tenant=tenant, name="http"))).id
        place = {}
        for size in sizes:
            place[size] = (await compute.api.pools.create(root, CreatePoolInput(tenant=tenant, name=f"n{size}"))).id
        return tenant, principal.id, created.credential, pool, place
    finally:
        await compute.close()


def seed_fleet(conn: psycopg.Connection[Any], *, tenant: str, pool: str, nodes: int, prefix: str) -> None:
    """``nodes`` adopted nodes of 8 available GPU atoms each (every GPU an NVLink peer of the others on its node),
    as the inventory controller would leave them, in three statements (as tests/integration/capacity's
    ``seed_fleet``)."""
    s = f'"{SCHEMA}"'
    values = {
        "p": prefix,
        "t": tenant,
        "pool": pool,
        "n": nodes,
        "g": GPUS_PER_NODE,
        "model": MODEL,
        "mem": MEMORY_MIB,
    }
    conn.execute(
        f"INSERT INTO {s}.nodes (id, tenant, pool_id, state, hardware_key)"
        f" SELECT %(p)s || i, %(t)s, %(pool)s, 'adopted', 'hw-' || %(p)s || i FROM generate_series(0, %(n)s - 1) i",
        values,
    )
    conn.execute(
        f"INSERT INTO {s}.devices (id, node_id, tenant, pool_id, kind, ident, state, model, details)"
        f" SELECT 'dev-' || %(p)s || i || '-' || j, %(p)s || i, %(t)s, %(pool)s, 'gpu',"
        f" 'GPU-' || %(p)s || i || '-' || j, 'present', %(model)s,"
        f" jsonb_build_object('memory_mib', %(mem)s, 'nvlink_peers',"
        f" (SELECT jsonb_agg('GPU-' || %(p)s || i || '-' || k) FROM generate_series(0, %(g)s - 1) k WHERE k <> j))"
        f" FROM generate_series(0, %(n)s - 1) i, generate_series(0, %(g)s - 1) j",
        values,
    )
    conn.execute(
        f"INSERT INTO {s}.atoms (id, node_id, device_id, tenant, pool_id, kind, ident, model, memory_mib, state)"
        f" SELECT 'atom-' || %(p)s || i || '-' || j, %(p)s || i, 'dev-' || %(p)s || i || '-' || j, %(t)s,"
        f" %(pool)s, 'gpu', 'GPU-' || %(p)s || i || '-' || j, %(model)s, %(mem)s, 'available'"
        f" FROM generate_series(0, %(n)s - 1) i, generate_series(0, %(g)s - 1) j",
        values,
    )


def analyze() -> None:
    with connect() as conn:
        for table in ("nodes", "devices", "atoms", *RUN_TABLES, "authz_resources"):
            conn.execute(f'VACUUM ANALYZE "{SCHEMA}".{table}')


def seed_history(conn: psycopg.Connection[Any], pool: str) -> None:
    """One ended booking per atom of ``pool`` (a reservation of last week), as a pool in use has: the placer's
    statements are planned on a bookings table of realistic size rather than an empty one. None of them overlaps
    a window the bench asks for."""
    s = f'"{SCHEMA}"'
    conn.execute(
        f"""INSERT INTO {s}.bookings (atom_id, reservation_id, tenant, pool_id, gpus, during)
        SELECT id, {PAST!r} || node_id, tenant, pool_id, 1,
            tstzrange(now() - interval '8 days', now() - interval '7 days', '[)')
        FROM {s}.atoms WHERE pool_id = %s""",
        (pool,),
    )


def reset_runs(pool: str) -> None:
    """Take back everything a run wrote (the ended bookings of ``seed_history`` stay), so the next run books into
    an empty pool."""
    s = f'"{SCHEMA}"'
    with connect() as conn:
        conn.execute(f"DELETE FROM {s}.authz_resources WHERE resource_type = 'reservation'")
        conn.execute(f"DELETE FROM {s}.bookings WHERE pool_id = %s AND reservation_id NOT LIKE %s", (pool, PAST + "%"))
        for table in RUN_TABLES:
            if table not in ("bookings", "placement_holds", "placement_nodes"):  # the hints follow the bookings
                conn.execute(f"DELETE FROM {s}.{table}")
        for table in (*RUN_TABLES, "authz_resources"):
            conn.execute(f"VACUUM ANALYZE {s}.{table}")


def prepare(args: argparse.Namespace, folder: Path) -> Setup:
    config = write_config(folder)
    migrate = subprocess.run(
        [str(BIN / "better-compute"), "--config", str(config), "migrate"], capture_output=True, check=False
    )
    if migrate.returncode != 0:
        raise SystemExit(f"better-compute migrate failed: {migrate.stderr.decode(errors='replace')[-2000:]}")
    sizes = [] if args.skip_placement else args.sizes
    tenant, principal, credential, pool, place = asyncio.run(make_tenant(folder, sizes))
    with connect() as conn:
        if not args.skip_http:
            seed_fleet(conn, tenant=tenant, pool=pool, nodes=args.nodes, prefix="h")
            seed_history(conn, pool)
    analyze()
    return Setup(
        folder=folder,
        config=config,
        tenant=tenant,
        principal=principal,
        credential=credential,
        pool=pool,
        place_pools=place,
    )


# --- (1) HTTP: the api process and the client -------------------------------------------------------------------


@attrs.define(kw_only=True, eq=False)
class Api:
    """The ``serve --roles api`` process, its stderr in a file."""

    popen: subprocess.Popen[bytes]
    log: Path
    port: int

    @classmethod
    def start(cls, setup: Setup, *, profile: Path | None) -> Api:
        port = free_port()
        log = setup.folder / f"api-{port}.log"
        command = [str(BIN / "better-compute")]
        if profile is not None:  # the console script is a Python file: run it under cProfile
            command = [sys.executable, "-m", "cProfile", "-o", str(profile), command[0]]
        command += ["--config", str(setup.config), "serve", "--roles", "api", "--no-migrate", "--port", str(port)]
        env = {**counting_env(), "BETTERCOMPUTE_INSTANCE": "bench-api"}
        with log.open("wb") as err:
            popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        api = cls(popen=popen, log=log, port=port)
        deadline = time.monotonic() + START_TIMEOUT
        while "serving " not in log.read_text(errors="replace"):
            if popen.poll() is not None or time.monotonic() > deadline:
                api.stop()
                raise SystemExit(f"the api process did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        return api

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        """SIGTERM (a clean exit, which also writes cProfile's file), then SIGKILL after 30 s."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@attrs.frozen(kw_only=True)
class HttpRun:
    """One run of the client: answers by status, latencies (seconds) of the ``200`` ones and of the ``503`` ones
    (``shed``, for bench/shedding.py; sorted, at most 1,000 evenly spaced ranks), the window, and the CPU of the api
    process, of the client and the machine's busy share over the window."""

    label: str
    ok: int
    failed: dict[str, int]
    seconds: float
    latencies: list[float]
    shed: list[float]
    api_cpu: float
    client_cpu: float
    busy: float
    target_rate: float | None
    placing: Placing

    @property
    def rate(self) -> float:
        return self.ok / self.seconds

    def ms(self, q: float) -> float:
        return 1000 * percentile(self.latencies, q) if self.latencies else float("nan")


def request_bytes(setup: Setup, port: int, gpus: int) -> bytes:
    body = json.dumps(
        {"tenant": setup.tenant, "pool_id": setup.pool, "gpus": gpus, "duration": "PT1H"}, separators=(",", ":")
    ).encode()
    head = (
        f"POST /api/compute/reservations/create HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {setup.credential}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    return head.encode() + b"%KEY%\r\n" + body


def run_client(api: Api, config: Mapping[str, Any], label: str) -> HttpRun:
    """Run the client process with ``config``; the api's CPU and the machine's over its measured window."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
        path = f.name
    counted = function_calls()
    try:
        client = subprocess.Popen(
            [sys.executable, __file__, "--role", "client", "--client-config", path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout is not None and client.stdin is not None
        # The client says when its window starts and ends, so the api's CPU is read over the same window.
        marks: dict[str, tuple[float, float, int, int]] = {}
        result: dict[str, Any] | None = None
        for line in client.stdout:
            message = json.loads(line)
            if "mark" in message:
                busy, total = machine_ticks()
                marks[message["mark"]] = (cpu_seconds(api.pid), cpu_seconds(client.pid), busy, total)
            else:
                result = message
        client.wait()
    finally:
        os.unlink(path)
    if result is None or client.returncode != 0:
        raise SystemExit(f"the client failed (exit {client.returncode})")
    start, end = marks["start"], marks["end"]
    seconds = float(result["seconds"])
    return HttpRun(
        label=label,
        ok=int(result["ok"]),
        failed=dict(result["failed"]),
        seconds=seconds,
        latencies=[float(x) for x in result["latencies"]],
        shed=[float(x) for x in result["shed"]],
        api_cpu=(end[0] - start[0]) / seconds,
        client_cpu=(end[1] - start[1]) / seconds,
        busy=(end[2] - start[2]) / max(1, end[3] - start[3]),
        target_rate=config.get("rate"),
        placing=placing_since(counted),
    )


# The client process (``--role client``): uvloop, raw HTTP/1.1 over keep-alive connections.


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> int:
    """Send one request and read its answer; its status."""
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"content-length:")
    if at >= 0:
        length = int(lower[at + 15 : lower.index(b"\r\n", at)])
        await reader.readexactly(length)
        return status
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return status


async def client_main(config: Mapping[str, Any]) -> dict[str, Any]:
    port = int(config["port"])
    template: bytes = str(config["request"]).encode("latin-1")
    with_key = bool(config["with_key"])
    rate = config.get("rate")
    connections = int(config["connections"])
    warmup = float(config["warmup"])
    seconds = float(config["seconds"])
    prefix = uuid.uuid4().hex[:12]
    counter = 0

    def payload() -> bytes:
        nonlocal counter
        counter += 1
        key = f"Idempotency-Key: {prefix}-{counter}\r\n".encode() if with_key else b""
        return template.replace(b"%KEY%", key)

    plain = payload() if not with_key else b""
    pairs = []
    for _ in range(connections):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pairs.append((reader, writer))

    ok = 0
    failed: dict[str, int] = {}
    latencies: list[float] = []
    shed: list[float] = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    window_start = started + warmup
    window_end = window_start + seconds
    marked = False

    def mark(name: str) -> None:
        print(json.dumps({"mark": name}), flush=True)

    def record(status: int, sent: float, done: float) -> None:
        nonlocal ok
        if window_start <= sent < window_end:
            if status == 200:
                ok += 1
                latencies.append(done - sent)
            else:
                if status == 503:
                    shed.append(done - sent)
                failed[str(status)] = failed.get(str(status), 0) + 1

    async def marker() -> None:
        nonlocal marked
        await asyncio.sleep(max(0.0, window_start - loop.time()))
        mark("start")
        await asyncio.sleep(max(0.0, window_end - loop.time()))
        mark("end")
        marked = True

    if rate is None:  # closed loop: each caller sends its next request when the last is answered

        async def caller(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while (sent := loop.time()) < window_end:
                status = await exchange(reader, writer, plain or payload())
                record(status, sent, loop.time())

    else:  # open loop: request i is due at started + i / rate, whoever sends it
        interval = 1.0 / float(rate)
        due = 0

        async def caller(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal due
            while True:
                at = started + due * interval
                due += 1
                if at >= window_end:
                    return
                delay = at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                status = await exchange(reader, writer, plain or payload())
                record(status, at, loop.time())

    tasks = [asyncio.ensure_future(marker())]
    await asyncio.gather(*(caller(r, w) for r, w in pairs))
    await tasks[0]
    for _, writer in pairs:
        writer.close()
    # Tens of thousands of 503s would make a line too long for the pipe: their distribution, in 1,000 ranks, is enough.
    shed.sort()
    thinned = [shed[len(shed) * i // 1000] for i in range(1000)] if len(shed) > 1000 else shed
    return {"ok": ok, "failed": failed, "seconds": seconds, "latencies": latencies, "shed": thinned, "marked": marked}


def run_client_role(path: str) -> None:
    import uvloop

    config = json.loads(Path(path).read_text())
    # A server that stops answering must not hang the bench: the whole run has a deadline.
    deadline = float(config["warmup"]) + float(config["seconds"]) + CLIENT_GRACE
    result = uvloop.run(asyncio.wait_for(client_main(config), deadline))
    print(json.dumps(result), flush=True)


def bench_http(api: Api, setup: Setup, args: argparse.Namespace, *, with_key: bool) -> tuple[HttpRun, HttpRun]:
    """Saturation, then half that rate; each on an empty pool."""
    base = {
        "port": api.port,
        "request": request_bytes(setup, api.port, args.gpus).decode("latin-1"),
        "with_key": with_key,
        "warmup": args.warmup,
        "seconds": args.seconds,
    }
    tag = "with key" if with_key else "no key"
    reset_runs(setup.pool)
    saturated = run_client(api, {**base, "connections": args.connections}, f"saturation, {tag}")
    check_booked(setup, saturated, args)
    half = saturated.rate / 2
    reset_runs(setup.pool)
    paced = run_client(
        api, {**base, "connections": OPEN_LOOP_CONNECTIONS, "rate": half}, f"half load ({half:.0f}/s), {tag}"
    )
    check_booked(setup, paced, args)
    return saturated, paced


def check_booked(setup: Setup, run: HttpRun, args: argparse.Namespace) -> None:
    """The pool must never have come near running out: a run that did would measure refusals."""
    with connect() as conn:
        row = conn.execute(
            f'SELECT count(*) FROM "{SCHEMA}".bookings WHERE pool_id = %s AND reservation_id NOT LIKE %s',
            (setup.pool, PAST + "%"),
        ).fetchone()
    booked = int(row[0]) if row else 0
    if booked > 0.9 * args.nodes * GPUS_PER_NODE:
        raise SystemExit(f"{run.label}: {booked} atoms booked of {args.nodes * GPUS_PER_NODE}: raise --nodes")


# --- (2) pgbench on the same statements -------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class PgbenchRun:
    """One pgbench run: reservations/s, average latency, and each statement's average latency (ms)."""

    label: str
    clients: int
    tps: float
    latency_ms: float
    statements: list[tuple[str, float]]
    placing: Placing


def admit_argument(setup: Setup, *, with_key: bool) -> dict[str, Any]:
    """The jsonb ``PgReservations.admit`` builds for a create like the HTTP runs' (id and shard set per call)."""
    notifier = PgNotifier(URL, schema=SCHEMA)
    return {
        "id": "",
        "share": float(1),
        "model": None,
        "min_memory_mib": None,
        "one_node": False,
        "nvlink": False,
        "mig_profile": None,
        "now": dt.datetime.now(dt.UTC).isoformat(),
        "horizon": f"{int(HORIZON.total_seconds())} seconds",
        "actor": setup.principal,
        "action": ACTION,
        "decision_id": uuid.uuid4().hex,
        "event_type": event_type("placed"),
        "work_kind": RESERVATION_KIND,
        "work_shard": 0,
        "work_channel": notifier.channel_name(WORK_CHANNEL),
        "sinks_poke": SINKS_POKE,
        "idempotency_identity": setup.principal if with_key else None,
        "idempotency_key": "" if with_key else None,
    }


def projection_read() -> str:
    """The IAM's read of a resource's projection row (its decision on the draft, by id), as the api sends it."""
    query = IamTables(PgStore(URL, schema=SCHEMA))._projected.query
    return " ".join(query.replace("%(type)s", "'reservation'").replace("%(id)s", "CAST(:n AS text)").split())


def pgbench_script(*, with_key: bool, iam_read: bool) -> tuple[str, list[str]]:
    """Transaction 1 (``_BEGIN``), with ``iam_read`` the IAM's read of the draft's projection row, transaction 2
    (the admission), and with a key the answer stored; each statement its own implicit transaction, as the api
    runs them. ``:n`` is the reservation's id (and its key), fresh per call. The script, and its statements' names."""
    begin = one_line(
        _BEGIN,
        {
            ":id": "CAST(:n AS text)",
            ":key": "NULLIF(CAST(:key AS text), 'null')",
            ":ttl": "CAST(:ttl AS interval)",
        },
    )
    merge = "'id', CAST(:n AS text), 'work_shard', CAST(:shard AS integer)"
    if with_key:
        merge += ", 'idempotency_key', CAST(:n AS text)"
    admit = f'SELECT "{SCHEMA}".bc_admit_reservation(CAST(:p AS jsonb) || jsonb_build_object({merge})) AS out'
    lines = ["\\set n random(1000000000000000000, 9000000000000000000)", f"\\set shard :n % {SHARDS}"]
    if with_key:
        lines.append("\\set key :n")
    statements = [("transaction 1", begin)]
    if iam_read:
        statements.append(("IAM projection read", projection_read()))
    statements.append(("transaction 2", admit))
    if with_key:
        statements.append(("idempotency finish", one_line(_FINISH, {":key": "CAST(:n AS text)"})))
    return "\n".join([*lines, *(f"{sql};" for _, sql in statements)]) + "\n", [name for name, _ in statements]


def pgbench_variables(setup: Setup, *, with_key: bool, gpus: int, start: dt.datetime) -> dict[str, str]:
    """The parameters as the api binds them (the window fixed at ``start``; no key is ``'null'``)."""
    answer = {"output": {"id": "rsv_pgbench", "state": "placed"}}
    variables = {
        "pool_id": setup.pool,
        "pool_tenants": "{" + setup.tenant + "}",
        "tenant": setup.tenant,
        "gpus": str(gpus),
        "constraints": "{}",
        "start_at": start.isoformat(),
        "end_at": (start + HOUR).isoformat(),
        "labels": "{}",
        "created_by": setup.principal,
        "now": start.isoformat(),
        "identity": setup.principal,
        "request_hash": "0" * 64,
        "attempt": uuid.uuid4().hex,
        "ttl": "24 hours",
        "p": json.dumps(admit_argument(setup, with_key=with_key)),
        "result": json.dumps(answer),
    }
    if not with_key:
        variables["key"] = "null"  # with a key, the script sets it per call
    return variables


def bench_pgbench(
    setup: Setup, args: argparse.Namespace, *, clients: int, with_key: bool, iam_read: bool, label: str
) -> PgbenchRun:
    binary = pgbench_binary()
    assert binary is not None
    reset_runs(setup.pool)
    variables = pgbench_variables(setup, with_key=with_key, gpus=args.gpus, start=dt.datetime.now(dt.UTC))
    defines = [arg for name, value in variables.items() for arg in ("-D", f"{name}={value}")]
    text, names = pgbench_script(with_key=with_key, iam_read=iam_read)
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "admission.sql"
        script.write_text(text)
        command = [binary, "-n", "-M", "prepared", "-r", *defines, "-f", str(script), "-c", str(clients)]
        command += ["-j", str(min(2, clients)), "-T"]
        # A warm-up run first, as the HTTP runs have: the measured run starts on a pool as booked as theirs.
        counted = function_calls()
        if args.warmup > 0:
            subprocess.run([*command, str(args.warmup), URL], capture_output=True, check=False, env=counting_env())
        with connect() as conn:
            row = conn.execute(f"SELECT count(*) FROM \"{SCHEMA}\".reservations WHERE state = 'placed'").fetchone()
            before = int(row[0]) if row else 0
        result = subprocess.run(
            [*command, str(args.seconds), URL], capture_output=True, text=True, check=False, env=counting_env()
        )
        placing = placing_since(counted)
    tps = re.search(r"tps = ([0-9.]+)", result.stdout)
    latency = re.search(r"latency average = ([0-9.]+) ms", result.stdout)
    processed = re.search(r"number of transactions actually processed: ([0-9]+)", result.stdout)
    if result.returncode != 0 or tps is None or latency is None or processed is None:
        raise SystemExit(f"pgbench failed:\n{result.stdout}\n{result.stderr}")
    # Per-statement averages (-r): the lines after the \set ones, in script order.
    timed = re.findall(r"^\s+([0-9.]+)\s+[0-9]+\s+(?!\\)\S", result.stdout, flags=re.MULTILINE)
    statements = list(zip(names, (float(t) for t in timed[-len(names) :]), strict=True))
    with connect() as conn:
        row = conn.execute(
            f"SELECT count(*) FILTER (WHERE state = 'placed'), count(*) FILTER (WHERE state NOT IN ('placed', 'draft'))"
            f' FROM "{SCHEMA}".reservations'
        ).fetchone()
    assert row is not None
    placed, other = int(row[0]), int(row[1])
    transactions = int(processed.group(1))
    # Each call must have placed its reservation; a client stopped by -T may have placed one more (or left a draft).
    if not transactions <= placed - before <= transactions + clients or other:
        raise SystemExit(f"pgbench: {transactions} calls, {placed} reservations placed, {other} in another state")
    return PgbenchRun(
        label=label,
        clients=clients,
        tps=float(tps.group(1)),
        latency_ms=float(latency.group(1)),
        statements=statements,
        placing=placing,
    )


def pgbench_runs(setup: Setup, args: argparse.Namespace, cap: int) -> list[PgbenchRun]:
    """The baseline (transactions 1 and 2), then what the api really sends (with the IAM's read), one client
    alone, and with ``--with-key`` the key's statements."""
    runs = [
        bench_pgbench(setup, args, clients=cap, with_key=False, iam_read=False, label="tx 1 + tx 2"),
        bench_pgbench(setup, args, clients=cap, with_key=False, iam_read=True, label="tx 1 + IAM read + tx 2"),
        bench_pgbench(setup, args, clients=1, with_key=False, iam_read=True, label="the same, 1 client"),
    ]
    if args.with_key:
        runs.append(
            bench_pgbench(setup, args, clients=cap, with_key=True, iam_read=True, label="with key: + IAM read + finish")
        )
    return runs


# --- (3) placement time -----------------------------------------------------------------------------------------


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
        f'SELECT "{SCHEMA}".bc_place(%(pool)s, %(gpus)s, NULL, NULL, false, false, NULL,'
        f" tstzrange(%(start)s, %(end)s, '[)'), '{{}}')"
    )


def begin_statement() -> str:
    """The store's ``_BEGIN`` in psycopg's parameter style."""
    return re.sub(r"(?<!:):([a-z_]+)\b", r"%(\1)s", _BEGIN.replace("{s}", f'"{SCHEMA}"'))


def time_placement(
    conn: psycopg.Connection[Any], setup: Setup, pool: str, *, gpus: int, calls: int, start: dt.datetime
) -> tuple[float, float, int, int]:
    """Median ms of ``bc_place`` and of ``bc_admit_reservation`` (a draft inserted first, rolled back after), the
    candidates the placer looked at, and how many calls were timed: ``calls``, or fewer (at least ``MIN_CALLS``)
    when they take longer than ``CELL_SECONDS`` together."""
    window = {"pool": pool, "gpus": gpus, "start": start, "end": start + HOUR}
    place = place_statement()
    begin = begin_statement()
    admit = f'SELECT "{SCHEMA}".bc_admit_reservation(%(p)s::jsonb)'
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
    s = f'"{SCHEMA}"'
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
    s = f'"{SCHEMA}"'
    for table in ("bookings", "atoms", "devices", "nodes"):
        conn.execute(f"DELETE FROM {s}.{table} WHERE pool_id = %s", (pool,))


def bench_placement(setup: Setup, args: argparse.Namespace) -> tuple[list[Placement], float]:
    """Each size alone: its fleet seeded (with its history), timed empty and half booked, then taken away again,
    so that no other pool's atoms are in the tables (see the README for what they do to the plan)."""
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
                conn.execute(f'VACUUM ANALYZE "{SCHEMA}".{table}')
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


# --- profile ----------------------------------------------------------------------------------------------------


def profile_api(setup: Setup, args: argparse.Namespace) -> str:
    """A saturation run against an api process under cProfile; its busiest functions, as text."""
    path = setup.folder / "api.prof"
    api = Api.start(setup, profile=path)
    try:
        bench_http_saturation_only(api, setup, args)
    finally:
        api.stop()
    if not path.exists():
        return "(no profile written: the api process did not exit cleanly)"
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    # Wall time, not CPU: on a busy machine a call that wakes PostgreSQL (a send) may be charged for its run.
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(r"bettercompute.*(dispatch|_reservations|_iam|http|_db)", 25)
    return out.getvalue()


def bench_http_saturation_only(api: Api, setup: Setup, args: argparse.Namespace) -> HttpRun:
    reset_runs(setup.pool)
    config = {
        "port": api.port,
        "request": request_bytes(setup, api.port, args.gpus).decode("latin-1"),
        "with_key": False,
        "warmup": args.warmup,
        "seconds": args.seconds,
        "connections": args.connections,
    }
    return run_client(api, config, "saturation under cProfile")


# --- main -------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Results:
    cap: int
    http: list[tuple[HttpRun, HttpRun]]  # (saturation, half load): without a key, then with one
    pgbench: list[PgbenchRun] | None  # None: no pgbench here
    placement: list[Placement]
    round_trip_ms: float
    profile: str | None


def verdict(ok: bool, text: str) -> str:
    return f"{'met' if ok else 'MISSED'}: {text}"


def report_http(results: Results, args: argparse.Namespace) -> None:
    print(
        f"(1) reservations.create over HTTP: one api process (serve --roles api, in-flight cap {results.cap}), a "
        f"tenant admin, {args.gpus} GPU(s) for an hour each, a pool of {args.nodes:,} nodes x {GPUS_PER_NODE} GPUs "
        f"emptied before each run, {args.seconds} s per run after {args.warmup} s of warm-up"
    )
    print(
        f"  {'run':<34} {'res/s':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'api CPU':>8} {'client':>7}"
        f" {'busy':>5} {'places/adm':>10} {'place ms':>8}  errors"
    )
    for pair in results.http:
        for run in pair:
            print(
                f"  {run.label:<34} {run.rate:6.0f} {run.ms(0.5):7.1f} {run.ms(0.99):7.1f} {run.ms(1.0):7.1f}"
                f" {100 * run.api_cpu:7.0f}% {100 * run.client_cpu:6.0f}% {100 * run.busy:4.0f}%"
                f" {run.placing.per_admission:10.2f} {run.placing.place_ms:8.2f}  {run.failed or 'none'}"
            )
    print(
        f"  ({args.connections} connections at saturation; at half load requests leave on a fixed schedule and "
        "latency counts from the scheduled time; CPU in % of one core; busy: both cores, all processes; "
        "places/adm: bc_place calls per admission, place ms: the average one, both over warm-up and run)"
    )


def report_pgbench(results: Results, args: argparse.Namespace) -> None:
    if results.pgbench is None:
        print("(2) pgbench not found (on PATH or /usr/lib/postgresql/*/bin): no baseline, no ratio")
        return
    print(
        f"(2) pgbench on the same pool, the store's statements (bound, prepared), {args.seconds} s per run; "
        "avg ms per statement"
    )
    plain = results.http[0][0].rate
    keyed = results.http[1][0].rate if len(results.http) > 1 else None
    for run in results.pgbench:
        keyed_run = run.label.startswith("with key")
        http = keyed if keyed_run else plain
        ratio = f"HTTP / pgbench {http / run.tps:5.2f}" if http is not None and run.clients == results.cap else ""
        steps = ", ".join(f"{name} {ms:.1f}" for name, ms in run.statements)
        print(f"  {run.label:<32} {run.clients:>2} clients {run.tps:7.0f} res/s ({run.latency_ms:6.1f} ms)  {ratio}")
        print(f"  {'':<32} {steps}; places/adm {run.placing.per_admission:.2f}, place ms {run.placing.place_ms:.2f}")


def report_aims(results: Results) -> None:
    saturated, paced = results.http[0]
    print("aims (issue 13):")
    print(
        f"  {verdict(saturated.rate >= AIM_RATE, f'>= {AIM_RATE:,.0f} reservations/s')}: {saturated.rate:.0f}, "
        f"{saturated.rate / AIM_RATE:.2f} x the aim"
    )
    if results.pgbench:
        for run in results.pgbench[:2]:
            ratio = saturated.rate / run.tps
            print(f"  {verdict(ratio >= AIM_RATIO, f'>= {AIM_RATIO} x pgbench')}: {ratio:.2f} x ({run.label})")
    p99 = paced.ms(0.99)
    print(f"  {verdict(p99 <= AIM_P99_MS, f'p99 <= {AIM_P99_MS:.0f} ms at half load')}: {p99:.1f} ms")


def report_placement(results: Results, args: argparse.Namespace) -> None:
    print(
        f"(3) placement, {args.gpus} GPU(s) for an hour: median ms of up to {args.calls} calls from this process "
        f"(a bare round trip, SELECT 1, is {results.round_trip_ms:.2f} ms)"
    )
    names = {"empty": "empty", "front": "50% booked, front", "spread": "50% booked, spread"}
    print(f"  {'nodes':>6}  {'pool':<19} {'bc_place':>9} {'admission':>10} {'candidates':>11} {'calls':>6}")
    for p in results.placement:
        print(
            f"  {p.nodes:>6}  {names[p.layout]:<19} {p.place_ms:9.2f} {p.admit_ms:10.2f} {p.candidates:11d}"
            f" {p.calls:6d}"
        )
    sizes = sorted({p.nodes for p in results.placement})
    if len(sizes) < 2:
        return
    low, high = sizes[0], sizes[-1]
    by = {(p.nodes, p.layout): p for p in results.placement}
    print(f"  growth {low:,} -> {high:,} nodes (aim <= {AIM_GROWTH} x):")
    for layout in ("empty", "front", "spread"):
        place = by[(high, layout)].place_ms / by[(low, layout)].place_ms
        admit = by[(high, layout)].admit_ms / by[(low, layout)].admit_ms
        print(
            f"    {names[layout]:<19} bc_place {place:7.2f} x, admission {admit:7.2f} x   "
            f"{verdict(max(place, admit) <= AIM_GROWTH, f'<= {AIM_GROWTH} x')}"
        )


def key_of(label: str) -> str:
    """A run's label as a JSON key: ``"tx 1 + IAM read + tx 2"`` -> ``"tx_1_iam_read_tx_2"``."""
    return "_".join(re.findall(r"[a-z0-9]+", label.lower()))


def figures(results: Results, args: argparse.Namespace) -> dict[str, float | int | str | None]:
    """The results as flat named figures (``--json``): rates per second, times in ms, CPU and busy in %."""
    out: dict[str, float | int | str | None] = {"in_flight_cap": results.cap, "http_seconds": args.seconds}
    for pair in results.http:
        tag = "with_key" if pair[0].label.endswith("with key") else "no_key"
        for kind, run in zip(("saturation", "half_load"), pair, strict=True):
            prefix = f"http_{kind}_{tag}"
            out[f"{prefix}_per_s"] = round(run.rate, 1)
            out[f"{prefix}_p50_ms"] = round(run.ms(0.5), 2)
            out[f"{prefix}_p99_ms"] = round(run.ms(0.99), 2)
            out[f"{prefix}_api_cpu_percent"] = round(100 * run.api_cpu, 1)
            out[f"{prefix}_machine_busy_percent"] = round(100 * run.busy, 1)
            out[f"{prefix}_errors"] = sum(run.failed.values())
    if results.http:
        saturated, paced = results.http[0]
        out["http_saturation_per_s"] = round(saturated.rate, 1)
        out["http_saturation_p99_ms"] = round(saturated.ms(0.99), 2)
        out["http_half_load_p99_ms"] = round(paced.ms(0.99), 2)
        out["http_half_load_per_s"] = round(paced.rate, 1)
    for pg in results.pgbench or ():
        prefix = f"pgbench_{key_of(pg.label)}_{pg.clients}c"
        out[f"{prefix}_per_s"] = round(pg.tps, 1)
        out[f"{prefix}_latency_ms"] = round(pg.latency_ms, 2)
        if results.http and pg.clients == results.cap and not pg.label.startswith("with key"):
            out[f"{prefix}_ratio_http"] = round(results.http[0][0].rate / pg.tps, 3)
    if results.placement:
        out["placement_round_trip_ms"] = round(results.round_trip_ms, 3)
    for placement in results.placement:
        prefix = f"placement_{placement.nodes}_{placement.layout}"
        out[f"{prefix}_place_ms"] = round(placement.place_ms, 3)
        out[f"{prefix}_admit_ms"] = round(placement.admit_ms, 3)
        out[f"{prefix}_calls"] = placement.calls
    sizes = sorted({p.nodes for p in results.placement})
    if len(sizes) >= 2:
        by = {(p.nodes, p.layout): p for p in results.placement}
        for layout in ("empty", "front", "spread"):
            low, high = by[(sizes[0], layout)], by[(sizes[-1], layout)]
            out[f"placement_growth_{layout}_place"] = round(high.place_ms / low.place_ms, 3)
            out[f"placement_growth_{layout}_admit"] = round(high.admit_ms / low.admit_ms, 3)
    return out


def report(results: Results, args: argparse.Namespace) -> None:
    if results.http:
        report_http(results, args)
        report_pgbench(results, args)
        report_aims(results)
    if results.placement:
        report_placement(results, args)
    if results.profile is not None:
        print("the api process under cProfile (a saturation run without a key; slower than unprofiled):")
        print(results.profile)


def run(args: argparse.Namespace) -> Results:
    cap = effective_max_in_flight(Options(store=PgStore(URL, schema=SCHEMA)))  # what serve's default pool gives
    with tempfile.TemporaryDirectory(prefix="bc-bench-admission-") as tmp:
        say("migrating and seeding")
        setup = prepare(args, Path(tmp))
        http: list[tuple[HttpRun, HttpRun]] = []
        pgbench: list[PgbenchRun] | None = None
        profile = None
        if not args.skip_http:
            api = Api.start(setup, profile=None)
            try:
                for with_key in (False, True) if args.with_key else (False,):
                    say(f"HTTP, {'with' if with_key else 'without'} a key")
                    http.append(bench_http(api, setup, args, with_key=with_key))
            finally:
                api.stop()
            if pgbench_binary() is not None:
                say("pgbench")
                pgbench = pgbench_runs(setup, args, cap)
            if args.profile:
                say("HTTP under cProfile")
                profile = profile_api(setup, args)
        placement, round_trip = ([], 0.0) if args.skip_placement else bench_placement(setup, args)
    return Results(cap=cap, http=http, pgbench=pgbench, placement=placement, round_trip_ms=round_trip, profile=profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=SECONDS_DEFAULT, help="each measured run (default 5)")
    parser.add_argument(
        "--warmup", type=int, default=WARMUP_DEFAULT, help="seconds before each measured run, both sides (default 2)"
    )
    parser.add_argument(
        "--connections", type=int, default=CONNECTIONS_DEFAULT, help="callers at saturation (default 32)"
    )
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per reservation (default 1)")
    parser.add_argument(
        "--nodes", type=int, default=HTTP_NODES_DEFAULT, help=f"nodes of the HTTP runs' pool ({HTTP_NODES_DEFAULT})"
    )
    parser.add_argument("--sizes", default=SIZES_DEFAULT, help=f"placement pools, nodes ({SIZES_DEFAULT})")
    parser.add_argument("--calls", type=int, default=CALLS_DEFAULT, help="timed placements per pool and layout (30)")
    parser.add_argument("--with-key", action="store_true", help="also run with an Idempotency-Key on every request")
    parser.add_argument("--profile", action="store_true", help="also profile the api process (cProfile)")
    parser.add_argument("--skip-http", action="store_true", help="placement only")
    parser.add_argument("--skip-placement", action="store_true", help="HTTP and pgbench only")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--role", choices=["client"], help=argparse.SUPPRESS)
    parser.add_argument("--client-config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "client":
        run_client_role(args.client_config)
        return
    try:
        args.sizes = [int(n) for n in args.sizes.split(",")]
    except ValueError:
        parser.error("--sizes: comma-separated whole numbers")
    if (
        args.seconds < 1
        or args.warmup < 0
        or args.connections < 1
        or not 1 <= args.gpus <= GPUS_PER_NODE
        or args.calls < 1
    ):
        parser.error(
            f"need --seconds >= 1, --warmup >= 0, --connections >= 1, --calls >= 1 and 1 <= --gpus <= {GPUS_PER_NODE}"
        )
    if args.seconds != int(args.seconds):
        parser.error("--seconds: whole seconds (pgbench takes whole seconds)")
    args.seconds = int(args.seconds)
    drop_schema()
    try:
        results = run(args)
    finally:
        with contextlib.suppress(Exception):
            drop_schema()
    if args.json:
        print(json.dumps(figures(results, args)))
    else:
        report(results, args)


if __name__ == "__main__":
    main()
