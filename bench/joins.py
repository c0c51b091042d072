"""JoinService throughput in process: joins/s through ``compute.gateway_services.join``, where one join's time goes,
and pgbench running the same SQL as the baseline.

One join is what the gateway hands over for ``bcd join``: open the HPKE-sealed token (its nonce recorded in
``replay_nonces``), read the token with its pool (one statement), check the CSR and the claims, run the ``claims``
attestor, take the CA key and the trust bundle from the process's cache (re-read at most once a second), then one
transaction (insert the node, sign its certificate and record it if its CA key is still the active one, project
it, spend a use of the token, audit it, publish ``node.joined``): 8 statements and BEGIN and COMMIT in 6 round
trips, as the store sends BEGIN with the first statement and the writes no one reads (projection, audit row,
event) with the next statement or the COMMIT. What the daemon does (make its key and CSR, seal the token) happens
before the clock starts, as it is not the server's cost. A sealed token carries the time it was sealed and is
refused after 5 minutes, so each batch is sealed just before it is sent.

(1) Throughput. ``--callers`` concurrent callers (asyncio tasks in this one process) make ``--joins`` joins, each
    for its own machine (a distinct serial, hence hardware key), after a few untimed warm-up joins each. Twice: with
    one token per caller, and with one token shared by every caller (one token for a whole rack). joins/s is the
    joins over the wall time of the batch; p50, p99 and max are the latencies of single calls at that concurrency;
    CPU/join is this process's CPU time over the batch divided by the joins, and cores is that CPU time over the wall
    time (1.00: the Python process is saturated).

(2) Breakdown. One caller joining machines one after another gives the time of a join without queueing: (c), split
    into this process's CPU time and the rest, which is waiting on PostgreSQL. Beside it, the CPU steps alone, each
    timed over ``CPU_REPEATS`` fresh inputs without any database: (a) unseal, an ``Unsealer`` with an
    ``InMemoryReplayGuard``; the CSR check (parse, verify its signature), which a join runs once (``JoinService``
    hands the checked key to ``CertificateAuthority.issue``); (b) CA signing, CPU only: a leaf built the way
    ``issue`` builds it (same names, extensions and lifetime, a P-256 CA key, PEM out) by code in this file.
    ``issue()`` itself is not timed, because it also records the certificate in the store.

(3) Baseline. pgbench runs the store's own statements (imported from ``bettercompute_store_pg``; bound parameters,
    prepared) on the same tables, with as many clients as there are callers and with the same token arrangement, as
    two scripts: "transaction" is the join's transaction (BEGIN, node enroll, certificate record, projection, token
    consume, audit, outbox publish, COMMIT), in the same pipelines as the store sends them; "whole join" also has
    the nonce insert and the token-with-pool read before it (the same statements and round trips as a join). One
    random number per transaction serves as node id, hardware key,
    serial and nonce. The outbox event's key is set to it with ``jsonb_set``. NULLs are bound as ``'null'`` through
    ``NULLIF``. pgbench's token rows are inserted directly. After each run, the token uses spent must equal the
    transactions pgbench counted. The ratio joins/s / pgbench tx/s is what Python, the cryptography, the store and
    psycopg cost on top of PostgreSQL (every statement runs on psycopg directly, on the store's own pool).
    Against "whole join" the two sides do the same work in the database.

(4) Through the internal channel. The same per-caller batch again, but made the way a keyless gateway makes it: a
    child process (the gateway's side: ``bench/joins.py --gateway-side``) enrols with a one-time gateway token on an
    ``InternalListener`` that this process runs on loopback (gRPC over mutual TLS, as ``serve --roles api`` does),
    then its callers join through ``RemoteGatewayServices``. The child seals its tokens before its clock starts, as
    in (1). The ratio is its joins/s over the in-process joins/s of (1): what the extra hop costs. CPU/join is this
    (the api) process's CPU over the child's batch, divided by its joins.

Reading the numbers: on 2 cores, Python and PostgreSQL share the machine, and the Python side is one process (one
core at most). If cores is near 1.00, joins/s is about 1 / CPU per join, and more callers will not raise it; more
processes would. Compare (a) + CSR check + (b) with the CPU line of (2) to see how much of a join is cryptography.
If the shared-token rows fall below the per-caller rows, joins are queueing on the token's row lock. A transaction
holds that lock from the consume (its last write but two) to its COMMIT. pgbench's shared-token
figure is the ceiling for joins on a single token, however fast the Python side gets.

    python bench/joins.py                 # BETTERCOMPUTE_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/test
    python bench/joins.py --joins 1000 --callers 16 --seconds 5
    python bench/joins.py --json          # the same figures as one JSON object on stdout (bench/run.py reads it)
    python bench/joins.py --no-internal   # without (4)

Takes about 20 seconds with the defaults. Uses (and drops) the schema ``bc_bench_joins``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import glob
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import psycopg
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bettercompute import BetterCompute, JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute.modules.nodes import (
    CERTIFICATES,
    JOIN_KEYS,
    CreatedJoinToken,
    CreateJoinTokenInput,
    GatewayServices,
    new_token,
)
from bettercompute.modules.nodes._sealing import REPLAY_SCOPE, JoinKeyPair, Unsealer
from bettercompute.modules.nodes._x509 import checked_csr_key
from bettercompute.modules.pools import CreatePoolInput, Pool
from bettercompute.testing import InMemoryReplayGuard
from bettercompute_daemon.identity import NodeKey, join_binding, seal_token
from bettercompute_gateway import GatewayIdentity, GatewayServicesPort, InternalListener
from bettercompute_iam import CreateTenantInput, EmbeddedIam, IamGroups
from bettercompute_store_pg import PgStore
from bettercompute_store_pg._outbox import _PUBLISH
from bettercompute_store_pg._replay import _FIRST_USE
from bettercompute_store_pg._transaction import _AUDIT, _PROJECT
from bettercompute_store_pg.modules.nodes._certificates import _RECORD
from bettercompute_store_pg.modules.nodes._join_tokens import _TOKEN_CONSUME, _TOKEN_MATCHING
from bettercompute_store_pg.modules.nodes._nodes import _ENROLL

URL = os.environ.get("BETTERCOMPUTE_DATABASE_URL", "").strip() or "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = "bc_bench_joins"
TRUST_DOMAIN = "bench.example.test"
GATEWAY = "gw.bench.example.test:443"
PRODUCT = "PowerEdge XE9680"
JOINS = 300  # per throughput run
CALLERS = 8
WARMUP_PER_CALLER = 3  # joins each caller makes first, untimed (connections, prepared statements)
SOLO_JOINS = 60  # one caller, one join after another: the time of a join with no queueing
CPU_REPEATS = 300
PGBENCH_SECONDS = 3
MAX_USES = 10_000  # the most uses a join token can have (join_tokens.uses)
SEALED_MAX_AGE = dt.timedelta(minutes=5)
PGBENCH_SECRET = b"pgbench-secret"
SHARED_TOKEN = "pgbench-shared"  # noqa: S105 - the id of pgbench's shared token row, not a secret


def drop_schema() -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


# --- the control plane ----------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Plane:
    """A control plane with JoinService on, a tenant and a GPU pool in it, and what pgbench needs to know."""

    compute: BetterCompute
    services: GatewayServices
    credential: str
    tenant: str
    pool: str
    join_key: str  # JoinService's public key, as ``bcd`` is given it
    ca_key_id: str


@contextlib.asynccontextmanager
async def open_plane(folder: Path, callers: int) -> AsyncIterator[Plane]:
    store = PgStore(URL, schema=SCHEMA, pool_size=callers)
    iam = EmbeddedIam()
    options = Options(
        store=store,
        iam=iam,
        instance="bench-joins",
        kms=LocalKeyKms(folder / "kms.key"),
        join=JoinSettings(gateway_address=GATEWAY, trust_domain=TRUST_DOMAIN, sealed_token_max_age=SEALED_MAX_AGE),
    )
    compute = better_compute(options)
    await compute.initialize()
    try:
        boot = await iam.bootstrap()
        assert boot.credential is not None
        root = boot.credential
        tenant = (await IamGroups(compute.api).tenants.create(root, CreateTenantInput(name="acme"))).id
        pool: Pool = await compute.api.pools.create(root, CreatePoolInput(tenant=tenant, name="gpus"))
        join_key = await store.repository(JOIN_KEYS).active()
        assert join_key is not None
        ca_keys = [
            k for k in await store.repository(CERTIFICATES).keys(TRUST_DOMAIN) if k.state == "active" and not k.is_root
        ]
        assert len(ca_keys) == 1  # the active intermediate, which signs node certificates
        yield Plane(
            compute=compute,
            services=compute.gateway_services,
            credential=root,
            tenant=tenant,
            pool=pool.id,
            join_key=join_key.public_key,
            ca_key_id=ca_keys[0].id,
        )
    finally:
        await compute.close()


async def new_tokens(plane: Plane, count: int, uses: int) -> list[str]:
    """``count`` join tokens of ``plane.pool`` with ``uses`` uses each (the token texts ``bcd join`` is given)."""
    tokens = []
    for _ in range(count):
        created: CreatedJoinToken = await plane.compute.api.join_tokens.create(
            plane.credential, CreateJoinTokenInput(pool_id=plane.pool, uses=uses, expires_in_seconds=3600)
        )
        tokens.append(created.token)
    return tokens


# --- (1) throughput -------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Join:
    """What a daemon sends: its token sealed now, a CSR for its fresh key, its hardware claims."""

    sealed_token: bytes
    csr_pem: str
    claims: dict[str, Any]


def prepare(plane: Plane, token: str, serials: Sequence[str]) -> list[Join]:
    """The daemon's side of joining these machines with ``token``, done before the clock starts."""
    return seal_batch(plane.join_key, token, serials)


