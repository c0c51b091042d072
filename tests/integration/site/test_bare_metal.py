"""Bare metal from enroll to an adopted node, every part a real process or a real protocol peer:

- the control plane: ``better-compute dev`` (API, gateway and workers in one process) on real PostgreSQL, its gateway
  on this host's end of an uplink into the site's LAN;
- the BMC: the sushy-tools Redfish emulator, whose system has the VM's SMBIOS UUID and MAC;
- the site: ``bcd site join`` then ``bcd site run`` inside the LAN's namespace (proxy DHCP, TFTP, HTTP), a second
  ``bcd site run`` standing by, and dnsmasq as the LAN's own DHCP server;
- the machine: a QEMU VM (TCG) started once the workflow has powered it on through the BMC, PXE-booting through the
  site. Its "ramdisk" kernel is iPXE in Linux kernel format (booting it prints iPXE's banner again): the VM proves
  the boot chain, and ``bcd ramdisk`` runs as a process on this host with the kernel command line the site serves the
  VM, on a disk that is a file;
- the installed system: ``bcd join`` with the single-use token from the cloud-init the ramdisk wrote, then
  ``bcd node`` until its node passes the pool's acceptance check and is adopted.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import random
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._timing import deadline

from ..cli.conftest import Running, StartCli, free_port
from ..metal._bmc import Bmc, start_bmc
from ._lan import BANNER, IPXE, SERVER, Lan, boot_vm, make_lan, require_pxe

pytestmark = [pytest.mark.pg, pytest.mark.e2e]

BCD = str(Path(sys.executable).with_name("bcd"))
SITE_PORT = 8080


@contextlib.contextmanager
def file_server(address: str, folder: Path) -> Iterator[str]:
    """An HTTP server of ``folder`` on ``address`` (where the images are "published"); its base URL."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer((address, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{address}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


