"""A hosted instance from ``instances.create`` to ``deleted``, every part a real process or a real protocol peer:

- the control plane: ``better-compute dev`` (API, gateway and workers in one process) on real PostgreSQL;
- the node: ``bcd join`` then ``bcd node`` as root, with VMs enabled (``vm_dir``), on a bridge of its own;
- the instance: a QEMU VM (TCG) booted by ``bcd node`` from registered images served as ``file://`` URLs from a
  directory the node allows: a stock Debian kernel, a busybox initramfs that reads the NoCloud seed (it prints the
  seed's hostname and serves TCP echo on port 7), and a raw disk the node overlays copy-on-write;
- the tunnel: ``better-compute tunnel <instance> --port 7 --local <port>``, bytes through the gateway and the node's
  session into the VM and back; refused for a port the instance does not expose; closed when the instance stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bettercompute_daemon._vm._network import bridge_name, tap_name
from tests._timing import deadline
from tests.vmimage import VmImage, build_image, free_subnet, require_vm, sha256_of

from ..cli.conftest import DevPlane, StartCli, cli_env, dev_with_gateway, free_port, start_cli

pytestmark = pytest.mark.e2e

__all__ = ["cli_env", "start_cli"]

BCD = str(Path(sys.executable).with_name("bcd"))


def _until(check: Callable[[], Any], what: str, *, within: float = 120, logs: Callable[[], str] | None = None) -> Any:
    ends = time.monotonic() + deadline(within)
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > ends:
            raise AssertionError(f"{what}: not within {within} s\n{logs() if logs else ''}")
        time.sleep(0.5)


def _echo(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=deadline(30)) as connection:
        connection.sendall(payload)
        received = bytearray()
        while len(received) < len(payload):
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
    return bytes(received)


class Host:
    """The node under test, seen from the control plane: its logs, its API calls, the instance made on it."""

    def __init__(self, plane: DevPlane, tmp_path: Path) -> None:
        self.plane = plane
        self.node_log = tmp_path / "bcd-node.log"
        self.node_id = ""
        self.instance_id = ""

    def logs(self) -> str:
        node = self.node_log.read_text()[-4000:] if self.node_log.exists() else ""
        return f"--- bcd node\n{node}\n--- dev\n{self.plane.dev.stderr[-3000:]}"

    def instance(self) -> dict[str, Any]:
        return self.plane.call("instances/get", {"id": self.instance_id})

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """The raw answer to ``path`` (for refusals, which ``plane.call`` fails on)."""
        return httpx.post(
            f"http://127.0.0.1:{self.plane.port}/api/compute/{path}",
            headers=self.plane.headers,
            json=body,
            timeout=deadline(30),
        )


def _start_node(host: Host, pool_id: str, image: VmImage, tmp_path: Path) -> subprocess.Popen[bytes]:
    """Join the node as an operator would, its settings naming where VMs live and which image files it may read,
    then start ``bcd node``; the node's id goes to ``host.node_id``."""
    created = host.plane.call("join-tokens/create", {"pool_id": pool_id, "uses": 1, "expires_in_seconds": 600})
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"claims": {"hostname": "vm-host-1", "serial": "SN-VPS-1"}}))
    settings = tmp_path / "node.json"
    subnet = str(free_subnet(200, 214))
    settings.write_text(
        json.dumps(
            {
                "vm_dir": str(tmp_path / "vms"),
                "image_dirs": [str(image.kernel.parent)],
                "vm_subnet": subnet,
                "vm_network": "bridge",
                "vm_vcpu": 2,
                "vm_memory_mib": 2048,
                "vm_disk_gib": 8,
            }
        )
    )
    common = ["--state-dir", str(tmp_path / "bcd"), "--fake-inventory", str(inventory)]
    printed = shlex.split(created["join_command"])
    joined = subprocess.run(
        [BCD, *common, *printed[1:]], capture_output=True, text=True, timeout=deadline(60), check=False
    )
    assert joined.returncode == 0, joined.stderr
    host.node_id = json.loads((tmp_path / "bcd" / "node.json").read_text())["node_id"]
    with host.node_log.open("w") as err:
        return subprocess.Popen(
            [BCD, *common, "node", "--config", str(settings)], stdout=subprocess.DEVNULL, stderr=err
        )


def _register_disk(host: Host, tenant: str, image: VmImage) -> str:
    """The test image's kernel, initramfs and disk registered as ``file://`` images: the disk's id."""

    def register(name: str, path: Path, kind: str, **more: Any) -> str:
        body = {
            "tenant": tenant,
            "name": name,
            "kind": kind,
            "url": path.as_uri(),
            "sha256": sha256_of(path),
            "size": path.stat().st_size,
            **more,
        }
        return str(host.plane.call("images/register", body)["id"])

    kernel = register("test-kernel", image.kernel, "kernel")
    initrd = register("test-initrd", image.initrd, "initrd")
    return register(
        "test-disk", image.disk, "disk", kernel=kernel, initrd=initrd, cmdline="console=ttyS0 quiet", format="raw"
    )


