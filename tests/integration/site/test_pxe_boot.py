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

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._timing import deadline

from ._lan import BANNER, BCD, HTTP_PORT, IPXE, SERVER, Lan, boot_file, boot_vm, make_lan, records, require_pxe, wait

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _requirements() -> None:
    require_pxe()


@pytest.fixture
def lan(tmp_path: Path) -> Iterator[Lan]:
    with make_lan(tmp_path) as made:
        yield made


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
    ends = time.monotonic() + deadline(30)
    while "serving on" not in (lan.workdir / "bcd.err").read_text():
        assert bcd.poll() is None, (lan.workdir / "bcd.err").read_text()
        assert time.monotonic() < ends, "bcd site serve-local did not start"
        time.sleep(0.1)
    return lan.workdir / "bcd.out"


@pytest.mark.timeout(150)
def test_a_vm_pxe_boots_its_kernel_and_initrd_through_the_site(lan: Lan) -> None:
    mac = "52:54:00:77:00:11"
    system_uuid = str(uuid.uuid4())
    initrd = lan.workdir / "initrd.img"
    initrd.write_bytes(b"bettercompute test initrd\n" * 40)
    kernel_file, initrd_file = boot_file(IPXE / "ipxe.lkrn"), boot_file(initrd)
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
    console = boot_vm(lan, mac, system_uuid)

    def booted() -> bool:
        files = {r["detail"].split()[0] for r in records(out) if r["kind"] == "file"}
        return {kernel_file["sha256"], initrd_file["sha256"]} <= files

    wait(booted, "the kernel and initrd downloads", lan)
    seen = records(out)
    dhcp = [r for r in seen if r["kind"] == "dhcp" and r["mac"] == mac]
    assert dhcp and all(r["machine_id"] == "m-test-1" for r in dhcp)
    assert any("undionly.kpxe" in r["detail"] for r in dhcp), dhcp
    assert any("boot.ipxe" in r["detail"] for r in dhcp), dhcp
    tftp = [r for r in seen if r["kind"] == "tftp"]
    assert tftp and tftp[0]["mac"] == mac and tftp[0]["detail"].startswith("undionly.kpxe")
    scripts = [r for r in seen if r["kind"] == "script"]
    assert scripts and scripts[0]["mac"] == mac and scripts[0]["machine_id"] == "m-test-1"
    assert scripts[0]["system_uuid"] == system_uuid
    files = [r for r in seen if r["kind"] == "file"]
    assert all(r["mac"] == mac and r["machine_id"] == "m-test-1" for r in files)
    # The order of the chain: DHCP, TFTP, script, files.
    order = [r["kind"] for r in seen if r["kind"] != "dhcp" or r is dhcp[0]]
    assert order.index("tftp") < order.index("script") < order.index("file")
    # ipxe.lkrn really started: iPXE's banner a third time on the serial console (the ROM's, undionly's, the kernel's).
    # The VM's own view of the chain, from its serial console.
    text = console.read_text(errors="replace")
    assert f"tftp://{SERVER}/undionly.kpxe... ok" in text
    assert f"http://{SERVER}:{HTTP_PORT}/boot.ipxe... ok" in text
    assert f"http://{SERVER}:{HTTP_PORT}/script... ok" in text
    # ipxe.lkrn runs its command line as iPXE commands (without initrd=...): the command line arrived with it.
    wait(lambda: console.read_text(errors="replace").count(BANNER) >= 3, "the kernel's iPXE banner", lan)
    wait(
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
                "kernel": boot_file(other),
            }
        ],
    }
    out = _serve(lan, plan)
    mac = "52:54:00:77:00:22"
    boot_vm(lan, mac, str(uuid.uuid4()))
    wait(lambda: any(r["kind"] == "script" for r in records(out)), "the script request", lan)
    time.sleep(2)  # anything the default script might (wrongly) have led to
    seen = records(out)
    scripts = [r for r in seen if r["kind"] == "script"]
    assert scripts[0]["mac"] == mac and scripts[0]["machine_id"] is None and scripts[0]["detail"] == "no entry"
    assert not [r for r in seen if r["kind"] == "file"]
    assert all(r["machine_id"] is None for r in seen)