def seal_batch(join_key: str, token: str, serials: Sequence[str]) -> list[Join]:
    """What ``bcd join`` sends for each of these machines: a fresh key's CSR, claims, the token sealed to
    ``join_key``."""
    joins = []
    for serial in serials:
        csr_pem = NodeKey().csr_pem()
        claims = {"hostname": f"host-{serial.lower()}", "serial": serial, "product": PRODUCT}
        binding = join_binding(csr_pem, claims)
        joins.append(Join(sealed_token=seal_token(join_key, token, binding=binding), csr_pem=csr_pem, claims=claims))
    return joins


@attrs.frozen(kw_only=True)
class JoinRun:
    """A batch of joins: its wall time, this process's CPU time over it, and each call's latency (seconds)."""

    joins: int
    seconds: float
    cpu_seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.joins / self.seconds

    @property
    def cpu_per_join(self) -> float:
        return self.cpu_seconds / self.joins


async def drive(services: GatewayServicesPort, work: Sequence[Sequence[Join]]) -> JoinRun:
    """One caller per list of ``work``, each joining its machines one after another."""
    latencies: list[float] = []

    async def caller(joins: Sequence[Join]) -> None:
        for join in joins:
            started = time.perf_counter()
            await services.join(sealed_token=join.sealed_token, csr_pem=join.csr_pem, claims=join.claims)
            latencies.append(time.perf_counter() - started)

    cpu = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(caller(joins) for joins in work))
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu
    return JoinRun(joins=len(latencies), seconds=seconds, cpu_seconds=cpu_seconds, latencies=latencies)


