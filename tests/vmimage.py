"""A tiny bootable VM image for tests: Debian's stock cloud kernel and an initramfs made here, around busybox.

``build_image(folder)`` returns ``VmImage(kernel, initrd, disk)``: paths ready to register as an image (the disk is a
small raw file; the guest runs from its initramfs). The guest's ``/init``:

- loads the virtio, ISO9660 and virtio-net modules taken from the kernel package;
- mounts the cloud-init NoCloud seed (the block device whose volume holds ``meta-data``) and prints
  ``hostname: <local-hostname>`` on the serial console;
- sets the address and default route of ``network-config`` on ``eth0`` and prints ``network: <address>``;
- runs a TCP echo service on port 7 (``nc -ll -p 7 -e cat``) and prints ``bettercompute-vm-ready``;
- when its user data has a line ``# probe <address>``, sends a line to port 7 of that address and prints
  ``probe: <address> answered`` or ``probe: <address> did not answer`` (to test what one guest can reach).

The kernel is unpacked by ``.ci/vm-kernel`` (``apt-get download`` + ``dpkg-deb -x``) into
``BETTERCOMPUTE_VM_KERNEL_DIR`` (default ``/var/cache/bettercompute-test/kernel``); busybox is Debian's
``busybox-static``. ``require_vm()`` skips a test where these, root or QEMU are missing, and fails it instead when
``BETTERCOMPUTE_REQUIRE_VM`` is set (CI sets it).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import ipaddress
import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

KERNEL_DIR = Path(os.environ.get("BETTERCOMPUTE_VM_KERNEL_DIR", "/var/cache/bettercompute-test/kernel"))
BUSYBOX = Path("/bin/busybox")
READY = "bettercompute-vm-ready"

# In load order: each after those it depends on.
MODULES = (
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko",
    "drivers/virtio/virtio_pci.ko",
    "drivers/block/virtio_blk.ko",
    "net/core/failover.ko",
    "drivers/net/net_failover.ko",
    "drivers/net/virtio_net.ko",
    "drivers/cdrom/cdrom.ko",
    "fs/isofs/isofs.ko",
)

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for module in {modules}; do insmod /lib/modules/$module.ko; done
seed=""
tries=0
while [ -z "$seed" ] && [ $tries -lt 100 ]; do
  for device in /dev/vd*; do
    [ -b "$device" ] || continue
    if mount -t iso9660 -o ro "$device" /seed 2>/dev/null; then
      if [ -f /seed/meta-data ]; then seed="$device"; break; fi
      umount /seed
    fi
  done
  [ -n "$seed" ] || {{ sleep 0.1; tries=$((tries + 1)); }}
done
if [ -z "$seed" ]; then echo "bettercompute-vm: no cidata seed found"; fi
name=$(sed -n 's/^local-hostname: "\\(.*\\)"$/\\1/p' /seed/meta-data)
hostname "$name"
echo "hostname: $name"
address=$(sed -n 's/.*addresses: \\["\\(.*\\)"\\].*/\\1/p' /seed/network-config)
gateway=$(sed -n 's/.*via: "\\(.*\\)".*/\\1/p' /seed/network-config)
ip link set lo up
ip link set eth0 up
ip addr add "$address" dev eth0
ip route add default via "$gateway"
echo "network: $address"
nc -ll -p 7 -e cat &
echo "{ready}"
probe=$(sed -n 's/^# probe \\(.*\\)$/\\1/p' /seed/user-data)
if [ -n "$probe" ]; then
  if echo "ping from a guest" | nc -w 3 "$probe" 7 | grep -q "ping from a guest"; then
    echo "probe: $probe answered"
  else
    echo "probe: $probe did not answer"
  fi
fi
while true; do sleep 3600; done
"""


@attrs.frozen
class VmImage:
    """A bootable image's files."""

    kernel: Path
    initrd: Path
    disk: Path


def missing() -> list[str]:
    """What this machine lacks to boot the image in a bridged VM."""
    lacking = []
    if os.geteuid() != 0:
        lacking.append("root")
    for tool in ("qemu-system-x86_64", "qemu-img"):
        if shutil.which(tool) is None:
            lacking.append(tool)
    if shutil.which("ip") is None and shutil.which("ip", path="/usr/sbin:/sbin") is None:
        lacking.append("ip")
    if not BUSYBOX.exists():
        lacking.append(f"{BUSYBOX} (busybox-static)")
    if _kernel() is None:
        lacking.append(f"a kernel in {KERNEL_DIR} (run .ci/vm-kernel)")
    return lacking


