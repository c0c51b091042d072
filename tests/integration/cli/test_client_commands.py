"""The client commands (``better-compute <group> <method>``), run as a user runs them: subprocesses against a served
control plane, with the credential in the environment; answers as tables or JSON, errors as one line and an exit
status per code."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from ..examples._serve import serving
from ..iam.conftest import TwoTenants, two_tenants
from .conftest import free_port, run_cli

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@pytest.fixture
async def served(database_url: str, fresh_schema: str) -> AsyncIterator[tuple[TwoTenants, str]]:
    async with two_tenants(database_url, fresh_schema) as t, serving(t.compute.asgi, lifespan="off") as base:
        yield t, base


def _env(base: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTERCOMPUTE_") and k != "TOKEN"}
    return {**env, "BETTERCOMPUTE_URL": base, "BETTERCOMPUTE_TOKEN": token}


async def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # In a thread: the served control plane answers on this test's event loop meanwhile.
    return await anyio.to_thread.run_sync(lambda: run_cli(env, *args))


def _data(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_methods_are_commands_with_options_from_their_inputs(served: tuple[TwoTenants, str]) -> None:
    t, base = served
    alice = _env(base, t.alice)
    made = _data(await _run(alice, "pools", "create", "--tenant", t.acme, "--name", "gpus", "--output", "json"))
    assert made["name"] == "gpus" and made["tenant"] == t.acme
    whole = json.dumps({"tenant": t.acme, "name": "cpus"})
    other = _data(await _run(alice, "pools", "create", "--json", whole, "--name", "big-cpus", "--output", "json"))
    assert other["name"] == "big-cpus"  # an option replaces the field --json gave
    table = await _run(alice, "pools", "list", "--tenant", t.acme)
    assert table.returncode == 0 and "gpus" in table.stdout and "big-cpus" in table.stdout
    got = _data(await _run(alice, "pools", "get", "--id", made["id"], "--output", "json"))
    assert got == made
    version = await _run(alice, "system", "version")
    assert version.returncode == 0 and "version" in version.stdout


async def test_errors_are_one_line_and_an_exit_status_per_code(served: tuple[TwoTenants, str]) -> None:
    t, base = served
    alice, mallory = _env(base, t.alice), _env(base, t.mallory)
    cases = [
        (alice, ("pools", "get", "--id", "pool_nope"), 6, "NOT_FOUND"),
        (mallory, ("pools", "list", "--tenant", t.acme), 5, "ACCESS_DENIED"),
        (_env(base, "bc_not_a_credential"), ("pools", "list", "--tenant", t.acme), 4, "UNAUTHENTICATED"),
        (alice, ("pools", "create", "--tenant", t.acme), 3, "INVALID_INPUT"),  # no name
        (alice, ("pools", "create", "--tenant", t.acme, "--name", "a\x01b"), 3, "INVALID_INPUT"),
        (_env(f"http://127.0.0.1:{free_port()}", t.alice), ("pools", "list", "--tenant", t.acme), 11, "UNAVAILABLE"),
    ]
    for env, args, status, code in cases:
        done = await _run(env, *args)
        assert done.returncode == status, (args, done.returncode, done.stderr)
        assert done.stderr.startswith(f"error: {code}: ") and done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""
    for args in (("pools", "create", "--json", "[1]"), ("pools", "create", "--json", "{"), ("pools", "nope")):
        usage = await _run(alice, *args)
        assert usage.returncode == 2 and "Traceback" not in usage.stderr, usage.stderr


async def test_audit_export_prints_every_matching_row_as_a_json_line(served: tuple[TwoTenants, str]) -> None:
    t, base = served
    alice, mallory = _env(base, t.alice), _env(base, t.mallory)
    for name in ("a", "b", "c"):
        _data(await _run(alice, "pools", "create", "--tenant", t.acme, "--name", name, "--output", "json"))
    # One row a page: the command follows every cursor to the end.
    done = await _run(
        alice, "audit", "export", "--tenant", t.acme, "--action", "compute:pools:create", "--page-size", "1"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 3
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    assert all(r["tenant"] == t.acme and r["action"] == "compute:pools:create" for r in rows)
    assert all(
        line.isascii() and line == json.dumps(json.loads(line), separators=(",", ":"), sort_keys=True) for line in lines
    )
    refused = await _run(mallory, "audit", "export", "--tenant", t.acme)
    assert refused.returncode == 5 and refused.stderr.startswith("error: ACCESS_DENIED: ") and refused.stdout == ""
