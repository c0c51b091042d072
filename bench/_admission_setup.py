"""What ``bench/admission.py``'s parts share (and ``bench/shedding.py`` reuses): where the database is, the schema's
name, the sizes and names of things, small helpers (processes' CPU, pgbench, PostgreSQL's function counts), and the
setup every run starts from: the schema migrated by ``better-compute migrate``, a tenant admin with a credential,
the pools, and fleets seeded in SQL as the inventory controller leaves them.

``SCHEMA`` is read when a function runs, so a bench that reuses these parts points them at its own schema by setting
it first (``bench/shedding.py`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import psycopg

from bettercompute import JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute.modules.pools import CreatePoolInput
from bettercompute_iam import (
    CreateBindingInput,
    CreateCredentialInput,
    CreatePrincipalInput,
    CreateTenantInput,
    EmbeddedIam,
    IamGroups,
)
from bettercompute_store_pg import PgStore

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
            if table not in ("bookings", "placement_holds", "placement_nodes", "audit"):  # hints follow bookings
                conn.execute(f"DELETE FROM {s}.{table}")
        # The audit log is append-only (a trigger refuses DELETE): the bench, a superuser, empties it with triggers
        # off, links and all.
        conn.execute("SET session_replication_role = replica")
        conn.execute(f"DELETE FROM {s}.audit_chain")
        conn.execute(f"DELETE FROM {s}.audit")
        conn.execute("SET session_replication_role = origin")
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
