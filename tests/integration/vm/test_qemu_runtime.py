"""``QemuRuntime`` boots a real VM (TCG) from an image of a stock Debian kernel and a busybox initramfs: the guest
reads its NoCloud seed (its hostname shows on the serial console), takes the address the node gave it, and answers
TCP on port 7 from the host; a restarted daemon adopts the running VM; ``boot`` restarts it; stop, start and
delete converge, and a deleted instance leaves nothing behind; two instances on one bridge are reached by the node but
not by each other. Needs root, QEMU and the kernel of ``.ci/vm-kernel``
(skipped without them, failed with ``BETTERCOMPUTE_REQUIRE_VM``)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from bettercompute_daemon._vm import QemuOptions, QemuRuntime, VmHost, parse_instance, parse_instances
from bettercompute_daemon._vm._network import is_isolated, tap_name
from tests._timing import deadline
from tests.vmimage import READY, VmImage, build_image, free_subnet, require_vm, sha256_of

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

BOOT_TIMEOUT = 45.0


@pytest.fixture
def image(tmp_path: Path) -> VmImage:
    require_vm()
    return build_image(tmp_path / "image")


def _file(path: Path) -> dict[str, Any]:
    return {"url": path.as_uri(), "sha256": sha256_of(path), "size": path.stat().st_size}


def entry(image: VmImage, **changes: Any) -> dict[str, Any]:
    spec = {
        "id": f"inst_{uuid.uuid4().hex[:8]}",
        "tenant": "tenant_1",
        "spec": 1,
        "power": "running",
        "boot": 0,
        "vcpu": 1,
        "memory_mib": 256,
        "disk_gib": 1,
        "gpus": [],
        "hostname": "web-1",
        "ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB test@example"],
        "user_data": "",
        "ports": [7],
        "image": {
            "id": "img_test",
            **_file(image.disk),
            "format": "raw",
            "kernel": _file(image.kernel),
            "initrd": _file(image.initrd),
            "cmdline": "console=ttyS0 quiet",
        },
    }
    spec.update(changes)
    return spec


@pytest.fixture
async def runtime(tmp_path: Path, image: VmImage) -> AsyncIterator[QemuRuntime]:
    # A subnet of its own (tests may run side by side, each with its own bridge), that no route here overlaps.
    subnet = free_subnet(214, 224)
    options = QemuOptions.for_node(
        f"node_test_{uuid.uuid4().hex[:8]}",
        tmp_path / "vm",
        image_dirs=(image.kernel.parent,),
        subnet=subnet,
        stop_timeout=1.0,  # the test guest has no ACPI handling: it is quit after a second
    )
    made = QemuRuntime(options)
    try:
        yield made
    finally:
        for instance_id in made.known():
            await made.destroy(instance_id)
        await asyncio.to_thread(subprocess.run, ["ip", "link", "del", options.bridge], capture_output=True, check=False)


async def _console(runtime: QemuRuntime, instance_id: str, text: str, *, after: int = 0) -> str:
    """The console once ``text`` shows in it past byte ``after``."""
    ends = time.monotonic() + deadline(BOOT_TIMEOUT)
    while True:
        console = runtime.console_tail(instance_id, 1 << 20)
        if text in console[after:]:
            return console
        assert time.monotonic() < ends, f"{text!r} not on the console within {BOOT_TIMEOUT} s:\n{console[-3000:]}"
        await asyncio.sleep(0.2)


def _echo(host: str, port: int) -> bytes:
    ends = time.monotonic() + deadline(15)
    while True:
        try:
            with socket.create_connection((host, port), timeout=deadline(3)) as connection:
                connection.sendall(b"ping from the host\n")
                connection.settimeout(5)
                received = b""
                while not received.endswith(b"\n"):
                    chunk = connection.recv(100)
                    if not chunk:
                        break
                    received += chunk
                if received:
                    return received
        except OSError:
            pass
        if time.monotonic() > ends:
            return b""
        time.sleep(0.3)


async def test_an_instance_boots_answers_and_converges(runtime: QemuRuntime, image: VmImage) -> None:
    spec = parse_instance(entry(image))
    status = await runtime.apply(spec)
    assert (status.state, status.reason) == ("running", None), status.message
    address = runtime.address_of(spec.id)
    assert address is not None and ipaddress.IPv4Address(address) in runtime.options.subnet
    assert status.addresses == (address,)
    console = await _console(runtime, spec.id, READY)
    assert "hostname: web-1" in console
    assert f"network: {address}/24" in console
    assert runtime.endpoint(spec.id, 7) == (address, 7)
    assert await runtime.vm_status(spec.id) == "running"  # QEMU's word, over QMP
    assert await asyncio.to_thread(_echo, address, 7) == b"ping from the host\n"

    # A restarted daemon finds the VM running and adopts it rather than starting another.
    pid = runtime._pid(spec.id)
    adopted = QemuRuntime(runtime.options)
    assert adopted.status(spec.id) is not None and adopted.status(spec.id).state == "running"  # type: ignore[union-attr]
    again = await adopted.apply(spec)
    assert again.state == "running" and adopted._pid(spec.id) == pid

    # boot grows: the VM is restarted (a new process), and comes back with the same address.
    seen = len(runtime.console_tail(spec.id, 1 << 20))
    rebooted = await adopted.apply(attrs.evolve(spec, spec=2, boot=1))
    assert rebooted.state == "running" and adopted._pid(spec.id) not in (None, pid)
    await _console(adopted, spec.id, READY, after=seen)
    assert adopted.address_of(spec.id) == address

    # Stopped: no process, the disk stays; running again: it boots from the same disk.
    stopped = await adopted.apply(attrs.evolve(spec, spec=3, boot=1, power="stopped"))
    assert stopped.state == "stopped" and adopted._pid(spec.id) is None
    assert await adopted.vm_status(spec.id) is None
    folder = runtime.options.vm_dir / "instances" / spec.id
    assert (folder / "disk.qcow2").exists()
    assert adopted.poll() == []  # a VM stopped on purpose is not a crash
    seen = len(adopted.console_tail(spec.id, 1 << 20))
    started = await adopted.apply(attrs.evolve(spec, spec=4, boot=1, disk_gib=2))
    assert started.state == "running"
    await _console(adopted, spec.id, READY, after=seen)
    command = ["qemu-img", "info", "-U", str(folder / "disk.qcow2")]
    info = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, check=True)
    assert "virtual size: 2 GiB" in info.stdout

    # Deleted: the VM, its files, its tap and its address are gone.
    await adopted.destroy(spec.id)
    assert adopted._pid(spec.id) is None and pid is not None
    assert not folder.exists()
    assert not await asyncio.to_thread(os.path.exists, f"/sys/class/net/{tap_name(spec.id)}")
    assert adopted.address_of(spec.id) is None and adopted.known() == []
    assert list((runtime.options.vm_dir / "run").iterdir()) == []


async def test_a_vm_that_dies_is_reported_crashed(runtime: QemuRuntime, image: VmImage) -> None:
    spec = parse_instance(entry(image))
    assert (await runtime.apply(spec)).state == "running"
    pid = runtime._pid(spec.id)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    ends = time.monotonic() + deadline(10)
    while not runtime.poll():
        assert time.monotonic() < ends
        await asyncio.sleep(0.1)
    status = runtime.status(spec.id)
    assert status is not None and (status.state, status.reason) == ("failed", "VM_CRASHED")


async def test_user_networking_forwards_the_instance_ports(tmp_path: Path, image: VmImage) -> None:
    options = QemuOptions(vm_dir=tmp_path / "uvm", image_dirs=(image.kernel.parent,), network="user", stop_timeout=0.5)
    runtime = QemuRuntime(options)
    spec = parse_instance(entry(image))
    try:
        assert (await runtime.apply(spec)).state == "running"
        await _console(runtime, spec.id, READY)
        endpoint = runtime.endpoint(spec.id, 7)
        assert endpoint is not None and endpoint[0] == "127.0.0.1"
        assert await asyncio.to_thread(_echo, *endpoint) == b"ping from the host\n"
    finally:
        await runtime.destroy(spec.id)


async def test_the_host_reports_a_booted_instance_with_its_console(runtime: QemuRuntime, image: VmImage) -> None:
    reports: list[dict[str, Any]] = []

    async def report(payload: Mapping[str, Any]) -> None:
        reports.append(json.loads(json.dumps(payload)))

    host = VmHost(runtime, report=report, console_interval=0.5, poll_interval=0.2)
    reporting = asyncio.create_task(host.run())
    first = entry(image)
    try:
        await host.apply(*parse_instances({"instances": [first]}))
        ends = time.monotonic() + deadline(BOOT_TIMEOUT)
        while not reports or "hostname: web-1" not in reports[-1]["instances"][0]["console"]:
            assert time.monotonic() < ends, reports[-1:] or "no report"
            await asyncio.sleep(0.2)
        sent = reports[-1]["instances"][0]
        assert (sent["id"], sent["spec"], sent["state"], sent["reason"]) == (first["id"], 1, "running", None)
        assert sent["addresses"] == [host.address_of(first["id"])]
        assert host.endpoint(first["id"], 7) == (sent["addresses"][0], 7)
        await host.apply(*parse_instances({}))  # no section: no instances
        while reports[-1]["instances"]:
            assert time.monotonic() < ends
            await asyncio.sleep(0.1)
        assert runtime.known() == []
    finally:
        reporting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporting


async def test_instances_on_one_bridge_reach_the_node_but_not_each_other(runtime: QemuRuntime, image: VmImage) -> None:
    first = parse_instance(entry(image))
    assert (await runtime.apply(first)).state == "running"
    first_address = runtime.address_of(first.id)
    assert first_address is not None
    await _console(runtime, first.id, READY)
    # The second guest, once up, tries port 7 of the first (the probe of tests/vmimage.py).
    second = parse_instance(entry(image, hostname="web-2", user_data=f"#!/bin/sh\n# probe {first_address}\n"))
    assert (await runtime.apply(second)).state == "running"
    second_address = runtime.address_of(second.id)
    assert second_address is not None and second_address != first_address
    for instance_id in (first.id, second.id):
        assert await asyncio.to_thread(is_isolated, tap_name(instance_id))
    # The node reaches both ...
    assert await asyncio.to_thread(_echo, first_address, 7) == b"ping from the host\n"
    await _console(runtime, second.id, READY)
    assert await asyncio.to_thread(_echo, second_address, 7) == b"ping from the host\n"
    # ... and the guests do not reach each other.
    console = await _console(runtime, second.id, "probe: ")
    assert f"probe: {first_address} did not answer" in console, console[-2000:]
