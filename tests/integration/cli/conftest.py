"""Running ``better-compute`` as a user does: a subprocess on a schema of its own, configured by the environment."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from tests._timing import deadline

_SCRIPT = Path(sys.executable).parent / "better-compute"


def command() -> list[str]:
    """The installed console script, or the same entry point through this interpreter."""
    if _SCRIPT.exists():
        return [str(_SCRIPT)]
    return [sys.executable, "-c", "from bettercompute_cli import main; main()"]


@pytest.fixture
def cli_env(database_url: str, empty_schema: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a command on this test's schema (empty: ``migrate`` runs as a user runs it first).

    No other BETTERCOMPUTE_* variable leaks in, nor the profiles of whoever runs the tests (``login``'s file is the
    test's own).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTERCOMPUTE_") and k != "TOKEN"}
    env["BETTERCOMPUTE_DATABASE_URL"] = database_url
    env["BETTERCOMPUTE_SCHEMA"] = empty_schema
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    return env


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the command to completion."""
    return subprocess.run(
        [*command(), *args], env=env, capture_output=True, text=True, timeout=deadline(60), check=False
    )


def free_port() -> int:
    """A port nothing listens on now (the server binds it a moment later; a clash is unlikely on loopback)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def dev_env(cli_env: dict[str, str]) -> dict[str, str]:
    """``cli_env`` for a ``dev`` whose gateway listens on a free port rather than dev's 7443 (its join commands still
    say 7443): tests running side by side would otherwise race for that port."""
    return {**cli_env, "BETTERCOMPUTE_GATEWAY_PORT": str(free_port())}


def signal_masks(pid: int) -> str:
    """The signals a process ignores, blocks and catches (hex masks, as ``/proc`` shows them), or why not known."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"no status: {type(exc).__name__}"
    return ", ".join(line.replace("\t", " ") for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


class Running:
    """A long-running command (``serve``, ``dev``) with its output in files, so no pipe can fill up and block it."""

    def __init__(self, env: dict[str, str], args: list[str], folder: Path, cwd: Path | None = None) -> None:
        self.stdout_path = folder / "stdout"
        self.stderr_path = folder / "stderr"
        # PYTHONFAULTHANDLER: a process that does not stop when asked is sent SIGABRT and prints where it was.
        env = {**env, "PYTHONFAULTHANDLER": "1"}
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.process = subprocess.Popen([*command(), *args], env=env, stdout=out, stderr=err, cwd=cwd)

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_for(self, what: str, *, in_stderr: bool = False, timeout: float = 60) -> None:
        """Wait until the output contains ``what``; fail at once if the process exits first, or after
        ``deadline(timeout)`` seconds."""
        timeout = deadline(timeout)
        ends = time.monotonic() + timeout
        while what not in (self.stderr if in_stderr else self.stdout):
            code = self.process.poll()
            assert code is None, f"exited {code} before printing {what!r}:\n{self.stdout}\n{self.stderr}"
            assert time.monotonic() < ends, f"{what!r} not printed within {timeout:.0f} s:\n{self.stderr}"
            time.sleep(0.05)

    def wait_ready(self, base_url: str, *, timeout: float = 60) -> None:
        """Wait until ``/readyz`` answers 200 (at most ``deadline(timeout)`` seconds)."""
        timeout = deadline(timeout)
        ends = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            assert code is None, f"exited {code} before it was ready:\n{self.stderr}"
            try:
                if httpx.get(f"{base_url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < ends, f"not ready within {timeout:.0f} s:\n{self.stderr}"
            time.sleep(0.05)

    def stop(self, sig: signal.Signals = signal.SIGTERM, *, timeout: float = 30) -> int:
        """Send ``sig`` and return the exit code (the test fails if it takes longer than ``deadline(timeout)``).

        How soon a process stops is not what these tests assert (a drain has its own tests): the deadline only
        catches one that never stops, so it is generous.
        """
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=deadline(timeout))
        except subprocess.TimeoutExpired:
            masks = signal_masks(self.process.pid)
            self.process.send_signal(signal.SIGABRT)
            self.process.wait(timeout=deadline(10))
            where = self.stderr[-8000:]
            raise AssertionError(f"still running after {sig.name} ({masks}); its stderr:\n{where}") from None


StartCli = Callable[..., Running]


@pytest.fixture
def start_cli(tmp_path: Path) -> Iterator[StartCli]:
    """``start_cli(env, *args, cwd=None)`` starts a long-running command; anything still running is killed after
    the test."""
    started: list[Running] = []

    def start(env: dict[str, str], *args: str, cwd: Path | None = None) -> Running:
        folder = tmp_path / f"run{len(started)}"
        folder.mkdir()
        running = Running(env, list(args), folder, cwd)
        started.append(running)
        return running

    yield start
    for running in started:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait(timeout=deadline(10))


@attrs.define
class DevPlane:
    """A running ``better-compute dev`` with its gateway: ``call(path, body)`` posts to its API as the root admin
    and returns the answer's ``data``."""

    dev: Running
    port: int
    gateway_port: int
    root_tenant: str
    headers: dict[str, str]

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(
            f"http://127.0.0.1:{self.port}/api/compute/{path}", headers=self.headers, json=body, timeout=deadline(30)
        )
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()["data"]
        return data


def dev_with_gateway(cli_env: dict[str, str], start_cli: StartCli, cwd: Path) -> DevPlane:
    """``better-compute dev --ephemeral`` with node identity on a free gateway port, ready, and its root admin."""
    port, gateway_port = free_port(), free_port()
    env = {
        **cli_env,
        "BETTERCOMPUTE_TRUST_DOMAIN": "dev.localhost",
        "BETTERCOMPUTE_GATEWAY_ADDRESS": f"127.0.0.1:{gateway_port}",
    }
    dev = start_cli(env, "dev", "--ephemeral", "--port", str(port), cwd=cwd)
    dev.wait_for("Stop with Ctrl-C.", timeout=60)
    token = re.search(r"export TOKEN=(bcak_\S+)", dev.stdout)
    assert token is not None, dev.stdout
    plane = DevPlane(
        dev=dev, port=port, gateway_port=gateway_port, root_tenant="", headers={"Authorization": f"Bearer {token[1]}"}
    )
    plane.root_tenant = plane.call("system/whoami", {})["tenant_id"]
    return plane