async def bench_joins(plane: Plane, *, label: str, joins: int, callers: int, shared: bool) -> JoinRun:
    """``joins`` joins (after the warm-up) from ``callers`` callers; one token for all of them, or one each."""
    counts = [joins // callers + (1 if c < joins % callers else 0) for c in range(callers)]
    if shared:
        token = (await new_tokens(plane, 1, joins + WARMUP_PER_CALLER * callers))[0]
        tokens = [token] * callers
    else:
        tokens = await new_tokens(plane, callers, max(counts) + WARMUP_PER_CALLER)

    def batch(phase: str, sizes: Sequence[int]) -> list[list[Join]]:
        return [
            prepare(plane, tokens[c], [f"SN-{label}-{phase}-{c}-{n}" for n in range(size)])
            for c, size in enumerate(sizes)
        ]

    await drive(plane.services, batch("w", [WARMUP_PER_CALLER] * callers))
    return await drive(plane.services, batch("t", counts))


# --- (4) through the internal channel -------------------------------------------------------------------------------

LISTENER_HOSTS = ("127.0.0.1",)
THIS_FILE = str(Path(__file__).resolve())
GATEWAY_NAME = "gw-bench"


@attrs.frozen(kw_only=True)
class InternalRun:
    """The child's batch as it timed it, and this (the api) process's CPU time meanwhile."""

    run: JoinRun
    api_cpu_seconds: float


async def bench_internal(plane: Plane, folder: Path, *, joins: int, callers: int) -> InternalRun:
    """``joins`` joins from ``callers`` callers in a child process, each with a token of its own, through an
    ``InternalListener`` on loopback."""
    counts = [joins // callers + (1 if c < joins % callers else 0) for c in range(callers)]
    tokens = await new_tokens(plane, callers, max(counts) + WARMUP_PER_CALLER)
    assert plane.services.enrolment is not None
    listener = InternalListener(plane.services, name="api-bench", hosts=LISTENER_HOSTS)
    port = await listener.start(LISTENER_HOSTS[0], 0)
    try:
        task = {
            "port": port,
            "trust_domain": TRUST_DOMAIN,
            "gateway_token": await plane.services.enrolment.mint(GATEWAY_NAME),
            "state": str(folder / "gateway-state"),
            "join_key": plane.join_key,
            "tokens": tokens,
            "counts": counts,
            "label": os.urandom(4).hex(),  # serials of their own, so another run in this plane does not collide
        }
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            THIS_FILE,
            "--gateway-side",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(task).encode() + b"\n")
        await child.stdin.drain()
        ready = await child.stdout.readline()  # the child's warm-up is done and its batch sealed: the clock starts
        if ready.strip() != b"ready":
            _, err = await child.communicate()
            raise SystemExit(f"the gateway side failed:\n{err.decode()}")
        cpu = time.process_time()
        out, err = await child.communicate()
        api_cpu = time.process_time() - cpu
        if child.returncode != 0:
            raise SystemExit(f"the gateway side failed:\n{err.decode()}")
        timed = json.loads(out)
        return InternalRun(
            run=JoinRun(
                joins=len(timed["latencies"]),
                seconds=timed["seconds"],
                cpu_seconds=timed["cpu_seconds"],
                latencies=timed["latencies"],
            ),
            api_cpu_seconds=api_cpu,
        )
    finally:
        await listener.close()


async def gateway_side() -> None:
    """The child of (4): enrol, warm up, seal the batch, say ``ready``, join, print the timings as JSON."""
    task = json.loads(sys.stdin.readline())
    identity = GatewayIdentity(
        Path(task["state"]),
        name=GATEWAY_NAME,
        hosts=LISTENER_HOSTS,
        addresses=[(LISTENER_HOSTS[0], task["port"])],
        trust_domain=task["trust_domain"],
        token=task["gateway_token"],
    )
    services, _, _ = await identity.open()
    try:
        key = task["join_key"]

        def batch(phase: str, sizes: Sequence[int]) -> list[list[Join]]:
            return [
                seal_batch(
                    key, task["tokens"][c], [f"SN-internal-{task['label']}-{phase}-{c}-{n}" for n in range(size)]
                )
                for c, size in enumerate(sizes)
            ]

        await drive(services, batch("w", [WARMUP_PER_CALLER] * len(task["counts"])))
        work = batch("t", task["counts"])
        print("ready", flush=True)
        timed = await drive(services, work)
    finally:
        identity.close()
    print(json.dumps({"seconds": timed.seconds, "cpu_seconds": timed.cpu_seconds, "latencies": timed.latencies}))


# --- (2) breakdown: the CPU steps alone -----------------------------------------------------------------------------


def self_signed_ca() -> tuple[ec.EllipticCurvePrivateKey, str]:
    """A P-256 CA key and its certificate (PEM), of the kind ``CertificateAuthority`` makes."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Better Compute bench CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert.public_bytes(serialization.Encoding.PEM).decode()


def sign_leaf(
    ca_key: ec.EllipticCurvePrivateKey, ca_pem: str, public_key: ec.EllipticCurvePublicKey, node_id: str
) -> str:
    """The CPU part of ``CertificateAuthority.issue``, written out here: the CA certificate read from its PEM (as
    ``issue`` reads it each time), a 24-hour node leaf with the same names and extensions, signed, as PEM."""
    ca_cert = x509.load_pem_x509_certificate(ca_pem.encode())
    not_before = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=1)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Better Compute"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "node"),
            x509.NameAttribute(NameOID.COMMON_NAME, node_id),
        ]
    )
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    spiffe_id = f"spiffe://{TRUST_DOMAIN}/node/{node_id}"
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + dt.timedelta(hours=24))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(spiffe_id)]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@attrs.frozen(kw_only=True)
class CpuSteps:
    """Seconds per operation."""

    unseal: float
    csr_check: float
    sign: float


async def per_call(inputs: Sequence[Any], call: Callable[[Any], Awaitable[object]]) -> float:
    started = time.perf_counter()
    for item in inputs:
        await call(item)
    return (time.perf_counter() - started) / len(inputs)


async def bench_cpu(repeats: int) -> CpuSteps:
    pair = JoinKeyPair.generate()
    unsealer = Unsealer(pair, InMemoryReplayGuard())
    token = new_token()[1]
    sealed = [seal_token(pair.public_key_text(), token, binding=bytes(32)) for _ in range(repeats)]
    csrs = [NodeKey().csr_pem() for _ in range(repeats)]
    ca_key, ca_pem = self_signed_ca()
    keys = []
    for csr in csrs:
        key = x509.load_pem_x509_csr(csr.encode()).public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey)
        keys.append(key)

    async def unseal(item: bytes) -> object:
        return await unsealer.unseal(item, now=dt.datetime.now(dt.UTC), max_age=SEALED_MAX_AGE)

    async def check(item: str) -> object:
        return checked_csr_key(item)

    async def sign(item: tuple[int, ec.EllipticCurvePublicKey]) -> object:
        return sign_leaf(ca_key, ca_pem, item[1], f"node_{item[0]:016x}")

    return CpuSteps(
        unseal=await per_call(sealed, unseal),
        csr_check=await per_call(csrs, check),
        sign=await per_call(list(enumerate(keys)), sign),
    )


# --- (3) baseline: pgbench on the join's SQL ------------------------------------------------------------------------


def one_line(statement: str, renames: Mapping[str, str] | None = None) -> str:
    """``statement`` on one line, schema filled in, parameters renamed to pgbench variables (``:id`` -> ``:tok``)."""
    statement = statement.replace("{s}", f'"{SCHEMA}"')
    for old, new in (renames or {}).items():
        statement = re.sub(re.escape(old) + r"\b", new, statement)
    return " ".join(statement.split()) + ";"


def pgbench_script(*, whole: bool, shared: bool) -> str:
    """One join's statements; ``:n`` is a fresh random number per transaction (node id, hardware key, serial,
    nonce), ``:tok`` the client's token (``-D tok=...`` when shared, else the client's own row)."""
    # Before the transaction: the nonce, then the token with its pool. The CA's keys and the trust bundle are
    # cached by the process (re-read at most once a second), so no statement stands for them.
    before = [
        one_line(_FIRST_USE, {":nonce": ":n", ":expires_at": ":far"}),
        one_line(_TOKEN_MATCHING, {":id": ":tok", ":secret_hash": ":hash"}),
    ]
    # The event's key is the node id, so each transaction gets its own outbox_keys row, as a join does.
    publish = _PUBLISH.replace(
        "CAST(:events AS jsonb)", "jsonb_set(CAST(:events AS jsonb), '{0,key}', to_jsonb(CAST(:n AS text)))"
    )
    consume = one_line(_TOKEN_CONSUME, {":id": ":tok", ":secret_hash": ":hash"})
    # The round trips a join makes: BEGIN goes with the enroll, the projection with the consume, the audit row and
    # the event with the COMMIT (a pipeline each, as the store sends them).
    transaction = [
        "\\startpipeline",
        "BEGIN;",
        one_line(
            _ENROLL,
            {":new_id": ":n", ":pool_id": ":pool", ":hardware_key": ":n", ":join_token_id": ":tok"},
        ),
        "\\endpipeline",
        one_line(  # the record checks the signing key is still the active one
            _RECORD,
            {
                ":serial": ":n",
                ":node_id": ":n",
                ":spiffe_id": ":spiffe",
                ":ca_key_id": ":cakey",
                ":not_before": ":now",
                ":not_after": ":later",
                ":key_sha256": ":keyhash",
            },
        ),
        "\\startpipeline",
        one_line(_PROJECT.replace(":owner", "NULLIF(:owner, 'null')"), {":type": ":rtype", ":id": ":n"}),
        consume,  # spent last, so the token's row lock is held as briefly as possible
        "\\endpipeline",
        "\\startpipeline",
        one_line(
            _AUDIT.replace(":decision_id", "NULLIF(:decision_id, 'null')"),
            {":resource_type": ":rtype", ":resource_id": ":n"},
        ),
        one_line(publish),
        "COMMIT;",
        "\\endpipeline",
    ]
    after: list[str] = []
    head = ["\\set n random(1, 9000000000000000000)"]
    if not shared:
        head.append("\\set tok :client_id")
    body = [*before, *transaction, *after] if whole else transaction
    return "\n".join(head + body) + "\n"


def pgbench_variables(plane: Plane) -> dict[str, str]:
    now = dt.datetime.now(dt.UTC)
    hardware: dict[str, Any] = {
        "hostname": "host-pgbench",
        "serial": "SN-PGBENCH",
        "system_uuid": None,
        "product": PRODUCT,
        "vendor": None,
        "gpu_model": None,
        "gpu_count": 0,
        "gpu_uuids": [],
    }
    details = {"pool_id": plane.pool, "reclaimed": False, "serial": "f" * 32, "hardware_key": "hk_" + "0" * 64}
    event = {"node_id": "node_pgbench", "tenant": plane.tenant, "pool_id": plane.pool, "reclaimed": False}
    events = [{"ord": 0, "type": "node.joined", "key": "", "payload": {**event, "enrollments": 1}}]
    return {
        "scope": REPLAY_SCOPE,
        "far": (now + dt.timedelta(hours=1)).isoformat(),
        "now": "now",
        "hash": "\\x" + hashlib.sha256(PGBENCH_SECRET).hexdigest(),
        "tok": SHARED_TOKEN,
        "td": TRUST_DOMAIN,
        "pool": plane.pool,
        "tenant": plane.tenant,
        "claims": json.dumps(hardware),
        "attestation": "{}",
        "reclaim": "false",
        "spiffe": f"spiffe://{TRUST_DOMAIN}/node/node_pgbench",
        "role": "node",
        "cakey": plane.ca_key_id,
        "later": (now + dt.timedelta(hours=24)).isoformat(),
        "keyhash": "0" * 64,
        "rtype": "node",
        "owner": "null",
        "action": "compute:nodes:join",
        "actor": "join-token:pgbench",
        "decision_id": "null",
        "outcome": "ok",
        "details": json.dumps(details),
        "events": json.dumps(events),
    }


def pgbench_binary() -> str | None:
    found = shutil.which("pgbench")
    if found is not None:
        return found
    installed = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))
    return installed[-1] if installed else None


def pgbench_tokens(plane: Plane, clients: int) -> list[str]:
    """pgbench's token rows (``SHARED_TOKEN``, and ``0`` .. ``clients - 1`` for one per client), all uses left."""
    ids = [SHARED_TOKEN, *(str(c) for c in range(clients))]
    with psycopg.connect(URL, autocommit=True) as conn:
        for token_id in ids:
            conn.execute(
                f"""INSERT INTO "{SCHEMA}".join_tokens (id, pool_id, tenant, secret_hash, uses, uses_left,
                    expires_at, reclaim, created_by)
                VALUES (%s, %s, %s, %s, %s, %s, now() + interval '1 hour', 'none', 'pgbench')
                ON CONFLICT (id) DO UPDATE SET uses_left = EXCLUDED.uses""",
                (token_id, plane.pool, plane.tenant, hashlib.sha256(PGBENCH_SECRET).digest(), MAX_USES, MAX_USES),
            )
    return ids


