"""IAM decisions per second, cached and uncached, next to pgbench running the SQL the uncached paths run.

Measures the embedded IAM on one control plane (default 30 s caches) and on a second one with ``cache_ttl=0``:

    (a) authenticate, cached          (b) authenticate, uncached: one credential lookup per call
    (c) require, grants cached        (d) require, uncached: one grants query per call
    (e) a whole in-process ``compute.api.system.whoami`` call (authenticate + dispatch + codec), cached and uncached
    (f) RemoteIam.require against the cached plane over httpx.ASGITransport (HTTP without a network)

then pgbench with the same credential lookup and grants query (the package's own statements, parameters filled
in), so the ratios show what Python, the store and psycopg cost on top of PostgreSQL; and the lookup between BEGIN
and ROLLBACK, what the read would cost in a transaction of its own (three round trips, not one).

    python bench/iam.py            # BETTERCOMPUTE_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/test
    python bench/iam.py --json     # the same figures as one JSON object on stdout (bench/run.py reads it)

Takes about 20 seconds. Uses (and drops) the schema ``bc_bench_iam``.
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
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import psycopg

from bettercompute import BetterCompute, Options, better_compute
from bettercompute.modules.system import WhoamiInput
from bettercompute.ports import Identity, ResourceRef
from bettercompute_iam import EmbeddedIam, RemoteIam
from bettercompute_iam._credentials import parse
from bettercompute_iam._pg import IamTables
from bettercompute_store_pg import PgStore

URL = os.environ.get("BETTERCOMPUTE_DATABASE_URL", "").strip() or "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = "bc_bench_iam"
CLIENTS = 4  # concurrent callers where the database is on the path, and pgbench clients; the pool has as many
SECONDS = 1.5  # per Python measurement
PGBENCH_SECONDS = 3
ACTION = "compute:reservations:create"
RESOURCE = ResourceRef(type="reservations", tenant="root")
AUTHENTICATE_UNCACHED = "(b) authenticate, uncached (1 SELECT)"  # the rows the pgbench ratios are of
REQUIRE_UNCACHED = "(d) require, uncached (1 SELECT)"


def drop_schema() -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


async def rate(call: Callable[[], Awaitable[object]], *, clients: int = 1) -> float:
    """Calls per second of ``call`` from ``clients`` concurrent loops, after a warm-up that opens the connections."""

    async def warm_up() -> None:
        for _ in range(20):
            await call()

    await asyncio.gather(*(warm_up() for _ in range(clients)))
    done = 0
    deadline = time.monotonic() + SECONDS

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            await call()
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(clients)))
    return done / (time.monotonic() - started)


async def plane(iam: EmbeddedIam) -> BetterCompute:
    compute = better_compute(Options(store=PgStore(URL, schema=SCHEMA, pool_size=CLIENTS), iam=iam))
    await compute.initialize()
    return compute


def one_line(sql: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        sql = sql.replace(name, value)
    return " ".join(sql.split()) + ";\n"


def pgbench(sql: str) -> float | None:
    binary = shutil.which("pgbench")
    if binary is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "iam.sql"
        script.write_text(sql)
        command = [binary, "-n", "-M", "prepared", "-f", str(script), "-c", str(CLIENTS), "-j", "2"]
        result = subprocess.run(
            [*command, "-T", str(PGBENCH_SECONDS), URL], capture_output=True, text=True, check=False
        )
    match = re.search(r"tps = ([0-9.]+)", result.stdout)
    if result.returncode != 0 or match is None:
        raise SystemExit(f"pgbench failed:\n{result.stdout}\n{result.stderr}")
    return float(match.group(1))


Rows = list[tuple[str, float, int]]
"""(label, calls per second, concurrent callers) of each Python measurement, in order."""


async def python_rates(
    iams: tuple[EmbeddedIam, EmbeddedIam],
    planes: tuple[BetterCompute, BetterCompute],
    remote: RemoteIam,
    credential: str,
    identity: Identity,
) -> Rows:
    """(a) to (f) on the cached and the uncached IAM and plane: the IAM's calls, whole calls, RemoteIam over ASGI."""
    (cached_iam, uncached_iam), (cached, uncached) = iams, planes
    rows: Rows = []

    async def measure(name: str, call: Callable[[], Awaitable[object]], clients: int = 1) -> None:
        rows.append((name, await rate(call, clients=clients), clients))

    whoami = WhoamiInput()
    await measure("(a) authenticate, cached", lambda: cached_iam.authenticate(credential))
    await measure(AUTHENTICATE_UNCACHED, lambda: uncached_iam.authenticate(credential), CLIENTS)
    await measure("(c) require, grants cached", lambda: cached_iam.require(identity, ACTION, RESOURCE))
    await measure(REQUIRE_UNCACHED, lambda: uncached_iam.require(identity, ACTION, RESOURCE), CLIENTS)
    await measure("(e) api.system.whoami, cached", lambda: cached.api.system.whoami(credential, whoami))
    await measure("(e) api.system.whoami, uncached", lambda: uncached.api.system.whoami(credential, whoami), CLIENTS)
    await measure("(f) RemoteIam.require over ASGI", lambda: remote.require(identity, ACTION, RESOURCE), CLIENTS)
    return rows


