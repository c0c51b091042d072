"""A LAN for PXE boots in network namespaces: a bridge with the boot server's address and QEMU's tap, the site's own
DHCP server (dnsmasq) in a second namespace, and optionally an uplink to this host; and the VM that boots on it.

It needs root, ``ip``, ``dnsmasq``, ``qemu-system-x86_64`` and Debian's ``ipxe``; without them the tests that use it
are skipped, unless ``BETTERCOMPUTE_REQUIRE_PXE`` is set (CI sets it), where they fail instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import random
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

from tests._timing import deadline

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


def require_pxe() -> None:
    """Skip (or fail, with ``BETTERCOMPUTE_REQUIRE_PXE`` set) where the machine cannot run a PXE boot."""
    missing = _missing()
    if missing:
        if os.environ.get("BETTERCOMPUTE_REQUIRE_PXE"):
            pytest.fail(f"BETTERCOMPUTE_REQUIRE_PXE is set but this machine lacks: {', '.join(missing)}")
        pytest.skip(f"needs {', '.join(missing)} (set BETTERCOMPUTE_REQUIRE_PXE to make this a failure)")


def _run(*command: str) -> None:
    done = subprocess.run([_tool(command[0]), *command[1:]], capture_output=True, text=True, timeout=deadline(30))
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()}")


@attrs.define
class Lan:
    """The test's LAN: its namespaces, and the processes started in them (stopped in teardown)."""

    ns: str
    dhcp_ns: str
    workdir: Path
    processes: list[subprocess.Popen[bytes]] = attrs.Factory(list)
    host_link: str = ""
    host_address: str = ""
    uplink_address: str = ""

    def start(
        self, name: str, *command: str, namespace: str | None = None, host: bool = False
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` in the LAN's namespace (on this host's with ``host``), its stdout and stderr in
        ``<name>.out`` and ``<name>.err``."""
        out = (self.workdir / f"{name}.out").open("wb")
        err = (self.workdir / f"{name}.err").open("wb")
        where = [] if host else [_tool("ip"), "netns", "exec", namespace or self.ns]
        process = subprocess.Popen(
            [*where, _tool(command[0]) or command[0], *command[1:]],
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
                process.wait(deadline(5))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(deadline(5))


@contextlib.contextmanager
def make_lan(tmp_path: Path, *, uplink: bool = False) -> Iterator[Lan]:
    """Two fresh namespaces joined as one LAN, the site's DHCP server running; all deleted afterwards.

    With ``uplink``, a veth pair also joins the boot server's namespace to this host's (``lan.host_address`` here,
    ``lan.uplink_address`` there), so that a boot server in the LAN reaches a control plane listening on this host.
    """
    tag = uuid.uuid4().hex[:8]
    tmp_path.mkdir(parents=True, exist_ok=True)
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
        if uplink:
            # A /30 of 10.64.0.0/10 drawn at random: side-by-side tests pick different ones (a clash fails loudly).
            block = random.randrange(1 << 20) << 2
            base = (10 << 24) | (64 << 16) | block % (1 << 22)
            host, there = _address(base + 1), _address(base + 2)
            lan.host_link = f"bcu{tag}"
            _run("ip", "link", "add", lan.host_link, "type", "veth", "peer", "name", "up0", "netns", lan.ns)
            _run("ip", "addr", "add", f"{host}/30", "dev", lan.host_link)
            _run("ip", "link", "set", lan.host_link, "up")
            _run(*n, "addr", "add", f"{there}/30", "dev", "up0")
            _run(*n, "link", "set", "up0", "up")
            lan.host_address, lan.uplink_address = host, there
            # This host reaches the boot server's own address through the uplink (a process here playing a
            # machine of the LAN, as ``bcd ramdisk`` does in the tests); the route goes with the veth. ``onlink``: the
            # peer is on this link by construction, and the kernel's check of the next hop can race the veth's carrier
            # coming up (seen once in CI as a bare exit 2).
            _run("ip", "route", "replace", f"{SERVER}/32", "via", there, "dev", lan.host_link, "onlink")
        yield lan
    finally:
        if lan.host_link:
            subprocess.run(
                [_tool("ip"), "link", "delete", lan.host_link], capture_output=True, timeout=deadline(30), check=False
            )
        lan.stop_all()
        for namespace in (lan.ns, lan.dhcp_ns):
            subprocess.run(
                [_tool("ip"), "netns", "delete", namespace], capture_output=True, timeout=deadline(30), check=False
            )


def boot_file(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "url": path.as_uri(), "size": len(data)}


def boot_vm(lan: Lan, mac: str, system_uuid: str) -> Path:
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


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait(check: Callable[[], bool], what: str, lan: Lan) -> None:
    ends = time.monotonic() + deadline(TIMEOUT)
    while not check():
        if time.monotonic() > ends:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                for p in sorted(lan.workdir.glob("*.*"))
                if p.is_file()
            )
            pytest.fail(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.5)


def _address(value: int) -> str:
    return str(ipaddress.IPv4Address(value))