@attrs.frozen(kw_only=True)
class PgbenchRun:
    tps: float
    latency_ms: float


def pgbench(binary: str, plane: Plane, *, whole: bool, shared: bool, clients: int, seconds: int) -> PgbenchRun:
    ids = pgbench_tokens(plane, clients)  # every use back, so no token runs out during the run
    defines = [arg for name, value in pgbench_variables(plane).items() for arg in ("-D", f"{name}={value}")]
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "join.sql"
        script.write_text(pgbench_script(whole=whole, shared=shared))
        command = [binary, "-n", "-M", "prepared", *defines, "-f", str(script), "-c", str(clients)]
        command += ["-j", str(min(2, clients)), "-T", str(seconds), URL]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    tps = re.search(r"tps = ([0-9.]+)", result.stdout)
    latency = re.search(r"latency average = ([0-9.]+) ms", result.stdout)
    processed = re.search(r"number of transactions actually processed: ([0-9]+)", result.stdout)
    if result.returncode != 0 or tps is None or latency is None or processed is None:
        raise SystemExit(f"pgbench failed:\n{result.stdout}\n{result.stderr}")
    used = [SHARED_TOKEN] if shared else ids[1 : clients + 1]
    with psycopg.connect(URL, autocommit=True) as conn:
        row = conn.execute(
            f'SELECT min(uses_left), sum(uses - uses_left) FROM "{SCHEMA}".join_tokens WHERE id = ANY(%s)', (used,)
        ).fetchone()
    assert row is not None
    if int(row[0]) == 0:
        raise SystemExit("a pgbench token ran out of uses during the run: shorten --seconds")
    if int(row[1]) != int(processed.group(1)):  # each transaction must really have spent a use (and so joined)
        raise SystemExit(f"pgbench spent {row[1]} token uses in {processed.group(1)} transactions")
    return PgbenchRun(tps=float(tps.group(1)), latency_ms=float(latency.group(1)))


