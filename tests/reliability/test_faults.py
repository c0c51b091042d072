"""The control plane as deployed, under load, through faults: what clients were told must be what the database
holds, and every part must come back on its own.

Topology (every part a real process on this machine): a PostgreSQL server of the run's own (so restarting it
disturbs no other test), PgBouncer in transaction mode in front of it, two ``api``, two ``gateway`` and three worker
processes (``better-compute serve``), the second gateway reaching the pooler through a TCP proxy the test controls,
``bcd sim`` fleets holding sessions on both gateways, and (when Debian's ``prometheus`` is installed, as CI installs
it) a Prometheus server scraping every process's ``/metrics``.

Load, all the way through: reservations over HTTP against both api processes (each with an idempotency key,
retried on the other api after an answer-less failure), a webhook subscription delivering to a receiver here, the
fleets' sessions, and a new node joining after each fault.

Faults, one after the other: ``kill -9`` of an api, of a worker and of a gateway (each then started again, as a
supervisor would); a PostgreSQL restart; a partition between the second gateway and the database; a worker stopped
with SIGSTOP past its lease, then resumed. Run with ``make test-reliability`` (CI runs it as a phase of its own);
``pytest -m reliability -s`` prints the figures.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bettercompute import JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute.modules.nodes import CreateJoinTokenInput
from bettercompute.modules.pools import CreatePoolInput
from bettercompute.modules.secrets import CreateSecretInput
from bettercompute.modules.webhooks import CreateWebhookInput, WebhookSettings
from bettercompute_iam import CreateTenantInput, EmbeddedIam, IamGroups
from bettercompute_store_pg import EmbeddedPostgres, PgStore
from tests._timing import deadline
from tests.integration._pgbouncer import running_pgbouncer

from ._leaks import dump_database, scan
from ._load import Load
from ._topology import BIN, PartitionProxy, Proc, free_port, prometheus_binary, start_prometheus, wait_until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(1500)]

TRUST_DOMAIN = "reliability.test"
LEASE_TTL = 8  # seconds; short, so the run is short, and every figure below is measured against it
IDLE_LIMIT = LEASE_TTL // 2  # how long a transaction may idle before the server (and PgBouncer) end it
SHARD_ROLES = ("controllers", "scheduler")
DATABASE_ROLES = {mode: f"bettercompute_{mode}" for mode in ("api", "worker", "gateway")}
"""The role each process mode connects as (``better-compute migrate`` makes them, named after the schema)."""
ROLE_PASSWORD = secrets.token_urlsafe(18)
"""The password the run gives those roles (``migrate`` makes them without one), which PgBouncer passes on."""
SHARDS = 256
NODES_PER_SIM = 6
PG_OUTAGE = 10  # seconds PostgreSQL stays down
START_WITHIN = 90.0
SECRET_VALUE = "reliability-plaintext-3f9a1c"  # a secret's plaintext the leak scan looks for


@contextlib.contextmanager
def run_folder() -> Iterator[Path]:
    """A folder the run's unprivileged servers can enter; kept (and named) when the run fails."""
    folder = Path(tempfile.mkdtemp(prefix="bc-reliability-"))
    folder.chmod(0o755)
    failed = True
    try:
        yield folder
        failed = False
    finally:
        if failed or os.environ.get("BETTERCOMPUTE_KEEP_RELIABILITY"):
            print(f"\nthe run's logs and state: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


class Plane:
    """The deployment under test and the SQL the assertions read."""

    def __init__(self, folder: Path, pg: EmbeddedPostgres, pooled: str, proxied: str) -> None:
        self.folder = folder
        self.pg = pg
        self.direct = pg.url
        self.pooled = pooled
        self.proxied = proxied
        self.procs: dict[str, Proc] = {}
        self.api_urls: list[str] = []
        self.metrics: dict[str, str] = {}  # process name -> host:port of its /metrics
        self.secrets: list[str] = []  # every secret handed out, for the leak scan

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.direct, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else []

    def one(self, query: str, *params: Any) -> Any:
        return self.sql(query, *params)[0][0]

    def activity(self) -> str:
        """What every server session of the run is doing, for a failure's message."""
        rows = self.sql(
            "SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid), left(query, 90) "
            "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY state"
        )
        return "\n".join(repr(row) for row in rows)

    def worker_id(self, instance: str) -> str:
        return str(self.one("SELECT id FROM bettercompute.workers WHERE instance = %s LIMIT 1", instance))

    def shards_owned_without(self, holder: str) -> bool:
        """Every shard lease of both roles is held, unexpired, by someone other than ``holder``."""
        held = self.one(
            "SELECT count(*) FROM bettercompute.leases WHERE name LIKE ANY(%s) AND holder <> %s AND expires_at > now()",
            [f"{role}/shard:%" for role in SHARD_ROLES],
            holder,
        )
        return int(held) == SHARDS * len(SHARD_ROLES)

    def lease_holders(self) -> list[tuple[Any, ...]]:
        return self.sql(
            "SELECT holder, count(*), min(expires_at) > now(), max(expires_at) > now() FROM bettercompute.leases "
            "WHERE name LIKE '%%/shard:%%' GROUP BY 1"
        )

    def last_lease_expiry(self, holder: str) -> dt.datetime:
        return self.one("SELECT max(expires_at) FROM bettercompute.leases WHERE holder = %s", holder)  # type: ignore[no-any-return]


def stop_process(popen: subprocess.Popen[bytes]) -> None:
    popen.terminate()
    try:
        popen.wait(deadline(10))
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def stop_all(plane: Plane) -> None:
    for proc in reversed(list(plane.procs.values())):
        proc.stop()


def write_config(folder: Path, pooled: str, gateway_port: int) -> Path:
    path = folder / "bettercompute.toml"
    values = {
        "database_url": pooled,
        "pgbouncer": True,
        "kms_key_file": str(folder / "kms.key"),
        "trust_domain": TRUST_DOMAIN,
        "gateway_address": f"127.0.0.1:{gateway_port}",
        "lease_ttl_seconds": LEASE_TTL,
        "webhooks_allow_private": True,
    }
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    return path


async def prepare(plane: Plane, gateway_port: int, receiver_url: str) -> dict[str, str]:
    """Through the public API in this process: the root admin, a tenant, a pool, a join token, the webhook
    subscription and a secret."""
    options = Options(
        store=PgStore(plane.direct, pool_size=2),
        iam=EmbeddedIam(),
        instance="reliability-conductor",
        kms=LocalKeyKms(plane.folder / "kms.key"),
        join=JoinSettings(gateway_address=f"127.0.0.1:{gateway_port}", trust_domain=TRUST_DOMAIN),
        webhooks=WebhookSettings(allow_private_destinations=True),  # the receiver is on loopback
    )
    compute = better_compute(options)
    await compute.initialize(migrate=False)
    try:
        assert isinstance(options.iam, EmbeddedIam)
        boot = await options.iam.bootstrap()
        assert boot.credential is not None
        root = boot.credential
        tenant = (await IamGroups(compute.api).tenants.create(root, CreateTenantInput(name="reliability"))).id
        pool = await compute.api.pools.create(root, CreatePoolInput(tenant=tenant, name="reliability"))
        token = await compute.api.join_tokens.create(
            root, CreateJoinTokenInput(pool_id=pool.id, uses=100, expires_in_seconds=3600)
        )
        hook = await compute.api.webhooks.create(
            root, CreateWebhookInput(tenant=tenant, url=receiver_url, event_types=("reservation.placed",))
        )
        await compute.api.secrets.create(
            root, CreateSecretInput(tenant=tenant, name="reliability", scope=f"pool:{pool.id}", value=SECRET_VALUE)
        )
        plane.secrets += [root, hook.secret, SECRET_VALUE, token.token]
        return {"root": root, "tenant": tenant, "pool": pool.id, "join": token.join_command}
    finally:
        await compute.close()


def serve(
    plane: Plane,
    config: Path,
    name: str,
    roles: str,
    *extra: str,
    database: str | None = None,
    env: dict[str, str] | None = None,
) -> Proc:
    # Each process logs in as its mode's role, which PostgreSQL holds to that mode's grants: a gateway may only
    # call the gateway's functions.
    mode = "gateway" if roles == "gateway" else "api" if roles == "api" else "worker"
    env = {
        **os.environ,
        "BETTERCOMPUTE_INSTANCE": name,
        "BETTERCOMPUTE_DATABASE_URL": as_role(database or plane.pooled, DATABASE_ROLES[mode]),
        **(env or {}),
    }
    argv = [str(BIN / "better-compute"), "--config", str(config), "serve", "--no-migrate", "--roles", roles, *extra]
    proc = Proc.make(name, argv, plane.folder, env)
    plane.procs[name] = proc
    proc.start()
    return proc


def as_role(url: str, role: str) -> str:
    """``url`` (PgBouncer's, which lets clients in by trust) logging in as ``role``."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))


def metrics_flag(plane: Plane, name: str) -> list[str]:
    """``--metrics-port P`` for a process without the HTTP API, noted for Prometheus to scrape."""
    port = free_port()
    plane.metrics[name] = f"127.0.0.1:{port}"
    return ["--metrics-port", str(port)]


def sim(plane: Plane, name: str, join: str, gateway_port: int, nodes: int, seed: int) -> Proc:
    words = shlex.split(join)[2:]
    words[words.index("--gateway") + 1] = f"127.0.0.1:{gateway_port}"
    argv = [str(BIN / "bcd"), "sim", "--nodes", str(nodes), "--seed", str(seed)]
    argv += ["--state-dir", str(plane.folder / name), *words]
    proc = Proc.make(name, argv, plane.folder, dict(os.environ))
    plane.procs[name] = proc
    proc.start()
    return proc


def adopted(plane: Plane) -> int:
    return int(plane.one("SELECT count(*) FROM bettercompute.nodes WHERE state = 'adopted'"))


def prometheus_query(base: str, query: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=deadline(5)) as answer:  # noqa: S310 - our own loopback server
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


class Run:
    """One run: the deployment, its load, the fleets, and the figures it reports."""

    def __init__(self, plane: Plane, proxy: PartitionProxy, load: Load, setup: dict[str, str]) -> None:
        self.plane = plane
        self.proxy = proxy
        self.load = load
        self.setup = setup
        self.gw_ports = [free_port(), free_port()]
        self.api_ports = [free_port(), free_port()]
        self.figures: dict[str, Any] = {}
        self.workers: list[Proc] = []
        self.gateways: list[Proc] = []
        self.apis: list[Proc] = []
        self.sims: list[Proc] = []
        self.expected_nodes = 0
        self.joined = 0

    def join_one(self) -> None:
        """A new node joins (on each gateway in turn), to be adopted like the others."""
        self.joined += 1
        name, gateway = f"joiner-{self.joined}", self.gw_ports[self.joined % 2]
        sim(self.plane, name, self.setup["join"], gateway, 1, 100 + self.joined)
        self.expected_nodes += 1


def _infrastructure(stack: contextlib.ExitStack, folder: Path) -> tuple[Plane, PartitionProxy]:
    """The run's own PostgreSQL, PgBouncer in front of it, and the TCP proxy the second gateway reaches it through."""
    pg = EmbeddedPostgres(folder / "pg", port=free_port())
    pg.start()
    stack.callback(pg.stop)
    # Set as docs/operations.md asks: a transaction idle for half a lease is cut (a worker stopped inside one must
    # not keep its shard); a query waits at most 5 s for a server connection (during an outage the api answers
    # UNAVAILABLE rather than holding requests); a lost server is dialled again every second.
    bouncer = running_pgbouncer(
        pg.url,
        pool_size=40,
        max_clients=500,
        log=folder / "pgbouncer.log",
        users=dict.fromkeys(DATABASE_ROLES.values(), ROLE_PASSWORD),
        settings={
            "idle_transaction_timeout": str(IDLE_LIMIT),
            "query_wait_timeout": "5",
            "server_login_retry": "1",
        },
    )
    pooled = stack.enter_context(bouncer)
    bouncer_port = urllib.parse.urlsplit(pooled).port
    assert bouncer_port is not None
    proxy = PartitionProxy(bouncer_port)
    proxy.start()
    stack.callback(proxy.close)
    proxied = pooled.replace(f":{bouncer_port}/", f":{proxy.port}/")
    plane = Plane(folder, pg, pooled, proxied)
    # Also as docs/operations.md asks, on the server: a session idle inside a transaction longer than a lease
    # is ended (PgBouncer's own limit does not see a client stopped halfway through a pipeline).
    plane.sql(f"ALTER DATABASE bettercompute SET idle_in_transaction_session_timeout = '{IDLE_LIMIT}s'")
    stack.callback(lambda: stop_all(plane))
    return plane, proxy


def _migrated(plane: Plane, config: Path) -> None:
    migrate = subprocess.run(
        [str(BIN / "better-compute"), "--config", str(config), "migrate"],
        capture_output=True,
        check=False,
        env={**os.environ, "BETTERCOMPUTE_DATABASE_URL": plane.pooled},
    )
    assert migrate.returncode == 0, migrate.stderr.decode(errors="replace")[-3000:]
    assert b"bettercompute_gateway (gateway)" in migrate.stdout, migrate.stdout
    for role in DATABASE_ROLES.values():
        plane.sql(f"ALTER ROLE {role} PASSWORD '{ROLE_PASSWORD}'")  # token_urlsafe: nothing to quote
    plane.secrets.append(ROLE_PASSWORD)


def _control_plane(run: Run, config: Path) -> None:
    """Three workers, two api processes (each with an internal listener) and two gateways (the second through the
    proxy), each running. The gateways hold no KMS key: each enrols with a one-time token on the api processes'
    internal listeners, and goes on through the other while one is down."""
    plane, gw_ports, api_ports = run.plane, run.gw_ports, run.api_ports
    internal_ports = [free_port(), free_port()]
    run.workers = [
        serve(plane, config, f"worker-{i}", "controllers,scheduler,sinks,iam", *metrics_flag(plane, f"worker-{i}"))
        for i in (1, 2, 3)
    ]
    run.apis = [
        serve(
            plane,
            config,
            f"api-{i + 1}",
            "api",
            "--port",
            str(port),
            env={"BETTERCOMPUTE_INTERNAL_PORT": str(internal_ports[i])},
        )
        for i, port in enumerate(api_ports)
    ]
    plane.metrics.update({f"api-{i + 1}": f"127.0.0.1:{port}" for i, port in enumerate(api_ports)})
    plane.api_urls = [f"http://127.0.0.1:{port}" for port in api_ports]
    for proc in run.apis:
        proc.wait_for_log("serving ", START_WITHIN)
    edge = _edge_config(config, internal_ports)
    run.gateways = [
        serve(
            plane,
            edge,
            name,
            "gateway",
            "--gateway-port",
            str(gw_ports[i]),
            *metrics_flag(plane, name),
            database=plane.proxied if i == 1 else None,
            env=_enrolment(plane, config, name),
        )
        for i, name in enumerate(("gateway-1", "gateway-2"))
    ]
    for proc in run.workers + run.gateways:
        proc.wait_for_log("running ", START_WITHIN)


def _edge_config(config: Path, internal_ports: list[int]) -> Path:
    """The gateways' configuration: the control plane's without the KMS key, with both internal listeners."""
    lines = [line for line in config.read_text().splitlines() if not line.startswith("kms_key_file")]
    lines.append(f"internal_address = {json.dumps(','.join(f'127.0.0.1:{p}' for p in internal_ports))}")
    edge = config.with_name("edge.toml")
    edge.write_text("\n".join(lines) + "\n")
    return edge


def _enrolment(plane: Plane, config: Path, name: str) -> dict[str, str]:
    """A one-time enrolment token for gateway ``name`` (minted where the KMS key is) and its state directory."""
    minted = subprocess.run(
        [str(BIN / "better-compute"), "--config", str(config), "gateways", "token", name],
        capture_output=True,
        check=False,
        env={**os.environ, "BETTERCOMPUTE_DATABASE_URL": plane.pooled},
    )
    assert minted.returncode == 0, minted.stderr.decode(errors="replace")[-3000:]
    token = minted.stdout.decode().strip()
    plane.secrets.append(token)  # the leak scan looks for it in the logs and the database
    return {
        "BETTERCOMPUTE_GATEWAY_TOKEN": token,
        "BETTERCOMPUTE_GATEWAY_STATE_DIR": str(plane.folder / f"{name}.state"),
    }


def _fleets_adopted(run: Run) -> None:
    """A ``bcd sim`` fleet on each gateway, every node adopted."""
    run.sims = [
        sim(run.plane, "sim-1", run.setup["join"], run.gw_ports[0], NODES_PER_SIM, 1),
        sim(run.plane, "sim-2", run.setup["join"], run.gw_ports[1], NODES_PER_SIM, 2),
    ]
    run.expected_nodes = 2 * NODES_PER_SIM
    run.figures["adoption_s"] = round(
        wait_until(lambda: adopted(run.plane) >= run.expected_nodes, 240, "every node adopted", every=1), 1
    )


def _kill_an_api(run: Run) -> None:
    """kill -9 an api process; clients go on through the other one; a supervisor starts it again."""
    killed_at = time.monotonic()
    run.apis[0].kill9()
    time.sleep(2)
    run.apis[0].start()
    run.apis[0].wait_for_log("serving ", START_WITHIN, occurrence=2)
    run.figures["api_kill_back_s"] = round(time.monotonic() - killed_at, 1)


def _kill_a_worker(run: Run) -> None:
    """kill -9 a worker: its shards must be owned again once its leases ran out."""
    plane = run.plane
    dead = plane.worker_id("worker-1")
    run.workers[0].kill9()
    expiry = plane.last_lease_expiry(dead)
    owned = wait_until(lambda: plane.shards_owned_without(dead), 3 * LEASE_TTL, "shards owned again", 0.1)
    run.figures["worker_kill_shards_owned_s"] = round(owned, 1)
    after_expiry = (dt.datetime.now(dt.UTC) - expiry).total_seconds()
    run.figures["worker_kill_after_lease_expiry_s"] = round(after_expiry, 1)
    assert after_expiry <= LEASE_TTL, f"shards owned {after_expiry:.1f} s after the dead worker's leases expired"
    run.workers[0].start()
    run.workers[0].wait_for_log("running ", START_WITHIN, occurrence=2)


def _kill_a_gateway(run: Run) -> None:
    """kill -9 a gateway while its nodes hold sessions; it is started again and the sessions come back."""
    killed_at = time.monotonic()
    run.gateways[0].kill9()
    cut = dt.datetime.now(dt.UTC)
    time.sleep(2)
    run.gateways[0].start()
    run.gateways[0].wait_for_log("running ", START_WITHIN, occurrence=2)

    def sessions_back() -> bool:
        fresh = run.plane.one(
            "SELECT count(*) FROM bettercompute.sessions WHERE closed_at IS NULL AND opened_at > %s "
            "AND gateway = (SELECT gateway FROM bettercompute.sessions WHERE opened_at > %s LIMIT 1)",
            cut,
            cut,
        )
        return int(fresh) >= NODES_PER_SIM

    wait_until(sessions_back, 120, "the killed gateway's sessions back", 0.5)
    run.figures["gateway_kill_sessions_back_s"] = round(time.monotonic() - killed_at, 1)


def _restart_postgres(run: Run) -> None:
    """PostgreSQL restarts under the load: the api answers UNAVAILABLE meanwhile, then serves again with no process
    restarted."""
    plane, load = run.plane, run.load
    pids_before = {name: proc.pid for name, proc in plane.procs.items() if proc.alive()}
    down_at = time.monotonic()
    plane.pg.stop()
    time.sleep(PG_OUTAGE)
    plane.pg.start()
    run.figures["pg_outage_s"] = round(time.monotonic() - down_at, 1)
    up_at = time.monotonic()
    wait_until(
        lambda: any(t > up_at for t in load.successes),
        120,
        f"a reservation after the restart (answers since: {load.failures[-10:]})",
        0.2,
    )
    run.figures["pg_restart_first_success_after_up_s"] = round(
        max(0.0, min(t for t in load.successes if t > up_at) - up_at), 1
    )
    during = [code for t, code in load.failures if down_at <= t <= up_at + 1]
    run.figures["pg_restart_failures_during"] = dict(sorted(collections.Counter(during).items()))
    assert "UNAVAILABLE" in during, f"no UNAVAILABLE during the outage: {during[:20]}"
    pids_after = {name: proc.pid for name, proc in plane.procs.items() if name in pids_before}
    assert pids_after == pids_before
    assert all(plane.procs[name].alive() for name in pids_before), "a process died in the outage"


def _partition_gateway_two(run: Run) -> None:
    """A partition between the second gateway and the database, shorter than the session timeout: no node may be
    marked unreachable or failed for it, and the gateway writes again once it heals."""
    run.proxy.partition()
    time.sleep(15)
    healed_at = dt.datetime.now(dt.UTC)
    run.proxy.heal()
    healed = time.monotonic()

    def gateway_two_writes() -> bool:
        seen = run.plane.one(
            "SELECT count(*) FROM bettercompute.sessions WHERE closed_at IS NULL AND last_seen_at > %s", healed_at
        )
        return int(seen) >= run.expected_nodes - 1  # the newest joiner may still be opening its session

    wait_until(gateway_two_writes, 60, "liveness written again after the partition", 0.5)
    run.figures["partition_liveness_back_s"] = round(time.monotonic() - healed, 1)


def _stop_a_worker(run: Run) -> None:
    """SIGSTOP a worker past its lease: its shards move; resumed, its stale writes are refused by the fence."""
    plane = run.plane
    stopped = plane.worker_id("worker-2")
    run.workers[1].signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    expiry = plane.last_lease_expiry(stopped)
    try:
        owned = wait_until(lambda: plane.shards_owned_without(stopped), 3 * LEASE_TTL, "shards moved off", 0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; leases: {plane.lease_holders()}\n{plane.activity()}") from None
    run.figures["worker_stop_shards_owned_s"] = round(owned, 1)
    after_expiry = (dt.datetime.now(dt.UTC) - expiry).total_seconds()
    run.figures["worker_stop_after_lease_expiry_s"] = round(after_expiry, 1)
    assert after_expiry <= LEASE_TTL, f"shards owned {after_expiry:.1f} s after the stopped worker's leases expired"
    time.sleep(max(0.0, LEASE_TTL - (time.monotonic() - stopped_at)) + 2)
    run.workers[1].signal(signal.SIGCONT)
    # Resumed, it finds its leases gone at its next renewal; what it had open was cut by the server meanwhile.
    run.workers[1].wait_for_log("lost ", 30)
    run.figures["worker_stop_transactions_cut"] = (
        (plane.folder / "pg" / "postgres.log").read_text().count("idle-in-transaction timeout")
    )


def _accounts_agree(run: Run) -> None:
    """The load stopped: what clients were told is what the database holds, no key twice, no atom booked twice."""
    plane, load, figures = run.plane, run.load, run.figures
    load.stop()
    figures["requests"] = load.requests
    figures["answers_by_code"] = dict(sorted(load.codes.items()))

    told = load.told
    gave_up = [t for t in told.values() if t.code is not None and t.code.startswith("gave up")]
    assert not gave_up, gave_up[:5]
    assert load.codes["http"] == 0, "an answer that was not the JSON envelope"
    acknowledged = {t.key: t.reservation for t in told.values() if t.reservation is not None}
    assert len(acknowledged) > 100, figures
    rows = plane.sql(
        "SELECT labels ->> 'rk', array_agg(id), min(state) FROM bettercompute.reservations "
        "WHERE labels ? 'rk' GROUP BY 1"
    )
    in_db = {key: ids for key, ids, _ in rows}
    duplicated = {key: ids for key, ids in in_db.items() if len(ids) > 1}
    assert not duplicated, duplicated
    lost = {key: rid for key, rid in acknowledged.items() if in_db.get(key) != [rid]}
    assert not lost, f"acknowledged but not in the database as told: {list(lost.items())[:5]}"
    refused = {t.key for t in told.values() if t.reservation is None}
    phantom = set(in_db) & refused
    assert not phantom, f"refused but recorded: {sorted(phantom)[:5]}"
    figures["reservations_acknowledged"] = len(acknowledged)

    double = plane.one(
        "SELECT count(*) FROM bettercompute.bookings a JOIN bettercompute.bookings b "
        "ON a.atom_id = b.atom_id AND a.id < b.id AND a.during && b.during"
    )
    assert double == 0


def _events_delivered_and_nodes_adopted(run: Run) -> None:
    """Every placed reservation's event delivered; every node joined adopted and stayed so: none quarantined,
    unreachable or failed by the faults."""
    plane = run.plane
    placed = {
        rid
        for (rid,) in plane.sql(
            "SELECT id FROM bettercompute.reservations WHERE labels ? 'rk' AND history @> '[{\"state\": \"placed\"}]'"
        )
    }
    wait_until(lambda: placed <= run.load.webhook_reservations("reservation.placed"), 120, "every event delivered", 1)
    run.figures["webhook_events_delivered"] = len(placed)
    wait_until(lambda: adopted(plane) >= run.expected_nodes, 120, "the joiners adopted", 1)
    states = dict(plane.sql("SELECT state, count(*) FROM bettercompute.nodes GROUP BY 1"))
    assert states == {"adopted": run.expected_nodes}, states
    run.figures["nodes"] = run.expected_nodes


def _prometheus_saw_the_faults(run: Run, prometheus: str) -> None:
    """What the faults should show to someone watching: the restart's burst of UNAVAILABLE answers, and the killed
    worker gone from the scrape while the other two took its shards."""
    unavailable = 'sum(increase(bettercompute_http_requests_total{code="UNAVAILABLE"}[30m]))'
    burst = prometheus_query(prometheus, unavailable)
    assert burst and float(burst[0]["value"][1]) > 0, burst
    run.figures["prometheus_unavailable_answers"] = round(float(burst[0]["value"][1]))
    down = prometheus_query(prometheus, 'min_over_time(up{job="worker-1"}[30m])')
    assert down and float(down[0]["value"][1]) == 0, down
    # Together the other two held every shard lease at some moment while it was dead (three share them).
    together = prometheus_query(
        prometheus,
        'max_over_time(sum(bettercompute_leases_held{job=~"worker-[23]",kind="shard"})[30m:1s])',
    )
    # (At least: a process reports what it believes it holds, and one resumed from SIGSTOP believes in its lost
    # leases until its next cycle, so the sum can briefly count a lease twice.)
    assert together and float(together[0]["value"][1]) >= SHARDS * len(SHARD_ROLES), together
    run.figures["prometheus_shard_leases_two_workers_peak"] = round(float(together[0]["value"][1]))


def _nothing_leaked(run: Run) -> None:
    """The leak scan: the database's dump and every process's log (the servers' too) hold no secret."""
    plane, folder = run.plane, run.plane.folder
    dump = dump_database(plane.direct, folder / "database.sql")
    logs = [*sorted(folder.glob("*.log")), folder / "pg" / "postgres.log"]
    state_dirs = [folder / name for name in plane.procs if name.startswith(("sim-", "joiner-"))]
    leaks = scan([dump, *logs], plane.secrets, folder / "kms.key", state_dirs)
    assert not leaks, leaks
    run.figures["leak_scan_files"] = 1 + len(logs)


def test_faults_under_load() -> None:
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(run_folder())
        plane, proxy = _infrastructure(stack, folder)
        load = Load()
        receiver_url = load.start_receiver()
        stack.callback(load.close)
        run = Run(plane, proxy, load, {})
        config = write_config(folder, plane.pooled, run.gw_ports[0])
        _migrated(plane, config)
        run.setup = asyncio.run(prepare(plane, run.gw_ports[0], receiver_url))
        _control_plane(run, config)
        _fleets_adopted(run)

        prometheus: str | None = None
        if prometheus_binary() is not None:
            popen, prometheus = start_prometheus(folder, plane.metrics)
            stack.callback(stop_process, popen)
        elif os.environ.get("CI"):
            pytest.fail("prometheus is not installed (apt-get install prometheus); CI must run it")

        # The load, all the way through; a new node joins after each fault.
        load.start(plane.api_urls, run.setup["root"], run.setup["tenant"], run.setup["pool"], callers=3, pause=0.2)
        time.sleep(10)
        for fault in (
            _kill_an_api,
            _kill_a_worker,
            _kill_a_gateway,
            _restart_postgres,
            _partition_gateway_two,
            _stop_a_worker,
        ):
            fault(run)
            run.join_one()

        # The end of the load, and the accounts.
        time.sleep(5)
        _accounts_agree(run)
        _events_delivered_and_nodes_adopted(run)
        if prometheus is not None:
            _prometheus_saw_the_faults(run, prometheus)
        for proc in run.sims:
            assert proc.alive(), f"{proc.name} ended"
        _nothing_leaked(run)
        print("\nreliability figures:\n" + json.dumps(run.figures, indent=2))
        (Path(os.environ.get("BETTERCOMPUTE_RELIABILITY_REPORT", folder / "figures.json"))).write_text(
            json.dumps(run.figures, indent=2)
        )
