"""What ``bench/gateway.py``'s processes share: where the database is, the names, a joined node, the control plane
they open over the same schema, and the JSON lines the children answer in."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import psycopg

import bettercompute_proto as wire
from bettercompute import BetterCompute, JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

__all__ = [
    "GATEWAY_NAME",
    "INVENTORY",
    "OPEN_TIMEOUT",
    "SCHEMA",
    "SERVER_NAME",
    "SESSION_PATH",
    "SPARE_FILES",
    "TRUST_DOMAIN",
    "URL",
    "Node",
    "drop_schema",
    "open_plane",
    "raise_open_files",
    "reply",
]

URL = os.environ.get("BETTERCOMPUTE_DATABASE_URL", "").strip() or "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = "bc_bench_gateway"
TRUST_DOMAIN = "bench.example.test"
GATEWAY_NAME = "bench-gw"
SERVER_NAME = "localhost"  # the name clients check the gateway's certificate for
OPEN_TIMEOUT = 120.0  # a session that has no Welcome by then counts as failed
SPARE_FILES = 1024  # file descriptors beyond one per session (the database pool, the loop, stdio, libraries)
SESSION_PATH = f"/{wire.SERVICE}/Session"
INVENTORY = json.dumps({"cores": 64, "model": "bench"}, separators=(",", ":"))


@attrs.frozen(kw_only=True)
class Node:
    """A joined node: its id, and the file holding its private key and certificate (PEM, mode 0600)."""

    node_id: str
    pem_path: str


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


def reply(message: Mapping[str, Any]) -> None:
    """Answer the conductor: one JSON line on stdout."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
