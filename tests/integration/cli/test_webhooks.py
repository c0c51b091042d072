"""The command gives the control plane a KMS: ``dev`` by default, ``serve`` with ``kms_key_file``; so the
``webhooks`` group is served."""

from __future__ import annotations

import http.server
import re
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bettercompute.modules.webhooks import verify
from tests._timing import deadline

from .conftest import Running, StartCli, dev_env, free_port, run_cli

pytestmark = pytest.mark.pg


def _call(base_url: str, token: str, method: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(
        f"{base_url}/api/compute/webhooks/{method}",
        headers={"authorization": f"Bearer {token}"},
        json=body,
        timeout=deadline(10),
    )


def _dev_token(stdout: str) -> str:
    match = re.search(r"export TOKEN=(bcak_\S+)", stdout)
    assert match is not None, stdout
    return match.group(1)


def _start_dev(cli_env: dict[str, str], start_cli: StartCli, cwd: Path, *args: str) -> tuple[Running, str, str]:
    """``better-compute dev`` in ``cwd`` on a free port, ready: (the process, its base URL, the root credential)."""
    port = free_port()
    dev = start_cli(dev_env(cli_env), "dev", *args, "--port", str(port), cwd=cwd)
    dev.wait_for("Stop with Ctrl-C.")
    return dev, f"http://127.0.0.1:{port}", _dev_token(dev.stdout)


def test_dev_serves_webhooks_with_a_key_in_its_folder(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    dev = start_cli(dev_env(cli_env), "dev", "--port", str(port), cwd=cwd)
    dev.wait_for("Stop with Ctrl-C.")
    token = _dev_token(dev.stdout)

    listed = _call(base_url, token, "list", {"tenant": "root"})
    assert listed.status_code == 200, listed.text
    assert listed.json()["data"] == {"webhooks": [], "next_cursor": None}

    created = _call(base_url, token, "create", {"tenant": "root", "url": "https://hooks.example.com/in"})
    assert created.status_code == 200, created.text
    key = cwd / ".bettercompute" / "kms.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600  # created on first use

    # The SSRF guard is on: an internal address is refused.
    refused = _call(base_url, token, "create", {"tenant": "root", "url": "http://169.254.169.254/latest"})
    assert refused.status_code == 400
    assert refused.json()["error"]["details"]["path"] == "url"

    assert dev.stop(signal.SIGINT) == 0
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
    assert dev.stop(signal.SIGINT) == 0
    assert not key.exists()  # the temporary folder goes with the process
    assert not (cwd / ".bettercompute").exists()


def test_serve_serves_webhooks_with_a_kms_key_file_and_says_it_needs_one_without(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    boot = run_cli(cli_env, "iam", "bootstrap", "--output", "token")
    assert boot.returncode == 0, boot.stderr
    token = boot.stdout.strip()

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    plain = start_cli(cli_env, "serve", "--port", str(port))
    plain.wait_ready(base_url)
    # Without a KMS the group is there but says what it needs, instead of a 404 that reads like a typo.
    refused = _call(base_url, token, "list", {"tenant": "root"})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "FAILED_PRECONDITION"
    assert "Options.kms" in refused.json()["error"]["message"]
    assert plain.stop(signal.SIGTERM) == 0

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
    assert served.stop(signal.SIGTERM) == 0
    assert "Traceback" not in served.stderr


def test_dev_runs_join_service_and_renders_a_pinned_join_command(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    dev, base_url, token = _start_dev(cli_env, start_cli, cwd, "--ephemeral")
    headers = {"authorization": f"Bearer {token}"}
    pool = httpx.post(
        f"{base_url}/api/compute/pools/create",
        headers=headers,
        json={"tenant": "root", "name": "gpus"},
        timeout=deadline(10),
    )
    assert pool.status_code == 200, pool.text
    created = httpx.post(
        f"{base_url}/api/compute/join-tokens/create",
        headers=headers,
        json={"pool_id": pool.json()["data"]["id"]},
        timeout=deadline(10),
    )
    assert created.status_code == 200, created.text
    command = created.json()["data"]["join_command"]
    assert "--gateway 127.0.0.1:7443 --trust-domain dev.localhost" in command
    assert re.search(r"--ca-bundle \S+ --join-key=[A-Za-z0-9_-]{43}$", command), command
    assert dev.stop(signal.SIGINT) == 0


class _LocalReceiver:
    """A webhook receiver on this machine's loopback, as a developer runs one next to ``dev``."""

    def __init__(self) -> None:
        received: list[tuple[dict[str, str], bytes]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.received = received
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, count: int, *, timeout: float = 30) -> None:
        ends = time.monotonic() + deadline(timeout)
        while len(self.received) < count:
            assert time.monotonic() < ends, f"{len(self.received)} of {count} deliveries within {timeout} s"
            time.sleep(0.05)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def local_receiver() -> Iterator[_LocalReceiver]:
    receiver = _LocalReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


def _send_test(base_url: str, token: str, url: str) -> str:
    created = _call(base_url, token, "create", {"tenant": "root", "url": url})
    assert created.status_code == 200, created.text
    data = created.json()["data"]
    sent = _call(base_url, token, "test", {"tenant": "root", "id": data["webhook"]["id"]})
    assert sent.status_code == 200, sent.text
    secret: str = data["secret"]
    return secret


def test_dev_delivers_to_a_receiver_on_this_machine_and_says_so(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path, local_receiver: _LocalReceiver
) -> None:
    dev, base_url, token = _start_dev(cli_env, start_cli, tmp_path, "--ephemeral")
    assert "dev allows webhooks to loopback destinations" in dev.stderr

    secret = _send_test(base_url, token, f"http://127.0.0.1:{local_receiver.port}/hook")
    local_receiver.wait_for(1)  # the sender, too, lets it through
    headers, body = local_receiver.received[0]
    verify(secret, headers, body)
    for url in (f"http://localhost:{local_receiver.port}/hook", f"http://[::1]:{local_receiver.port}/hook"):
        assert _call(base_url, token, "create", {"tenant": "root", "url": url}).status_code == 200

    # Loopback only: the rest of the network stays out of reach.
    for url in ("http://10.0.0.1/hook", "http://169.254.169.254/latest", "http://192.168.1.1/"):
        refused = _call(base_url, token, "create", {"tenant": "root", "url": url})
        assert refused.status_code == 400, url
        assert refused.json()["error"]["code"] == "INVALID_INPUT"
    assert dev.stop(signal.SIGINT) == 0
    assert "Traceback" not in dev.stderr


def test_serve_refuses_loopback_webhooks_unless_the_operator_allows_private_ones(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path, local_receiver: _LocalReceiver
) -> None:
    env = {**cli_env, "BETTERCOMPUTE_KMS_KEY_FILE": str(tmp_path / "kms.key")}
    boot = run_cli(env, "iam", "bootstrap", "--output", "token")
    assert boot.returncode == 0, boot.stderr
    token = boot.stdout.strip()
    url = f"http://127.0.0.1:{local_receiver.port}/hook"

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    served = start_cli(env, "serve", "--port", str(port))
    served.wait_ready(base_url)
    refused = _call(base_url, token, "create", {"tenant": "root", "url": url})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == "url"
    assert "webhooks_allow_private" not in served.stderr
    assert served.stop(signal.SIGTERM) == 0

    allowed_env = {**env, "BETTERCOMPUTE_WEBHOOKS_ALLOW_PRIVATE": "true"}
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    allowed = start_cli(allowed_env, "serve", "--port", str(port), "--no-migrate")
    allowed.wait_ready(base_url)
    assert "WARNING" in allowed.stderr and "webhooks_allow_private is on" in allowed.stderr
    secret = _send_test(base_url, token, url)
    local_receiver.wait_for(1)
    headers, body = local_receiver.received[0]
    verify(secret, headers, body)
    assert allowed.stop(signal.SIGTERM) == 0
    assert "Traceback" not in allowed.stderr