def _published(folder: Path, base: str, name: str, data: bytes) -> dict[str, Any]:
    (folder / name).write_bytes(data)
    return {"url": f"{base}/{name}", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _until(check: Callable[[], Any], what: str, *, within: float = 90, logs: Lan | None = None) -> Any:
    ends = time.monotonic() + deadline(within)
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > ends:
            shown = ""
            if logs is not None:
                shown = "\n".join(
                    f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
                    for p in sorted(logs.workdir.glob("*.*"))
                    if p.is_file() and p.suffix in (".err", ".out", ".log")
                )
            pytest.fail(f"not within {within} s: {what}\n{shown}")
        time.sleep(0.3)


def _script_cmdline(lan: Lan, mac: str) -> str:
    """The kernel command line the site serves the machine of ``mac`` (as the VM's iPXE asks for it)."""
    fetch = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    url = f"http://{SERVER}:{SITE_PORT}/script?mac={mac}"
    script = subprocess.run(
        ["ip", "netns", "exec", lan.ns, sys.executable, "-c", fetch, url],
        capture_output=True,
        text=True,
        timeout=deadline(30),
        check=True,
    ).stdout
    kernel = next(line for line in script.splitlines() if line.startswith("kernel "))
    return kernel.split(" ", 2)[2]


def _ramdisk(tmp_path: Path, cmdline: str, inventory: Path, disk: Path, name: str) -> subprocess.CompletedProcess[str]:
    """``bcd ramdisk`` as the VM would run it, with the command line the site served."""
    cmdline_file = tmp_path / f"{name}.cmdline"
    cmdline_file.write_text(cmdline + "\n")
    return subprocess.run(
        [
            BCD,
            "--fake-inventory",
            str(inventory),
            "ramdisk",
            "--cmdline-file",
            str(cmdline_file),
            "--disk",
            str(disk),
            "--cloud-init-dir",
            str(tmp_path / "cidata"),
            "--reboot-command",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=deadline(180),
        check=False,
    )


class Plane:
    """``dev``'s API as its root admin, the LAN whose logs a failed wait shows, and the machine under test."""

    def __init__(self, port: int, token: str, lan: Lan) -> None:
        self.port = port
        self.headers = {"Authorization": f"Bearer {token}"}
        self.lan = lan
        self.machine_id = ""

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(
            f"http://127.0.0.1:{self.port}/api/compute/{path}", headers=self.headers, json=body, timeout=deadline(30)
        )
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()["data"]
        return data

    def machine(self) -> dict[str, Any]:
        return self.call("metal/get", {"id": self.machine_id})

    def until(self, check: Callable[[], Any], what: str, *, within: float = 90) -> Any:
        return _until(check, what, within=within, logs=self.lan)

    def until_state(self, states: tuple[str, ...], what: str, *, within: float = 90) -> dict[str, Any]:
        """The machine, once in one of ``states``."""
        found: dict[str, Any] = self.until(lambda: (m := self.machine())["state"] in states and m, what, within=within)
        return found


def _machine_inventory(tmp_path: Path, vm_uuid: str) -> Path:
    """What the machine's own SMBIOS and GPUs say, read alike by the ramdisk and by the installed system's bcd (the
    emulator reports no serial number, so neither does the machine)."""
    inventory = tmp_path / "inventory.json"
    claims = {"hostname": "metal-e2e", "product": "Sushy Emulator", "system_uuid": vm_uuid, "gpu_count": 1}
    gpu = {"uuid": "GPU-e2e-0", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
    inventory.write_text(
        json.dumps(
            {"claims": {**claims, "gpu_model": gpu["model"]}, "sections": {"gpus": [gpu]}, "health": {"healthy": True}}
        )
    )
    return inventory


def _start_dev(cli_env: dict[str, str], start_cli: StartCli, lan: Lan, tmp_path: Path) -> tuple[Running, Plane]:
    """``dev`` with its gateway on this host's end of the LAN's uplink."""
    port, gateway_port = free_port(), free_port()
    env = {
        **cli_env,
        "BETTERCOMPUTE_TRUST_DOMAIN": "metal.localhost",
        "BETTERCOMPUTE_GATEWAY_ADDRESS": f"{lan.host_address}:{gateway_port}",
        "BETTERCOMPUTE_GATEWAY_HOST": lan.host_address,
    }
    dev = start_cli(env, "dev", "--ephemeral", "--port", str(port), cwd=tmp_path)
    dev.wait_for("Stop with Ctrl-C.", timeout=90)
    token = re.search(r"export TOKEN=(bcak_\S+)", dev.stdout)
    assert token is not None, dev.stdout
    return dev, Plane(port, token[1], lan)


def _site_with_images(plane: Plane, published: Path, base: str) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    """A pool, the ramdisk's kernel and initrd and an OS image published on the file server, and a site booting that
    ramdisk: (the site, the OS image, its bytes)."""
    root = plane.call("system/whoami", {})["tenant_id"]
    pool = plane.call("pools/create", {"tenant": root, "name": "metal"})
    kernel = plane.call(
        "images/register",
        {
            "tenant": root,
            "name": "rd-kernel",
            "kind": "kernel",
            **_published(published, base, "vmlinuz", (IPXE / "ipxe.lkrn").read_bytes()),
        },
    )
    initrd = plane.call(
        "images/register",
        {
            "tenant": root,
            "name": "rd-initrd",
            "kind": "initrd",
            **_published(published, base, "initrd", b"bettercompute test initrd\n" * 64),
        },
    )
    image_bytes = hashlib.sha512(b"os image").digest() * 16384  # 1 MiB
    image = plane.call(
        "images/register",
        {"tenant": root, "name": "os", "kind": "disk", **_published(published, base, "os.img", image_bytes)},
    )
    site = plane.call(
        "sites/create",
        {
            "tenant": root,
            "pool_id": pool["id"],
            "name": "rack-1",
            "ramdisk_kernel": kernel["id"],
            "ramdisk_initrd": initrd["id"],
        },
    )
    return site, image, image_bytes


def _boot_servers(plane: Plane, lan: Lan, tmp_path: Path, site_id: str) -> subprocess.Popen[bytes]:
    """The site's boot server joins with the printed command, then holds the boot lease; a second one stands by.
    The active one."""
    printed = shlex.split(plane.call("site-tokens/create", {"site_id": site_id})["command"])
    assert printed[:3] == ["bcd", "site", "join"] and "--ca-pin" in printed
    state = tmp_path / "site-state"
    joined = subprocess.run(
        ["ip", "netns", "exec", lan.ns, BCD, "--state-dir", str(state), *printed[1:]],
        capture_output=True,
        text=True,
        timeout=deadline(60),
        check=False,
    )
    assert joined.returncode == 0, joined.stderr
    serve = ["--interface=br0", f"--address={SERVER}"]
    site_a = lan.start(
        "site",
        BCD,
        "--state-dir",
        str(state),
        "site",
        "run",
        *serve,
        f"--cache={tmp_path / 'cache'}",
        f"--http-port={SITE_PORT}",
        "--agent=site-a",
    )
    plane.until(lambda: "holding the boot lease" in (lan.workdir / "site.err").read_text(), "site-a active")
    lan.start(
        "standby",
        BCD,
        "--state-dir",
        str(state),
        "site",
        "run",
        *serve,
        f"--cache={tmp_path / 'cache-b'}",
        f"--http-port={SITE_PORT + 1}",
        "--agent=site-b",
    )
    plane.until(lambda: "standing by: site-a" in (lan.workdir / "standby.err").read_text(), "site-b standby")
    assert plane.call("sites/get", {"id": site_id})["boot_holder"] == "site-a"
    return site_a


def _enrolled_and_inspected(plane: Plane, site_id: str, bmc: Bmc, vm_uuid: str, mac: str) -> None:
    """Enroll by the BMC: inspected over Redfish, with the VM's UUID and MAC; the machine is ``plane.machine_id``."""
    enrolled = plane.call(
        "metal/enroll",
        {
            "site_id": site_id,
            "bmc": {"url": bmc.url, "username": bmc.username, "password": bmc.password, "pin_sha256": bmc.pin_sha256},
        },
    )
    plane.machine_id = enrolled["id"]
    inspected = plane.until_state(("inspected",), "inspected")
    assert inspected["system_uuid"] == vm_uuid and inspected["macs"] == [mac]


def _commissioned_through_the_vm(
    plane: Plane, mac: str, vm_uuid: str, inventory: Path, disk: Path, tmp_path: Path
) -> dict[str, Any]:
    """Commission: PXE once and power on through the BMC; the VM boots through the site; the ramdisk joins with the
    token on its command line, diagnoses, wipes; the machine is ready (and returned)."""
    lan = plane.lan
    plane.call("metal/commission", {"id": plane.machine_id})
    plane.until(lambda: plane.machine()["step"] == "ramdisk", "the workflow powered the machine on")
    console = boot_vm(lan, mac, vm_uuid)

    def booted() -> bool:
        kinds = [r["kind"] for r in plane.machine()["boot_records"]]
        return kinds.count("file") >= 2 and "script" in kinds and "tftp" in kinds and "dhcp" in kinds

    plane.until(booted, "the VM's boot seen by the control plane", within=120)
    plane.until(lambda: console.read_text(errors="replace").count(BANNER) >= 3, "the ramdisk kernel ran")
    seen = plane.machine()["boot_records"]
    assert {r["kind"] for r in seen} == {"dhcp", "tftp", "script", "file"}
    assert all(r["mac"] in (mac, None) for r in seen)

    ran = _ramdisk(tmp_path, _script_cmdline(lan, mac), inventory, disk, "commission")
    assert ran.returncode == 0, ran.stderr
    ready = plane.until_state(("ready", "failed"), "ready")
    assert ready["state"] == "ready", ready
    assert ready["results"]["wipe"]["disks"][0]["ok"] is True
    assert disk.read_bytes()[: 1 << 20] == bytes(1 << 20)  # wiped
    return ready


def _deployed_and_joined(
    plane: Plane, mac: str, image: tuple[str, bytes], inventory: Path, disk: Path, tmp_path: Path
) -> str:
    """Deploy: the image is written, cloud-init carries the join (single use); the machine joins as its node id, and
    that node is adopted. The node's id."""
    image_id, image_bytes = image
    plane.call("metal/deploy", {"id": plane.machine_id, "image_id": image_id})
    plane.until(lambda: plane.machine()["step"] == "ramdisk", "the deploy's PXE boot")
    ran = _ramdisk(tmp_path, _script_cmdline(plane.lan, mac), inventory, disk, "deploy")
    assert ran.returncode == 0, ran.stderr
    deploying = plane.machine()
    assert disk.read_bytes()[: len(image_bytes)] == image_bytes, (
        ran.stderr,
        deploying["step"],
        deploying["reason"],
        deploying["message"],
        deploying["results"].get("deploy"),
    )
    plane.until(lambda: plane.machine()["step"] == "join", "waiting for the installed system")
    user_data = (tmp_path / "cidata" / "user-data").read_text()
    join = json.loads(user_data.split("\n", 1)[1])["runcmd"][0]
    node_state = tmp_path / "node-state"
    common = ["--state-dir", str(node_state), "--fake-inventory", str(inventory)]
    joined = subprocess.run(
        [BCD, *common, *join[1:]], capture_output=True, text=True, timeout=deadline(60), check=False
    )
    assert joined.returncode == 0, joined.stderr
    node_id: str = json.loads((node_state / "node.json").read_text())["node_id"]
    replayed = subprocess.run(
        [BCD, "--state-dir", str(tmp_path / "again"), "--fake-inventory", str(inventory), *join[1:]],
        capture_output=True,
        text=True,
        timeout=deadline(60),
        check=False,
    )
    assert replayed.returncode != 0  # single use
    plane.lan.start("node", BCD, *common, "node", host=True)
    deployed = plane.until_state(("deployed", "failed"), "deployed", within=120)
    assert deployed["state"] == "deployed", deployed
    assert plane.call("nodes/get", {"id": node_id})["state"] == "adopted"
    return node_id


def _released(plane: Plane, mac: str, inventory: Path, disk: Path, tmp_path: Path) -> None:
    """Release: the ramdisk wipes the disk again, and the machine is ready for the next deploy."""
    plane.call("metal/release", {"id": plane.machine_id})
    plane.until(lambda: plane.machine()["step"] == "ramdisk", "the release's PXE boot")
    ran = _ramdisk(tmp_path, _script_cmdline(plane.lan, mac), inventory, disk, "release")
    assert ran.returncode == 0, ran.stderr
    released = plane.until_state(("ready", "failed"), "released")
    assert released["state"] == "ready", released
    assert disk.read_bytes()[: 1 << 20] == bytes(1 << 20)


@pytest.mark.timeout(480)
def test_bare_metal_from_enroll_to_an_adopted_node(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    require_pxe()
    mac = "52:54:00:" + ":".join(f"{random.randrange(256):02x}" for _ in range(3))
    vm_uuid = str(uuid.uuid4())
    inventory = _machine_inventory(tmp_path, vm_uuid)
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"\xa5" * (4 << 20))

    with make_lan(tmp_path / "lan", uplink=True) as lan:
        bmc = start_bmc(tmp_path / "bmc", system_uuid=vm_uuid, macs=(mac,))
        published = tmp_path / "published"
        published.mkdir()
        try:
            with file_server(lan.host_address, published) as base:
                dev, plane = _start_dev(cli_env, start_cli, lan, tmp_path)
                site, image, image_bytes = _site_with_images(plane, published, base)
                site_a = _boot_servers(plane, lan, tmp_path, site["id"])
                _enrolled_and_inspected(plane, site["id"], bmc, vm_uuid, mac)
                ready = _commissioned_through_the_vm(plane, mac, vm_uuid, inventory, disk, tmp_path)
                node_id = _deployed_and_joined(plane, mac, (image["id"], image_bytes), inventory, disk, tmp_path)
                assert node_id == ready["node_id"]
                _released(plane, mac, inventory, disk, tmp_path)

                # The active boot server stops: the standby takes the boot lease once it has expired.
                site_a.terminate()
                plane.until(
                    lambda: "holding the boot lease" in (lan.workdir / "standby.err").read_text(),
                    "site-b taking over",
                    within=60,
                )
                assert plane.call("sites/get", {"id": site["id"]})["boot_holder"] == "site-b"

                # Nothing plaintext: the BMC password is in no log.
                for log in [dev.stdout_path, dev.stderr_path, *lan.workdir.glob("*.err"), *lan.workdir.glob("*.out")]:
                    assert bmc.password not in log.read_text(errors="replace"), log
                assert "Traceback" not in dev.stderr
        finally:
            bmc.stop()