# --- main -----------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Results:
    per_caller: JoinRun
    shared: JoinRun
    solo: JoinRun
    cpu: CpuSteps
    # (shared token, whole join) -> run; and the whole join with one client
    baseline: dict[tuple[bool, bool], PgbenchRun] | None
    baseline_solo: PgbenchRun | None
    internal: InternalRun | None


async def run(args: argparse.Namespace) -> Results:
    with tempfile.TemporaryDirectory() as folder:
        async with open_plane(Path(folder), args.callers) as plane:
            per_caller = await bench_joins(plane, label="own", joins=args.joins, callers=args.callers, shared=False)
            internal = (
                None
                if args.no_internal
                else await bench_internal(plane, Path(folder), joins=args.joins, callers=args.callers)
            )
            shared = await bench_joins(plane, label="shared", joins=args.joins, callers=args.callers, shared=True)
            solo = await bench_joins(plane, label="solo", joins=SOLO_JOINS, callers=1, shared=False)
            cpu = await bench_cpu(CPU_REPEATS)
            binary = pgbench_binary()
            if binary is None:
                return Results(
                    per_caller=per_caller,
                    shared=shared,
                    solo=solo,
                    cpu=cpu,
                    baseline=None,
                    baseline_solo=None,
                    internal=internal,
                )
            baseline = {
                (token_shared, whole): pgbench(
                    binary, plane, whole=whole, shared=token_shared, clients=args.callers, seconds=args.seconds
                )
                for token_shared in (False, True)
                for whole in (False, True)
            }
            baseline_solo = pgbench(binary, plane, whole=True, shared=False, clients=1, seconds=args.seconds)
    return Results(
        per_caller=per_caller,
        shared=shared,
        solo=solo,
        cpu=cpu,
        baseline=baseline,
        baseline_solo=baseline_solo,
        internal=internal,
    )


