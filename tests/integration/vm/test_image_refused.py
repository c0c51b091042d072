"""A disk image that would make QEMU open another file of the node is refused before any disk or VM is made: a
qcow2 image naming a backing file, and a file declared ``raw`` that is really such a qcow2 image. Needs
``qemu-img`` (skipped without it)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from bettercompute_daemon._vm import QemuOptions, QemuRuntime, parse_instance
from tests.vmimage import sha256_of

pytestmark = pytest.mark.anyio

SECRET = b"the node's private key\n"


def _qemu_img(*args: str) -> None:
    subprocess.run(["qemu-img", *args], check=True, capture_output=True)


@pytest.fixture
def images(tmp_path: Path) -> Path:
    if shutil.which("qemu-img") is None:
        pytest.skip("qemu-img is not installed")
    folder = tmp_path / "images"
    folder.mkdir()
    secret = tmp_path / "node-key"
    secret.write_bytes(SECRET.ljust(1 << 20, b"\0"))
    _qemu_img("create", "-q", "-f", "qcow2", "-b", str(secret), "-F", "raw", str(folder / "evil.qcow2"))
    disk = tmp_path / "other-disk"  # qemu-img makes the data file: another instance's disk, say
    _qemu_img(
        "create", "-q", "-f", "qcow2", "-o", f"data_file={disk},data_file_raw=on", str(folder / "data.qcow2"), "1M"
    )
    _qemu_img("create", "-q", "-f", "qcow2", str(folder / "plain.qcow2"), "1M")
    return folder


def _spec(path: Path, image_format: str) -> dict[str, Any]:
    return {
        "id": f"inst_{uuid.uuid4().hex[:8]}",
        "tenant": "tenant_1",
        "spec": 1,
        "power": "running",
        "boot": 0,
        "vcpu": 1,
        "memory_mib": 256,
        "disk_gib": 1,
        "gpus": [],
        "hostname": "evil",
        "ssh_authorized_keys": [],
        "user_data": "",
        "ports": [],
        "image": {
            "id": "img_evil",
            "url": path.as_uri(),
            "sha256": sha256_of(path),
            "size": path.stat().st_size,
            "format": image_format,
        },
    }


@pytest.mark.parametrize(
    ("name", "image_format", "because"),
    [
        ("evil.qcow2", "qcow2", "names a backing file"),
        ("evil.qcow2", "raw", "is declared raw but is qcow2"),
        ("data.qcow2", "qcow2", "names an external data file"),
        ("plain.qcow2", "raw", "is declared raw but is qcow2"),
    ],
)
async def test_an_image_pointing_at_a_node_file_is_refused(
    tmp_path: Path, images: Path, name: str, image_format: str, because: str
) -> None:
    # QEMU is "false": had the image been taken, the instance would have failed with VM_START_FAILED instead.
    options = QemuOptions(vm_dir=tmp_path / "vm", image_dirs=(images,), network="user", qemu="false")
    runtime = QemuRuntime(options)
    spec = parse_instance(_spec(images / name, image_format))
    status = await runtime.apply(spec)
    assert (status.state, status.reason) == ("failed", "IMAGE_REFUSED"), status.message
    assert status.message == f"image img_evil {because}: refused"
    assert str(tmp_path) not in status.message
    folder = options.vm_dir / "instances" / spec.id
    assert not (folder / "disk.qcow2").exists()
    assert runtime._pid(spec.id) is None


async def test_a_plain_qcow2_image_is_accepted(tmp_path: Path, images: Path) -> None:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("QEMU is not installed")
    options = QemuOptions(vm_dir=tmp_path / "vm", image_dirs=(images,), network="user", stop_timeout=0.5)
    runtime = QemuRuntime(options)
    spec = parse_instance(_spec(images / "plain.qcow2", "qcow2"))
    try:
        status = await runtime.apply(spec)
        # no kernel and an empty disk: the firmware finds nothing to boot, but the VM runs
        assert (status.state, status.reason) == ("running", None), status.message
        disk = options.vm_dir / "instances" / spec.id / "disk.qcow2"
        command = ["qemu-img", "info", "-U", "--output=json", str(disk)]
        done = await asyncio.to_thread(subprocess.run, command, check=True, capture_output=True, text=True)
        info = done.stdout
        assert '"backing-filename-format": "qcow2"' in info
    finally:
        await runtime.destroy(spec.id)
