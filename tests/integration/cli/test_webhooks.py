"""The command gives the control plane a KMS: ``dev`` by default, ``serve`` with ``kms_key_file``; so the
``webhooks`` group is served."""

from __future__ import annotations

import re
import signal
import stat
from pathlib import Path

import httpx
import pytest

from .conftest import Running, StartCli, free_port, run_cli

pytestmark = pytest.mark.pg


def _call(base_url: str, token: str, method: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(
        f"{base_url}/api/compute/webhooks/{method}",
        headers={"authorization": f"Bearer {token}"},
        json=body,
        timeout=10,
    )


def _dev_token(stdout: str) -> str:
    match = re.search(r"export TOKEN=(bcak_\S+)", stdout)
    assert match is not None, stdout
    return match.group(1)


def _start_dev(cli_env: dict[str, str], start_cli: StartCli, cwd: Path, *args: str) -> tuple[Running, str, str]:
    """``better-compute dev`` in ``cwd`` on a free port, ready: (the process, its base URL, the root credential)."""
    port = free_port()
    dev = start_cli(cli_env, "dev", *args, "--port", str(port), cwd=cwd)
    dev.wait_for("Stop with Ctrl-C.")
    return dev, f"http://127.0.0.1:{port}", _dev_token(dev.stdout)


def test_dev_serves_webhooks_with_a_key_in_its_folder(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    dev = start_cli(cli_env, "dev", "--port", str(port), cwd=cwd)
    dev.wait_for("Stop with Ctrl-C.")
    token = _dev_token(dev.stdout)

    listed = _call(base_url, token, "list", {"tenant": "root"})
    assert listed.status_code == 200, listed.text
    assert listed.json()["data"] == {"webhooks": []}

    created = _call(base_url, token, "create", {"tenant": "root", "url": "https://hooks.example.com/in"})
    assert created.status_code == 200, created.text
    key = cwd / ".bettercompute" / "kms.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600  # created on first use

    # The SSRF guard is on: an internal address is refused.
    refused = _call(base_url, token, "create", {"tenant": "root", "url": "http://169.254.169.254/latest"})
    assert refused.status_code == 400
    assert refused.json()["error"]["details"]["path"] == "url"

    assert dev.stop(signal.SIGINT, timeout=5) == 0
    assert "Traceback" not in dev.stderr


def test_dev_ephemeral_keeps_its_key_out_of_the_folder(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    dev, base_url, token = _start_dev(cli_env, start_cli, cwd, "--ephemeral")
    created = _call(base_url, token, "create", {"tenant": "root", "url": "https://hooks.example.com/in"})
    assert created.status_code == 200, created.text
    match = re.search(r"sealed with the key in (\S+)", dev.stderr)
    assert match is not None, dev.stderr
    key = Path(match.group(1))
    assert key.exists() and cwd not in key.parents
    assert dev.stop(signal.SIGINT, timeout=5) == 0
    assert not key.exists()  # the temporary folder goes with the process
    assert not (cwd / ".bettercompute").exists()


def test_serve_has_webhooks_only_with_a_kms_key_file(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    boot = run_cli(cli_env, "iam", "bootstrap", "--output", "token")
    assert boot.returncode == 0, boot.stderr
    token = boot.stdout.strip()

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    plain = start_cli(cli_env, "serve", "--port", str(port))
    plain.wait_ready(base_url)
    assert _call(base_url, token, "list", {"tenant": "root"}).status_code == 404
    assert plain.stop(signal.SIGTERM, timeout=5) == 0

    key = tmp_path / "keys" / "kms.key"
    env = {**cli_env, "BETTERCOMPUTE_KMS_KEY_FILE": str(key)}
    migrated = run_cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    served = start_cli(env, "serve", "--port", str(port), "--no-migrate")
    served.wait_ready(base_url)
    assert _call(base_url, token, "list", {"tenant": "root"}).status_code == 200
    created = _call(base_url, token, "create", {"tenant": "root", "url": "https://hooks.example.com/in"})
    assert created.status_code == 200, created.text
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert served.stop(signal.SIGTERM, timeout=5) == 0
    assert "Traceback" not in served.stderr


def test_dev_runs_join_service_and_renders_a_pinned_join_command(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    dev, base_url, token = _start_dev(cli_env, start_cli, cwd, "--ephemeral")
    headers = {"authorization": f"Bearer {token}"}
    pool = httpx.post(
        f"{base_url}/api/compute/pools/create", headers=headers, json={"tenant": "root", "name": "gpus"}, timeout=10
    )
    assert pool.status_code == 200, pool.text
    created = httpx.post(
        f"{base_url}/api/compute/join-tokens/create",
        headers=headers,
        json={"pool_id": pool.json()["data"]["id"]},
        timeout=10,
    )
    assert created.status_code == 200, created.text
    command = created.json()["data"]["join_command"]
    assert "--gateway 127.0.0.1:7443 --trust-domain dev.localhost" in command
    assert re.search(r"--ca-bundle \S+ --join-key [A-Za-z0-9_-]{43}$", command), command
    assert dev.stop(signal.SIGINT, timeout=5) == 0