def figures(results: Results, args: argparse.Namespace) -> dict[str, float | int | None]:
    """The results as flat named figures (``--json``); latencies in ms, CPU in µs per join."""
    out: dict[str, float | int | None] = {"callers": args.callers, "joins_per_run": args.joins}
    runs = {"own_token": results.per_caller, "shared_token": results.shared, "solo": results.solo}
    for name, joined in runs.items():
        ms = [1000 * s for s in joined.latencies]
        out[f"{name}_joins_per_s"] = round(joined.rate, 1)
        out[f"{name}_p50_ms"] = round(statistics.median(ms), 1)
        out[f"{name}_p99_ms"] = round(percentile(ms, 0.99), 1)
        out[f"{name}_cpu_us_per_join"] = round(1e6 * joined.cpu_per_join)
    base, one = results.baseline, results.baseline_solo
    for name, token_shared in (("own_token", False), ("shared_token", True)):
        joined = results.shared if token_shared else results.per_caller
        for whole, label in ((False, "transaction"), (True, "whole_join")):
            run = None if base is None else base[(token_shared, whole)]
            out[f"{name}_pgbench_{label}_tps"] = None if run is None else round(run.tps, 1)
            out[f"{name}_ratio_{label}"] = None if run is None else round(joined.rate / run.tps, 3)
    out["solo_pgbench_whole_join_tps"] = None if one is None else round(one.tps, 1)
    out["solo_ratio_whole_join"] = None if one is None else round(results.solo.rate / one.tps, 3)
    internal = results.internal
    if internal is not None:
        ms = [1000 * s for s in internal.run.latencies]
        out["internal_joins_per_s"] = round(internal.run.rate, 1)
        out["internal_p99_ms"] = round(percentile(ms, 0.99), 1)
        out["internal_api_cpu_us_per_join"] = round(1e6 * internal.api_cpu_seconds / internal.run.joins)
        out["internal_gateway_cpu_us_per_join"] = round(1e6 * internal.run.cpu_per_join)
        out["internal_ratio_in_process"] = round(internal.run.rate / results.per_caller.rate, 3)
    return out


