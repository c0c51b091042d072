"""What ``bench/fleet.py``'s conductor uses to run the control plane: where the database is, the processes it
starts (their stderr in files), the configuration file they share, and what it makes in process before the fleet
joins (the root admin, a tenant, a pool, a join token)."""

from __future__ import annotations

import json
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import psycopg

from bench._procfs import cpu_seconds
from bettercompute import JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute.modules.nodes import CreateJoinTokenInput
from bettercompute.modules.pools import CreatePoolInput
from bettercompute_iam import CreateTenantInput, EmbeddedIam, IamGroups
from bettercompute_store_pg import PgNotifier, PgStore

__all__ = [
    "BIN",
    "SCHEMA",
    "START_TIMEOUT",
    "URL",
    "Made",
    "Proc",
    "conductor_options",
    "drop_schema",
    "free_port",
    "make_token",
    "raise_open_files",
    "say",
    "sim_flags",
    "write_config",
]

URL = os.environ.get("BETTERCOMPUTE_DATABASE_URL", "").strip() or "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = "bc_bench_fleet"
TRUST_DOMAIN = "fleet.bench.test"
START_TIMEOUT = 60.0  # for a serve process to say it runs
STOP_TIMEOUT = 30.0
BIN = Path(sys.executable).parent


# --- small things -----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def drop_schema() -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def raise_open_files(needed: int) -> None:
    """Children inherit this process's open-files limit: raise the soft one towards what the sims need."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


# --- the control plane's processes ------------------------------------------------------------------------------


@attrs.define(kw_only=True, eq=False)
class Proc:
    """A child process, its stderr in a file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, name: str, argv: Sequence[str], folder: Path, env: Mapping[str, str] | None = None) -> Proc:
        log = folder / f"{name}.log"
        with log.open("wb") as err:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env={**os.environ, **(env or {})},
            )
        return cls(name=name, popen=popen, log=log)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def wait_for_log(self, text: str, within: float) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if text in self.log.read_text(errors="replace"):
                return
            if self.popen.poll() is not None:
                raise SystemExit(f"{self.name} ended (exit {self.popen.returncode}): see {self.log} (--keep keeps it)")
            time.sleep(0.2)
        raise SystemExit(f"{self.name} did not log {text!r} within {within:.0f} s: see {self.log} (--keep keeps it)")

    def stop(self, within: float = STOP_TIMEOUT) -> bytes:
        """SIGTERM, then SIGKILL after ``within`` seconds; what it printed on stdout."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            out, _ = self.popen.communicate(timeout=within)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            out, _ = self.popen.communicate()
        return out or b""

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


def write_config(folder: Path, gateway_port: int) -> Path:
    path = folder / "bettercompute.toml"
    lines = {
        "database_url": URL,
        "schema": SCHEMA,
        "kms_key_file": str(folder / "kms.key"),
        "trust_domain": TRUST_DOMAIN,
        "gateway_address": f"127.0.0.1:{gateway_port}",
    }
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in lines.items()))
    return path


@attrs.frozen(kw_only=True)
class Made:
    """What the conductor made: the root admin's credential, the tenant, its pool, and the join token's command."""

    root: str
    tenant: str
    pool: str
    join_command: str


def conductor_options(folder: Path, gateway_port: int, *, notifier: bool = False) -> Options:
    """The conductor's in-process control plane over the bench's schema (with ``notifier``, the LISTEN/NOTIFY one
    the api role runs, so that what it commits wakes the worker as a request to ``serve`` would)."""
    return Options(
        store=PgStore(URL, schema=SCHEMA, pool_size=2),
        iam=EmbeddedIam(),
        instance="bench-conductor",
        kms=LocalKeyKms(folder / "kms.key"),
        join=JoinSettings(gateway_address=f"127.0.0.1:{gateway_port}", trust_domain=TRUST_DOMAIN),
        notifier=PgNotifier(URL, schema=SCHEMA) if notifier else None,
    )


async def make_token(folder: Path, uses: int, gateway_port: int) -> Made:
    """The root admin, a tenant, a pool and a join token with ``uses`` uses."""
    options = conductor_options(folder, gateway_port)
    compute = better_compute(options)
    await compute.initialize(migrate=False)
    try:
        iam = options.iam
        assert isinstance(iam, EmbeddedIam)
        boot = await iam.bootstrap()
        assert boot.credential is not None
        root = boot.credential
        tenant = (await IamGroups(compute.api).tenants.create(root, CreateTenantInput(name="fleet"))).id
        pool = await compute.api.pools.create(root, CreatePoolInput(tenant=tenant, name="fleet"))
        created = await compute.api.join_tokens.create(
            root, CreateJoinTokenInput(pool_id=pool.id, uses=uses, expires_in_seconds=6 * 3600)
        )
        return Made(root=root, tenant=tenant, pool=pool.id, join_command=created.join_command)
    finally:
        await compute.close()


def sim_flags(join_command: str, gateway_port: int) -> list[str]:
    """``bcd join``'s flags as ``join-tokens.create`` printed them, for the gateway at ``gateway_port``."""
    words = shlex.split(join_command)[2:]
    words[words.index("--gateway") + 1] = f"127.0.0.1:{gateway_port}"
    return words
