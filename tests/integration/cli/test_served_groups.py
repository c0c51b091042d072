"""The groups of a host application's own modules are client commands too: ``better-compute`` knows nothing of the
third-party ``maintenance`` module (examples/maintenance), and makes its commands from the served control plane's
OpenAPI document: options from the input's schema, ``--output json``, errors with their exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from bettercompute.modules.pools import CreatePoolInput, Pool, PoolsGroup
from bettercompute_cli._groups import group_names
from examples.maintenance import MaintenanceModule

from ..examples._serve import serving
from ..iam.conftest import two_tenants
from .conftest import free_port, run_cli

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def _env(base: str, token: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTERCOMPUTE_") and k != "TOKEN"}
    return {**env, "BETTERCOMPUTE_URL": base, "BETTERCOMPUTE_TOKEN": token, "XDG_CONFIG_HOME": str(home)}


async def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(lambda: run_cli(env, *args))


async def test_a_third_party_modules_group_is_made_from_the_servers_document(
    database_url: str, fresh_schema: str, tmp_path: Path
) -> None:
    assert "maintenance" not in group_names()
    async with (
        two_tenants(database_url, fresh_schema, modules=[MaintenanceModule()]) as t,
        serving(t.compute.asgi, lifespan="off") as base,
    ):
        pools: PoolsGroup[Any] = t.compute.api.group(PoolsGroup)
        pool: Pool = await pools.create(t.alice, CreatePoolInput(tenant=t.acme, name="gpus"))
        alice = _env(base, t.alice, tmp_path)

        helped = await _run(alice, "maintenance", "--help")
        assert helped.returncode == 0 and "create" in helped.stdout and "list" in helped.stdout, helped.stdout
        helped = await _run(alice, "maintenance", "create", "--help")
        assert "--starts-at" in helped.stdout and "--idempotency-key" in helped.stdout, helped.stdout

        window = [
            *("--tenant", t.acme, "--pool-id", pool.id, "--reason", "firmware"),
            *("--starts-at", "2030-01-01T00:00:00Z", "--ends-at", "2030-01-01T02:00:00Z"),
        ]
        made = await _run(alice, "maintenance", "create", *window, "--idempotency-key", "w-1", "--output", "json")
        assert made.returncode == 0, made.stderr
        created = json.loads(made.stdout)
        again = await _run(alice, "maintenance", "create", *window, "--idempotency-key", "w-1", "--output", "json")
        assert json.loads(again.stdout)["id"] == created["id"]  # the key went along: one window
        listed = await _run(alice, "maintenance", "list", "--tenant", t.acme, "--output", "json")
        assert [w["id"] for w in json.loads(listed.stdout)["windows"]] == [created["id"]], listed.stdout

        # The server's errors, as for any command: one line, the exit status of the code.
        refused = await _run(_env(base, t.mallory, tmp_path), "maintenance", "list", "--tenant", t.acme)
        assert refused.returncode == 5 and refused.stderr.startswith("error: ACCESS_DENIED: "), refused.stderr
        bad = await _run(alice, "maintenance", "create", *window[:4], "--reason", "x")
        assert bad.returncode == 3 and bad.stderr.startswith("error: INVALID_INPUT: "), bad.stderr

        # A group no one serves is the usual unknown command, and so is any group when the server cannot be asked.
        unknown = await _run(alice, "maintenanse", "list")
        assert unknown.returncode == 2 and "No such command" in unknown.stderr, unknown.stderr
        away = _env(f"http://127.0.0.1:{free_port()}", t.alice, tmp_path)
        unknown = await _run(away, "maintenance", "list", "--tenant", t.acme)
        assert unknown.returncode == 2 and "No such command" in unknown.stderr, unknown.stderr
