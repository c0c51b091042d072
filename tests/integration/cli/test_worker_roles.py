"""``better-compute serve --roles controllers,scheduler`` as real processes: membership, all 256 shard leases of each
role, no HTTP port, and everything handed back on SIGTERM; two processes split the shards between them.

These processes keep the default lease TTL (15 s, ``lease_ttl_seconds``): a shard cycle runs every 5 s, so the waits
here are generous.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import pytest

from bettercompute._runtime.shards import SHARDS, owned_by
from tests._timing import deadline

from .conftest import Running, StartCli, free_port, run_cli

pytestmark = pytest.mark.pg

ROLES = ("controllers", "scheduler")


def _members(url: str, schema: str) -> dict[str, set[str]]:
    """Worker id -> the roles of its live membership rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(f'SELECT id, role FROM "{schema}".workers WHERE expires_at > now()').fetchall()
    members: dict[str, set[str]] = {}
    for worker_id, role in rows:
        members.setdefault(worker_id, set()).add(role)
    return members


def _held(url: str, schema: str) -> dict[str, dict[str, set[int]]]:
    """Role -> holder -> the shards whose live ``<role>/shard:<n>`` lease it holds."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f"""SELECT name, holder FROM "{schema}".leases
            WHERE (name LIKE 'controllers/shard:%%' OR name LIKE 'scheduler/shard:%%') AND expires_at > now()"""
        ).fetchall()
    held: dict[str, dict[str, set[int]]] = {role: {} for role in ROLES}
    for name, holder in rows:
        role, _, shard = name.partition("/shard:")
        held[role].setdefault(holder, set()).add(int(shard))
    return held


def _worker_id(url: str, schema: str, instance: str) -> str | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f'SELECT DISTINCT id FROM "{schema}".workers WHERE instance = %s AND expires_at > now()', (instance,)
        ).fetchone()
    return None if row is None else str(row[0])


def _wait(predicate: Callable[[], bool], within: float, what: str, *processes: Running) -> None:
    ends = time.monotonic() + deadline(within)
    while not predicate():
        for running in processes:
            code = running.process.poll()
            assert code is None, f"exited {code} while waiting for {what}:\n{running.stderr}"
        assert time.monotonic() < ends, f"not within {within} s: {what}"
        time.sleep(0.2)


def _listening_inodes() -> set[str]:
    """Socket inodes of every listening TCP socket on this machine (Linux ``/proc/net``)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                inodes.add(fields[9])
    return inodes


def _listens(pid: int) -> bool:
    """Whether process ``pid`` has a listening TCP socket open."""
    fd_dir = Path(f"/proc/{pid}/fd")
    listening = _listening_inodes()
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:[") and target[len("socket:[") : -1] in listening:
            return True
    return False


def _serve(cli_env: dict[str, str], start_cli: StartCli, instance: str, port: int) -> Running:
    env = {**cli_env, "BETTERCOMPUTE_INSTANCE": instance}
    running = start_cli(env, "serve", "--roles", "controllers,scheduler", "--no-migrate", "--port", str(port))
    running.wait_for("running controllers, scheduler", in_stderr=True)
    return running


def _stop(running: Running) -> None:
    assert running.stop(signal.SIGTERM) == 0, running.stderr
    assert "received SIGTERM; stopping" in running.stderr
    assert "Traceback" not in running.stderr


def test_one_process_holds_every_shard_of_both_roles_without_http_and_hands_them_back(
    cli_env: dict[str, str], database_url: str, start_cli: StartCli
) -> None:
    url, schema = database_url, cli_env["BETTERCOMPUTE_SCHEMA"]
    migrated = run_cli(cli_env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    port = free_port()
    worker = _serve(cli_env, start_cli, "roles-one", port)

    _wait(lambda: _worker_id(url, schema, "roles-one") is not None, 30, "a membership row", worker)
    worker_id = _worker_id(url, schema, "roles-one")
    assert worker_id is not None and worker_id.startswith("roles-one/")
    every = set(range(SHARDS))
    _wait(
        lambda: _held(url, schema) == {role: {worker_id: every} for role in ROLES},
        30,
        "all 256 shard leases of both roles held by the one worker",
        worker,
    )
    assert _members(url, schema) == {worker_id: set(ROLES)}

    # Worker roles only: nothing listens, neither on the configured port nor anywhere else.
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
    if Path("/proc/net/tcp").exists():
        assert not _listens(worker.process.pid)

    _stop(worker)
    assert _held(url, schema) == {role: {} for role in ROLES}
    assert _members(url, schema) == {}


def test_two_processes_split_the_shards_and_the_survivor_takes_them_all(
    cli_env: dict[str, str], database_url: str, start_cli: StartCli
) -> None:
    url, schema = database_url, cli_env["BETTERCOMPUTE_SCHEMA"]
    migrated = run_cli(cli_env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    first = _serve(cli_env, start_cli, "roles-a", free_port())
    second = _serve(cli_env, start_cli, "roles-b", free_port())
    _wait(
        lambda: _worker_id(url, schema, "roles-a") is not None and _worker_id(url, schema, "roles-b") is not None,
        30,
        "both membership rows",
        first,
        second,
    )
    a, b = _worker_id(url, schema, "roles-a"), _worker_id(url, schema, "roles-b")
    assert a is not None and b is not None and a != b

    # Settled: each holds exactly the shards rendezvous hashing gives it, so together all, none held twice.
    expected = {a: owned_by(a, [a, b], SHARDS), b: owned_by(b, [a, b], SHARDS)}
    assert expected[a] and expected[b]
    _wait(
        lambda: _held(url, schema) == {role: expected for role in ROLES},
        45,
        "the shards of both roles split between the two workers",
        first,
        second,
    )
    held = _held(url, schema)
    for role in ROLES:
        assert held[role][a] | held[role][b] == set(range(SHARDS))
        assert not held[role][a] & held[role][b]
    assert _members(url, schema) == {a: set(ROLES), b: set(ROLES)}

    _stop(first)
    # The first handed its shards back and left: the second's next cycle takes every shard.
    every = set(range(SHARDS))
    _wait(
        lambda: _held(url, schema) == {role: {b: every} for role in ROLES},
        30,
        "every shard held by the survivor",
        second,
    )
    _stop(second)
    assert _held(url, schema) == {role: {} for role in ROLES}
    assert _members(url, schema) == {}
