"""``better-compute tunnel`` as a user runs it, every part a real process: ``better-compute dev`` with its gateway,
``bcd node`` allowing one local port, and the command listening on a local port. Bytes written to the local port
come back from an echo server on the node's loopback, through the gateway; Ctrl-C stops the command cleanly."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._timing import deadline

from .conftest import StartCli, dev_with_gateway, free_port

BCD = str(Path(sys.executable).parent / "bcd")


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_tunnel_command_reaches_a_port_on_the_nodes_loopback(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path, echo_port: int
) -> None:
    plane = dev_with_gateway(cli_env, start_cli, tmp_path)
    pool = plane.call("pools/create", {"tenant": plane.root_tenant, "name": "gpus"})
    created = plane.call("join-tokens/create", {"pool_id": pool["id"], "uses": 1, "expires_in_seconds": 600})
    printed = shlex.split(created["join_command"])
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"claims": {"hostname": "gpu-01", "serial": "SN-TUN-1"}}))
    common = ["--state-dir", str(tmp_path / "bcd"), "--fake-inventory", str(inventory)]
    joined = subprocess.run(
        [BCD, *common, *printed[1:]], capture_output=True, text=True, timeout=deadline(60), check=False
    )
    assert joined.returncode == 0, joined.stderr
    node_id = json.loads((tmp_path / "bcd" / "node.json").read_text())["node_id"]
    with (tmp_path / "bcd.err").open("w") as err:
        daemon = subprocess.Popen(
            [BCD, *common, "node", "--tunnel-local-port", str(echo_port)], stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        ends = time.monotonic() + deadline(30)
        while plane.call("nodes/get", {"id": node_id})["session_epoch"] < 1:
            assert time.monotonic() < ends, "no live session"
            time.sleep(0.2)
        local = free_port()
        token = plane.headers["Authorization"].removeprefix("Bearer ")
        command = start_cli(
            cli_env,
            "tunnel",
            node_id,
            "--port",
            str(echo_port),
            "--local",
            str(local),
            "--server",
            f"http://127.0.0.1:{plane.port}",
            "--token",
            token,
        )
        command.wait_for("Ctrl-C to stop", in_stderr=True)
        payload = os.urandom(1024 * 1024)
        with socket.create_connection(("127.0.0.1", local), timeout=deadline(20)) as connection:
            connection.sendall(payload)
            received = bytearray()
            while len(received) < len(payload):
                chunk = connection.recv(65536)
                assert chunk, "the tunnel ended early"
                received += chunk
        assert bytes(received) == payload
        command.wait_for("closed: client_closed", in_stderr=True)
        assert command.stop(signal.SIGINT) == 0
        assert "Traceback" not in command.stderr
    finally:
        daemon.kill()
        daemon.wait(timeout=deadline(10))
    assert "Traceback" not in plane.dev.stderr