def pgbench_scripts(compute: BetterCompute, credential: str, identity: Identity) -> dict[str, str]:
    """The SQL of the uncached paths, parameters filled in, by the name of its pgbench figure."""
    tables = IamTables(compute.context.store)
    parsed = parse(credential)
    assert parsed is not None
    credential_sql = one_line(tables._credential.query, {"%(id)s": f"'{parsed.id}'"})
    return {
        "credential_lookup": credential_sql,
        "grants_query": one_line(tables._grants.query, {"%(principal)s": f"'{identity.principal_id}'"}),
        # The same read wrapped in a transaction, as it would be without the store's one-round-trip path.
        "credential_lookup_in_tx": f"BEGIN;\n{credential_sql}ROLLBACK;\n",
    }


async def measure_planes() -> tuple[Rows, dict[str, str]]:
    """The Python rates, on a cached plane and an uncached one, and the SQL pgbench runs."""
    cached_iam = EmbeddedIam()
    uncached_iam = EmbeddedIam(cache_ttl=dt.timedelta(0))
    cached = await plane(cached_iam)
    uncached = await plane(uncached_iam)
    remote: RemoteIam | None = None
    try:
        boot = await cached_iam.bootstrap()
        assert boot.credential is not None
        credential = boot.credential
        identity = await cached_iam.authenticate(credential)
        # The root admin holds iam:*:* on the root scope, so it may call the authz group for RemoteIam too.
        remote = RemoteIam(
            "http://central", credential, cache_ttl=dt.timedelta(0), transport=httpx.ASGITransport(app=cached.asgi)
        )
        rows = await python_rates((cached_iam, uncached_iam), (cached, uncached), remote, credential, identity)
        return rows, pgbench_scripts(cached, credential, identity)
    finally:
        if remote is not None:
            await remote.aclose()
        await uncached.close()
        await cached.close()


def report_json(rows: Rows, pg: dict[str, float | None]) -> None:
    rates = {name: value for name, value, _ in rows}
    out: dict[str, float | int | None] = {"callers": CLIENTS}
    for name, value in rates.items():
        out[name_of(name) + "_per_s"] = round(value, 1)
    for name, tps in pg.items():
        out[f"pgbench_{name}_per_s"] = None if tps is None else round(tps, 1)
    authenticate, require = rates[AUTHENTICATE_UNCACHED], rates[REQUIRE_UNCACHED]
    lookup, grants = pg["credential_lookup"], pg["grants_query"]
    out["ratio_authenticate_uncached_credential_lookup"] = None if lookup is None else round(authenticate / lookup, 3)
    out["ratio_require_uncached_grants_query"] = None if grants is None else round(require / grants, 3)
    print(json.dumps(out))


def report_text(rows: Rows, pg: dict[str, float | None]) -> None:
    print("IAM decisions/s, and the time one call takes (callers / rate)")
    for name, value, clients in rows:
        print(f"  {name:<40} {value:>10,.0f}/s  {clients} caller(s)  {1e6 * clients / value:>8.1f} µs")
    lookup, grants, lookup_tx = pg["credential_lookup"], pg["grants_query"], pg["credential_lookup_in_tx"]
    if lookup is None or grants is None or lookup_tx is None:
        print("pgbench not installed (postgresql-client); no comparison")
        return
    rates = {name: value for name, value, _ in rows}
    authenticate, require = rates[AUTHENTICATE_UNCACHED], rates[REQUIRE_UNCACHED]
    print(f"pgbench, same SQL, {CLIENTS} clients, prepared")
    print(f"  {'credential lookup':<40} {lookup:>10,.0f}/s")
    print(f"  {'grants query':<40} {grants:>10,.0f}/s")
    print(f"  {'BEGIN; credential lookup; ROLLBACK':<40} {lookup_tx:>10,.0f}/s")
    print("ratios")
    print(f"  (b) authenticate uncached / pgbench credential lookup:  {authenticate / lookup:.2f}")
    print(f"  (b) authenticate uncached / pgbench lookup in BEGIN..:  {authenticate / lookup_tx:.2f}")
    print(f"  (d) require uncached / pgbench grants query:            {require / grants:.2f}")


async def main(as_json: bool) -> None:
    drop_schema()
    try:
        rows, scripts = await measure_planes()
        pg = {name: pgbench(sql) for name, sql in scripts.items()}
    finally:
        drop_schema()
    (report_json if as_json else report_text)(rows, pg)


def name_of(label: str) -> str:
    """``"(b) authenticate, uncached (1 SELECT)"`` -> ``"b_authenticate_uncached_1_select"``, a JSON key."""
    return "_".join(re.findall(r"[a-z0-9]+", label.lower()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    asyncio.run(main(parser.parse_args().json))