def _create_once_offered(host: Host, tenant: str, pool_id: str, disk: str) -> dict[str, Any]:
    """An instance too large for the node is refused; a small one is made once the node's offer is known."""
    too_big = host.post(
        "instances/create",
        {
            "tenant": tenant,
            "pool_id": pool_id,
            "name": "huge",
            "size": {"vcpu": 64, "memory_mib": 512, "disk_gib": 1},
            "image_id": disk,
        },
    )
    assert too_big.status_code == 409, too_big.text
    assert too_big.json()["error"]["code"] == "NO_CAPACITY"

    # The node's offer reaches the hosts table within a pass of the host job.
    def create() -> dict[str, Any] | None:
        response = host.post(
            "instances/create",
            {
                "tenant": tenant,
                "pool_id": pool_id,
                "name": "web-1",
                "hostname": "web-one",
                "size": {"vcpu": 1, "memory_mib": 256, "disk_gib": 1},
                "image_id": disk,
                "ports": [7, 22],
            },
        )
        if response.status_code == 409 and response.json()["error"]["details"].get("reason") in (
            "no_hosts",
            "no_available_node",
        ):
            return None  # the host job has not seen the node adopted with its offer yet
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()["data"]
        return data

    made: dict[str, Any] = _until(create, "the node's capacity known", within=30, logs=host.logs)
    return made


def _tunnel_echoes_then_closes_on_stop(host: Host, cli_env: dict[str, str], start_cli: StartCli) -> None:
    """A tunnel to the VM's echo service, through the gateway and the node's session; an open one closes within
    about 2 s once the instance is told to stop."""
    local = free_port()
    token = host.plane.headers["Authorization"].removeprefix("Bearer ")
    command = start_cli(
        cli_env,
        "tunnel",
        host.instance_id,
        "--port",
        "7",
        "--local",
        str(local),
        "--server",
        f"http://127.0.0.1:{host.plane.port}",
        "--token",
        token,
    )
    command.wait_for("Ctrl-C to stop", in_stderr=True)
    payload = os.urandom(256 * 1024)
    assert _until(
        lambda: _echo(local, payload) == payload, "bytes echoed through the tunnel", within=60, logs=host.logs
    )

    with socket.create_connection(("127.0.0.1", local), timeout=deadline(30)) as held:
        held.sendall(b"ping")
        assert held.recv(4) == b"ping"
        asked = time.monotonic()
        host.plane.call("instances/stop", {"id": host.instance_id})
        held.settimeout(deadline(10))
        try:
            rest = held.recv(1)
        except (ConnectionResetError, TimeoutError):
            rest = b"?"
        closed_after = time.monotonic() - asked
    assert rest == b"" and closed_after < 3.0, (rest, closed_after)
    assert command.stop(signal.SIGINT) == 0


def _stopped_started_and_deleted(host: Host, vm_dir: Path) -> None:
    """Stop (asked already), start, delete: each only changes what the instance should be; the node converges, and
    a stopped instance has no tunnel."""
    _until(lambda: host.instance()["state"] == "stopped", "instance stopped", logs=host.logs)
    stopped_tunnel = host.post("instances/tunnel", {"id": host.instance_id, "port": 7})
    assert stopped_tunnel.status_code == 409, stopped_tunnel.text
    host.plane.call("instances/start", {"id": host.instance_id})
    _until(lambda: host.instance()["state"] == "running", "instance running again", logs=host.logs)
    host.plane.call("instances/delete", {"id": host.instance_id})
    gone = _until(lambda: host.instance()["state"] == "deleted" and host.instance(), "instance deleted", logs=host.logs)
    assert gone["deleted_at"] is not None
    leftovers = [p.name for p in vm_dir.iterdir() if p.name.startswith(host.instance_id)]
    assert leftovers == [], leftovers


def _take_down(host: Host, daemon: subprocess.Popen[bytes], vm_dir: Path) -> None:
    """Stop the node; kill any VM of this test that outlived it (by its pidfile); delete its tap and bridge."""
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(timeout=deadline(20))
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait(timeout=deadline(10))
    for pidfile in vm_dir.rglob("*.pid") if vm_dir.exists() else ():
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
    # The daemon leaves its bridge for the VMs that outlive it; the test takes it down.
    for link in (tap_name(host.instance_id) if host.instance_id else "", bridge_name(host.node_id)):
        if link:
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)


@pytest.mark.timeout(420)
def test_a_hosted_instance_runs_on_a_real_node_and_is_reached_through_a_tunnel(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    require_vm()
    image = build_image(tmp_path / "images")
    plane = dev_with_gateway(cli_env, start_cli, tmp_path)
    host = Host(plane, tmp_path)
    tenant = plane.root_tenant
    pool = plane.call(
        "pools/create", {"tenant": tenant, "name": "vms", "pool_class": "vps-host", "acceptance_checks": []}
    )
    daemon = _start_node(host, pool["id"], image, tmp_path)
    try:
        _until(
            lambda: plane.call("nodes/get", {"id": host.node_id})["state"] == "adopted",
            "node adopted",
            within=30,
            logs=host.logs,
        )
        disk = _register_disk(host, tenant, image)
        made = _create_once_offered(host, tenant, pool["id"], disk)
        host.instance_id = made["id"]
        assert made["node_id"] == host.node_id
        running = _until(
            lambda: host.instance()["state"] == "running" and host.instance(), "instance running", logs=host.logs
        )
        assert running["addresses"], running
        _until(
            lambda: "hostname: web-one" in plane.call("instances/console", {"id": host.instance_id})["text"],
            "the seed's hostname on the console",
            logs=host.logs,
        )
        _tunnel_echoes_then_closes_on_stop(host, cli_env, start_cli)

        # A port the instance does not expose is refused before any tunnel exists.
        refused = host.post("instances/tunnel", {"id": host.instance_id, "port": 8080})
        assert refused.status_code == 400 and refused.json()["error"]["details"]["path"] == "port", refused.text
        _stopped_started_and_deleted(host, tmp_path / "vms")
    finally:
        _take_down(host, daemon, tmp_path / "vms")
    assert "Traceback" not in host.node_log.read_text(), host.logs()
    assert "Traceback" not in plane.dev.stderr
