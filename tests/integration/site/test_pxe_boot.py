"""A real PXE boot through ``bcd site serve-local``: QEMU's firmware, on a LAN in network namespaces of its own.

The LAN: a bridge in one namespace with the boot server's address (10.77.0.1) and QEMU's tap; the site's own DHCP
server (dnsmasq, handing out addresses and answering IPv6 router solicitations so that iPXE does not wait for them)
in a second namespace, joined to the bridge by a veth pair, as it would be another host. ``bcd site serve-local``
runs as its own process in the first namespace, with a plan whose kernel is ``ipxe.lkrn`` (iPXE built as a Linux
kernel: booting it prints iPXE's banner again) and whose initrd is a few bytes. The VM's NIC ROM is iPXE already, so
the chain is: ROM DHCP -> TFTP undionly.kpxe -> DHCP again -> /boot.ipxe -> /script -> kernel and initrd.

It needs root, ``ip``, ``dnsmasq``, ``qemu-system-x86_64`` and Debian's ``ipxe``; without them it is skipped, unless
``BETTERCOMPUTE_REQUIRE_PXE`` is set (CI sets it), where it fails instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

IPXE = Path("/usr/lib/ipxe")
BCD = Path(sys.executable).with_name("bcd")
SERVER = "10.77.0.1"
HTTP_PORT = 8080
TIMEOUT = 75.0
BANNER = "Open Source Network Boot Firmware"


def _tool(name: str) -> str:
    """The path of ``name``, also in /usr/sbin and /sbin (which a minimal PATH leaves out); ``""`` when absent."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin") or ""


def _missing() -> list[str]:
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    for tool in ("ip", "dnsmasq", "qemu-system-x86_64"):
        if not _tool(tool):
            missing.append(tool)
    for name in ("undionly.kpxe", "ipxe.lkrn"):
        if not (IPXE / name).exists():
            missing.append(str(IPXE / name))
    return missing


@pytest.fixture(autouse=True)
def _requirements() -> None:
    missing = _missing()
    if missing:
        if os.environ.get("BETTERCOMPUTE_REQUIRE_PXE"):
            pytest.fail(f"BETTERCOMPUTE_REQUIRE_PXE is set but this machine lacks: {', '.join(missing)}")
        pytest.skip(f"needs {', '.join(missing)} (set BETTERCOMPUTE_REQUIRE_PXE to make this a failure)")


def _run(*command: str) -> None:
    subprocess.run([_tool(command[0]), *command[1:]], check=True, capture_output=True, timeout=30)