def report(results: Results, args: argparse.Namespace) -> None:
    rows = [("one token per caller", results.per_caller, False), ("one token for all callers", results.shared, True)]
    print(
        f"(1) compute.gateway_services.join in process: {args.callers} concurrent callers, {args.joins} joins per "
        f"run, after {WARMUP_PER_CALLER} warm-up joins per caller"
    )
    print(f"  {'':<28} {'joins/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'CPU/join µs':>12} {'cores':>6}")
    for name, joined, _ in rows:
        ms = [1000 * s for s in joined.latencies]
        print(
            f"  {name:<28} {joined.rate:8.1f} {statistics.median(ms):8.1f} {percentile(ms, 0.99):8.1f} "
            f"{max(ms):8.1f} {1e6 * joined.cpu_per_join:12.0f} {joined.cpu_seconds / joined.seconds:6.2f}"
        )
    print("  (CPU/join: this process's CPU time over the run / joins; cores: that CPU time / wall time)")

    cpu = results.cpu
    solo = results.solo
    wall = solo.seconds / solo.joins
    crypto = cpu.unseal + cpu.csr_check + cpu.sign
    print("(2) where one join's time goes: µs per join, and share of (c)")
    steps = [
        ("(a) unseal: HPKE open + in-memory replay guard, no DB", cpu.unseal),
        ("    CSR check: parse + verify its signature, once a join", cpu.csr_check),
        ("(b) CA signing, CPU only: leaf built as issue() builds it", cpu.sign),
        ("    (a) + CSR check + (b)", crypto),
        (f"(c) full join, 1 caller, {solo.joins} joins one after another", wall),
        ("    this process's CPU during (c)", solo.cpu_per_join),
        ("      of which not (a), CSR check, (b): store, psycopg, pool...", solo.cpu_per_join - crypto),
        ("    waiting on PostgreSQL: (c) - CPU", wall - solo.cpu_per_join),
    ]
    for name, seconds in steps:
        print(f"  {name:<62} {1e6 * seconds:8.0f} {100 * seconds / wall:6.1f}%")

    internal = results.internal
    if internal is not None:
        ms = [1000 * s for s in internal.run.latencies]
        print(
            f"(4) the same {internal.run.joins} joins from a keyless gateway process, over the internal channel: "
            f"{internal.run.rate:.1f} joins/s ({internal.run.rate / results.per_caller.rate:.3f} of (1) in process), "
            f"p50 {statistics.median(ms):.1f} ms, p99 {percentile(ms, 0.99):.1f} ms; CPU/join: api "
            f"{1e6 * internal.api_cpu_seconds / internal.run.joins:.0f} µs, gateway "
            f"{1e6 * internal.run.cpu_per_join:.0f} µs"
        )

    base = results.baseline
    one = results.baseline_solo
    if base is None or one is None:
        print("(3) pgbench not found (on PATH or /usr/lib/postgresql/*/bin): no baseline, no ratios")
        return
    print(
        f"(3) pgbench on the join's SQL: the store's statements, bound parameters, prepared, the same tables "
        f"(small changes: see the docstring); {args.callers} clients, {args.seconds} s per run"
    )
    print(f"  {'':<28} {'tx/s (avg latency)':>38} {'ratio joins/s / tx/s':>30}")
    print(f"  {'':<28} {'transaction':>19} {'whole join':>18} {'transaction':>15} {'whole join':>14}")
    for name, joined, token_shared in rows:
        tx = base[(token_shared, False)]
        whole = base[(token_shared, True)]
        print(
            f"  {name:<28} {tx.tps:8.0f} ({tx.latency_ms:5.1f} ms) {whole.tps:7.0f} ({whole.latency_ms:5.1f} ms)"
            f" {joined.rate / tx.tps:15.3f} {joined.rate / whole.tps:14.3f}"
        )
    print(
        f"  {'1 caller / 1 client':<28} {'':>19} {one.tps:7.0f} ({one.latency_ms:5.1f} ms) {'':>15} "
        f"{solo.rate / one.tps:14.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--joins", type=int, default=JOINS, help=f"joins per throughput run (default {JOINS})")
    parser.add_argument("--callers", type=int, default=CALLERS, help=f"concurrent callers (default {CALLERS})")
    parser.add_argument(
        "--seconds", type=int, default=PGBENCH_SECONDS, help=f"each pgbench run (default {PGBENCH_SECONDS})"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--no-internal", action="store_true", help="leave out (4), the internal channel")
    parser.add_argument("--gateway-side", action="store_true", help=argparse.SUPPRESS)  # (4)'s child
    args = parser.parse_args()
    if args.gateway_side:
        asyncio.run(gateway_side())
        return
    if args.callers < 1 or args.joins < args.callers or args.seconds < 1:
        parser.error("need --callers >= 1, --joins >= --callers and --seconds >= 1")
    if args.joins + WARMUP_PER_CALLER * args.callers > MAX_USES:
        parser.error(f"one shared token has at most {MAX_USES} uses: lower --joins or --callers")
    drop_schema()
    try:
        results = asyncio.run(run(args))
    finally:
        drop_schema()
    if args.json:
        print(json.dumps(figures(results, args)))
    else:
        report(results, args)


if __name__ == "__main__":
    main()
