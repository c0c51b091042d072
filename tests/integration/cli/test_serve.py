"""``better-compute serve`` and ``dev`` as real servers in subprocesses: HTTP, the typed client, signals."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest

import bettercompute
from bettercompute.client import Client
from bettercompute.errors import UnauthenticatedError
from tests._timing import deadline

from .conftest import StartCli, dev_env, free_port, run_cli

pytestmark = pytest.mark.pg

VERSION_PATH = "/api/compute/system/version"


def _bootstrap(env: dict[str, str]) -> str:
    result = run_cli(env, "iam", "bootstrap", "--output", "token")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _post_version(base_url: str, token: str | None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return httpx.post(base_url + VERSION_PATH, headers=headers, content=b"{}", timeout=deadline(10))


def test_serve_answers_over_http_and_stops_on_sigterm(cli_env: dict[str, str], start_cli: StartCli) -> None:
    token = _bootstrap(cli_env)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    server = start_cli(cli_env, "serve", "--port", str(port))
    server.wait_ready(base_url)

    ok = _post_version(base_url, token)
    assert ok.status_code == 200
    assert ok.json()["data"]["version"] == bettercompute.__version__

    refused = _post_version(base_url, None)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "UNAUTHENTICATED"

    with Client(base_url, token) as client:
        assert client.system.version().version == bettercompute.__version__
        assert client.system.whoami().tenant_id == "root"
    with Client(base_url, "bcak_0000000000000000." + "x" * 43) as stranger, pytest.raises(UnauthenticatedError):
        stranger.system.version()

    assert server.stop(signal.SIGTERM) == 0
    assert "Traceback" not in server.stderr
    assert token not in server.stderr
    # The access log is off by default.
    assert VERSION_PATH not in server.stderr


def test_worker_roles_run_without_http_until_sigterm_and_hand_back_their_lease(
    cli_env: dict[str, str], database_url: str, start_cli: StartCli
) -> None:
    schema = cli_env["BETTERCOMPUTE_SCHEMA"]
    port = free_port()
    workers = start_cli(cli_env, "serve", "--roles", "sinks,iam", "--port", str(port))
    workers.wait_for("running iam, sinks", in_stderr=True)

    def lease_live() -> bool:
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute(
                f'SELECT expires_at > now() FROM "{schema}".leases WHERE name = %s', ("sinks/events",)
            ).fetchone()
            return bool(row and row[0])

    # The job takes its lease just after the roles start: give it a moment.
    ends = time.monotonic() + deadline(10)
    while not lease_live():
        assert time.monotonic() < ends, workers.stderr
        time.sleep(0.05)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)

    assert workers.stop(signal.SIGTERM) == 0
    assert "received SIGTERM; stopping" in workers.stderr
    assert "Traceback" not in workers.stderr
    assert not lease_live()


def test_dev_prints_a_credential_and_serves(cli_env: dict[str, str], database_url: str, start_cli: StartCli) -> None:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    dev = start_cli(dev_env(cli_env), "dev", "--port", str(port))
    dev.wait_for("Stop with Ctrl-C.")

    out = dev.stdout
    assert "shown once" in out
    match = re.search(r"export TOKEN=(bcak_\S+)", out)
    assert match is not None, out
    curl = (
        """curl -X POST -H "Authorization: Bearer $TOKEN" -H 'content-type: application/json' """
        f"""{base_url}{VERSION_PATH} -d '{{}}'"""
    )
    assert curl in out

    response = _post_version(base_url, match.group(1))
    assert response.status_code == 200
    assert response.json()["data"]["version"] == bettercompute.__version__
    # The command it prints next works as printed, with the exported TOKEN.
    printed = f"BETTERCOMPUTE_URL={base_url} better-compute system version"
    assert f"    {printed}\n" in out
    shell = {k: v for k, v in cli_env.items() if not k.startswith("BETTERCOMPUTE_")}
    shell["PATH"] = f"{Path(sys.executable).parent}:{shell.get('PATH', '')}"
    ran = subprocess.run(
        ["bash", "-c", f"export TOKEN={match.group(1)}; {printed}"],
        env=shell,
        capture_output=True,
        text=True,
        timeout=deadline(60),
        check=False,
    )
    assert ran.returncode == 0 and f"version: {bettercompute.__version__}" in ran.stdout, ran.stderr

    # Its worker roles listen for notifier pokes on the schema's work channel, over a connection of their own.
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            """SELECT count(*) FROM pg_stat_activity
            WHERE datname = current_database() AND query = 'LISTEN ' || quote_ident(%s || '.work')""",
            (cli_env["BETTERCOMPUTE_SCHEMA"],),
        ).fetchone()
    assert row == (1,)

    assert dev.stop(signal.SIGINT) == 0
    assert "Traceback" not in dev.stderr