@attrs.define
class Lan:
    """The test's LAN: its namespaces, and the processes started in them (stopped in teardown)."""

    ns: str
    dhcp_ns: str
    workdir: Path
    processes: list[subprocess.Popen[bytes]] = attrs.Factory(list)

    def start(self, name: str, *command: str, namespace: str | None = None) -> subprocess.Popen[bytes]:
        """Start ``command`` in the LAN's namespace, its stdout and stderr in ``<name>.out`` and ``<name>.err``."""
        out = (self.workdir / f"{name}.out").open("wb")
        err = (self.workdir / f"{name}.err").open("wb")
        process = subprocess.Popen(
            [_tool("ip"), "netns", "exec", namespace or self.ns, _tool(command[0]) or command[0], *command[1:]],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
        out.close()
        err.close()
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        """Stop every process started, the last first (TERM, then KILL after 5 s)."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


@pytest.fixture
def lan(tmp_path: Path) -> Iterator[Lan]:
    """Two fresh namespaces joined as one LAN, the site's DHCP server running; all deleted afterwards."""
    tag = uuid.uuid4().hex[:8]
    lan = Lan(ns=f"bcpxe-{tag}", dhcp_ns=f"bcdhcp-{tag}", workdir=tmp_path)
    try:
        _run("ip", "netns", "add", lan.ns)
        _run("ip", "netns", "add", lan.dhcp_ns)
        n, d = ("ip", "-n", lan.ns), ("ip", "-n", lan.dhcp_ns)
        _run(*n, "link", "set", "lo", "up")
        _run(*n, "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0")
        _run(*n, "addr", "add", f"{SERVER}/24", "dev", "br0")
        _run(*n, "link", "set", "br0", "up")
        _run(*n, "tuntap", "add", "dev", "tap0", "mode", "tap")
        _run(*n, "link", "set", "tap0", "master", "br0", "up")
        _run(*n, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", lan.dhcp_ns)
        _run(*n, "link", "set", "veth0", "master", "br0", "up")
        _run(*d, "link", "set", "lo", "up")
        _run(*d, "addr", "add", "10.77.0.2/24", "dev", "veth1")
        _run(*d, "-6", "addr", "add", "fd77::2/64", "dev", "veth1", "nodad")
        _run(*d, "link", "set", "veth1", "up")
        lan.start(
            "dnsmasq",
            "dnsmasq",
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--port=0",
            "--user=root",
            "--interface=veth1",
            "--bind-interfaces",
            "--dhcp-range=10.77.0.100,10.77.0.200,255.255.255.0,1h",
            "--dhcp-range=fd77::,ra-only",
            "--enable-ra",
            f"--dhcp-leasefile={tmp_path / 'leases'}",
            f"--pid-file={tmp_path / 'dnsmasq.pid'}",
            "--log-facility=-",
            "--log-dhcp",
            "--no-ping",  # no ICMP check of an address before offering it (about 3 s each time)
            namespace=lan.dhcp_ns,
        )
        yield lan
    finally:
        lan.stop_all()
        for namespace in (lan.ns, lan.dhcp_ns):
            subprocess.run([_tool("ip"), "netns", "delete", namespace], capture_output=True, timeout=30, check=False)


def _boot_file(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "url": path.as_uri(), "size": len(data)}


def _serve(lan: Lan, plan: dict[str, Any]) -> Path:
    """Start ``bcd site serve-local`` with ``plan``; its records (JSON lines) are in the returned file."""
    plan_file = lan.workdir / "plan.json"
    plan_file.write_text(json.dumps(plan))
    bcd = lan.start(
        "bcd",
        str(BCD),
        "site",
        "serve-local",
        "--interface=br0",
        f"--address={SERVER}",
        f"--plan={plan_file}",
        f"--cache={lan.workdir / 'cache'}",
        f"--http-port={HTTP_PORT}",
    )
    deadline = time.monotonic() + 30
    while "serving on" not in (lan.workdir / "bcd.err").read_text():
        assert bcd.poll() is None, (lan.workdir / "bcd.err").read_text()
        assert time.monotonic() < deadline, "bcd site serve-local did not start"
        time.sleep(0.1)
    return lan.workdir / "bcd.out"


def _boot_vm(lan: Lan, mac: str, system_uuid: str) -> Path:
    """Start a VM that boots from its NIC; its serial console is written to the returned file."""
    console = lan.workdir / "console.log"
    lan.start(
        "qemu",
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-m",
        "256",
        "-nographic",
        "-monitor",
        "none",
        "-no-reboot",
        "-boot",
        "n",
        "-smbios",
        f"type=1,uuid={system_uuid}",
        "-netdev",
        "tap,id=n0,ifname=tap0,script=no,downscript=no",
        "-device",
        f"virtio-net-pci,netdev=n0,mac={mac}",
        "-serial",
        f"file:{console}",
    )
    return console


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait(check: Callable[[], bool], what: str, lan: Lan) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                for p in sorted(lan.workdir.glob("*.*"))
                if p.is_file()
            )
            pytest.fail(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.5)


@pytest.mark.timeout(150)
def test_a_vm_pxe_boots_its_kernel_and_initrd_through_the_site(lan: Lan) -> None:
    mac = "52:54:00:77:00:11"
    system_uuid = str(uuid.uuid4())
    initrd = lan.workdir / "initrd.img"
    initrd.write_bytes(b"bettercompute test initrd\n" * 40)
    kernel_file, initrd_file = _boot_file(IPXE / "ipxe.lkrn"), _boot_file(initrd)
    plan = {
        "generation": 1,
        "entries": [
            {
                "machine_id": "m-test-1",
                "macs": [mac.upper()],
                "system_uuid": system_uuid,
                "action": "ramdisk",
                "kernel": kernel_file,
                "initrd": initrd_file,
                "cmdline": "echo bettercompute-cmdline-seen",
            }
        ],
    }
    out = _serve(lan, plan)
    console = _boot_vm(lan, mac, system_uuid)

    def booted() -> bool:
        files = {r["detail"].split()[0] for r in _records(out) if r["kind"] == "file"}
        return {kernel_file["sha256"], initrd_file["sha256"]} <= files

    _wait(booted, "the kernel and initrd downloads", lan)
    records = _records(out)
    dhcp = [r for r in records if r["kind"] == "dhcp" and r["mac"] == mac]
    assert dhcp and all(r["machine_id"] == "m-test-1" for r in dhcp)
    assert any("undionly.kpxe" in r["detail"] for r in dhcp), dhcp
    assert any("boot.ipxe" in r["detail"] for r in dhcp), dhcp
    tftp = [r for r in records if r["kind"] == "tftp"]
    assert tftp and tftp[0]["mac"] == mac and tftp[0]["detail"].startswith("undionly.kpxe")
    scripts = [r for r in records if r["kind"] == "script"]
    assert scripts and scripts[0]["mac"] == mac and scripts[0]["machine_id"] == "m-test-1"
    assert scripts[0]["system_uuid"] == system_uuid
    files = [r for r in records if r["kind"] == "file"]
    assert all(r["mac"] == mac and r["machine_id"] == "m-test-1" for r in files)
    # The order of the chain: DHCP, TFTP, script, files.
    order = [r["kind"] for r in records if r["kind"] != "dhcp" or r is dhcp[0]]
    assert order.index("tftp") < order.index("script") < order.index("file")
    # ipxe.lkrn really started: iPXE's banner a third time on the serial console (the ROM's, undionly's, the kernel's).
    # The VM's own view of the chain, from its serial console.
    text = console.read_text(errors="replace")
    assert f"tftp://{SERVER}/undionly.kpxe... ok" in text
    assert f"http://{SERVER}:{HTTP_PORT}/boot.ipxe... ok" in text
    assert f"http://{SERVER}:{HTTP_PORT}/script... ok" in text
    # ipxe.lkrn runs its command line as iPXE commands (without initrd=...): the command line arrived with it.
    _wait(lambda: console.read_text(errors="replace").count(BANNER) >= 3, "the kernel's iPXE banner", lan)
    _wait(
        lambda: "\nbettercompute-cmdline-seen" in console.read_text(errors="replace"), "the kernel's command line", lan
    )


@pytest.mark.timeout(150)
def test_a_vm_the_plan_does_not_know_gets_the_default_script(lan: Lan) -> None:
    other = lan.workdir / "other.img"
    other.write_bytes(b"another machine's kernel\n")
    plan = {
        "generation": 1,
        "entries": [
            {
                "machine_id": "m-other",
                "macs": ["52:54:00:77:00:99"],
                "action": "ramdisk",
                "kernel": _boot_file(other),
            }
        ],
    }
    out = _serve(lan, plan)
    mac = "52:54:00:77:00:22"
    _boot_vm(lan, mac, str(uuid.uuid4()))
    _wait(lambda: any(r["kind"] == "script" for r in _records(out)), "the script request", lan)
    time.sleep(2)  # anything the default script might (wrongly) have led to
    records = _records(out)
    scripts = [r for r in records if r["kind"] == "script"]
    assert scripts[0]["mac"] == mac and scripts[0]["machine_id"] is None and scripts[0]["detail"] == "no entry"
    assert not [r for r in records if r["kind"] == "file"]
    assert all(r["machine_id"] is None for r in records)