def require_vm() -> None:
    """Skip (or fail, with ``BETTERCOMPUTE_REQUIRE_VM`` set) where the machine cannot boot the test VM."""
    lacking = missing()
    if lacking:
        if os.environ.get("BETTERCOMPUTE_REQUIRE_VM"):
            pytest.fail(f"BETTERCOMPUTE_REQUIRE_VM is set but this machine lacks: {', '.join(lacking)}")
        pytest.skip(f"needs {', '.join(lacking)} (set BETTERCOMPUTE_REQUIRE_VM to make this a failure)")


def _kernel() -> Path | None:
    found = sorted((KERNEL_DIR / "boot").glob("vmlinuz-*"))
    return found[-1] if found else None


def build_image(folder: Path) -> VmImage:
    """Write the kernel, the initramfs and a 1 MiB raw disk into ``folder``.

    Raises:
        FileNotFoundError: the kernel or busybox is missing (call ``require_vm`` first).
    """
    kernel = _kernel()
    if kernel is None:
        raise FileNotFoundError(f"no kernel in {KERNEL_DIR}/boot")
    version = kernel.name.removeprefix("vmlinuz-")
    modules = KERNEL_DIR / "lib" / "modules" / version / "kernel"
    folder.mkdir(parents=True, exist_ok=True)
    names = " ".join(Path(m).stem for m in MODULES)
    archive = _Cpio()
    for directory in ("bin", "dev", "proc", "sys", "seed", "tmp", "lib", "lib/modules"):
        archive.directory(directory)
    archive.file("init", INIT.format(modules=names, ready=READY).encode(), 0o755)
    archive.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    archive.symlink("bin/sh", "busybox")
    for module in MODULES:
        archive.file(f"lib/modules/{Path(module).name}", (modules / module).read_bytes(), 0o644)
    initrd = folder / "initrd.gz"
    initrd.write_bytes(gzip.compress(archive.finish(), compresslevel=1))
    kernel_copy = folder / "vmlinuz"
    shutil.copyfile(kernel, kernel_copy)
    disk = folder / "disk.raw"
    disk.write_bytes(b"bettercompute test disk\n".ljust(1024 * 1024, b"\0"))
    return VmImage(kernel=kernel_copy, initrd=initrd, disk=disk)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Cpio:
    """A cpio archive in the ``newc`` format, which the kernel unpacks as its initramfs."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._inode = 1

    def directory(self, name: str) -> None:
        self._entry(name, 0o040755, b"")

    def file(self, name: str, data: bytes, mode: int) -> None:
        self._entry(name, 0o100000 | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, 0o120777, target.encode())

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0, b"", inode=0)
        return b"".join(self._parts)

    def _entry(self, name: str, mode: int, data: bytes, *, inode: int | None = None) -> None:
        encoded = name.encode() + b"\0"
        fields = [
            self._inode if inode is None else inode,  # ino
            mode,
            0,  # uid
            0,  # gid
            1 if not mode & 0o040000 else 2,  # nlink
            0,  # mtime
            len(data),
            0,  # devmajor
            0,  # devminor
            0,  # rdevmajor
            0,  # rdevminor
            len(encoded),
            0,  # check
        ]
        self._inode += 1
        header = b"070701" + b"".join(f"{value:08x}".encode() for value in fields)
        self._parts.append(_pad(header + encoded))
        self._parts.append(_pad(data))


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def free_subnet(low: int = 200, high: int = 250) -> ipaddress.IPv4Network:
    """A /24 in ``10.<low..high>.x.0`` that no route of this machine overlaps: a node's bridge is left behind when
    its test ends badly, and a second bridge on the same subnet would take the other's traffic."""
    shown = subprocess.run(["ip", "-j", "route", "show"], capture_output=True, text=True, check=False).stdout
    taken: list[ipaddress.IPv4Network] = []
    for route in json.loads(shown or "[]"):
        with contextlib.suppress(ValueError, TypeError):
            destination = str(route.get("dst", ""))
            if destination and destination != "default":
                taken.append(ipaddress.IPv4Network(destination, strict=False))
    while True:
        subnet = ipaddress.IPv4Network(f"10.{random.randrange(low, high)}.{random.randrange(1, 251)}.0/24")
        if not any(subnet.overlaps(t) for t in taken):
            return subnet
