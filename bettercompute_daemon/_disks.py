"""What ``bcd ramdisk`` does to a machine's disks: find them, read their SMART health, wipe them, write an image.

Disks. By default the whole disks of ``/sys/block`` (no loop, RAM, compressed-RAM, device-mapper, RAID, optical,
floppy or network block devices), named as the kernel names them (``sda``, ``nvme0n1``) and reached at
``/dev/<name>``. ``--disk PATH`` declares them instead, by path (a block device such as a loop device, or a regular
file standing in for one); such a disk's name is its absolute path.

SMART. ``smartctl --json -H -i <device>`` when ``smartctl`` is installed and the disk is a block device. A disk is
``supported`` only when smartctl gave an overall health verdict, and ``passed`` is that verdict; anything else
(no smartctl, a regular file, a device smartctl cannot read, output it does not understand) is
``{"supported": false, "passed": null}``: a pass is never made up.

Wipe. A block device: its first and last MiB overwritten with zeros (partition tables, their GPT backup, most
file-system and RAID signatures) and then ``blkdiscard`` over the whole device when it is installed and the device
takes it (``method`` says which: ``zero-head-tail`` or ``zero-head-tail+discard``). A regular file: zeros over all of
it up to 64 MiB (``zero-full``), else over its first and last MiB. Block devices are opened with ``O_EXCL``, which
Linux refuses for a device in use (mounted, or part of a RAID or device-mapper set).

Image. Streamed from ``http(s)://`` to the disk from its first byte while its SHA-256 is computed, then synced. A
block device's size is a limit the image may not pass; a regular file grows as needed (and keeps what lay beyond the
image, as a disk would). An image whose checksum or size is not the one expected is not left bootable: its first MiB
is zeroed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import attrs

from ._inventory import NOT_DISKS

__all__ = [
    "FULL_WIPE_LIMIT",
    "MIB",
    "Disk",
    "ImageWritten",
    "WipeOutcome",
    "declared_disks",
    "default_opener",
    "discover_disks",
    "image_url_ok",
    "smart_health",
    "tool",
    "unboot",
    "wipe",
    "write_image",
]

MIB = 1024 * 1024
FULL_WIPE_LIMIT = 64 * MIB
"""A regular file up to this size is zeroed whole; a larger one at its head and tail only."""
_CHUNK = MIB
_SMARTCTL_TIMEOUT = 60.0
_DISCARD_TIMEOUT = 600.0
_DOWNLOAD_TIMEOUT = 60.0
"""Seconds a download may wait for its next bytes."""

UrlOpener = Callable[[str], BinaryIO]
"""Opens an image's URL for reading (``urllib.request.urlopen`` with a timeout, by default)."""


@attrs.frozen(kw_only=True)
class Disk:
    """One disk this ramdisk may report, wipe and write."""

    name: str
    """What the control plane calls it: the kernel's name, or the declared path."""
    path: Path

    @property
    def block(self) -> bool:
        """Whether it is a block device (else a regular file standing in for one)."""
        try:
            return stat.S_ISBLK(os.stat(self.path).st_mode)
        except OSError:
            return False

    def size_bytes(self) -> int | None:
        """Its size, or ``None`` when it cannot be opened."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            return os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)


def discover_disks(sysfs: Path = Path("/sys"), dev: Path = Path("/dev")) -> list[Disk]:
    """The machine's whole disks (``/sys/block`` without the pseudo devices), sorted by name."""
    block = sysfs / "block"
    names = sorted(p.name for p in block.iterdir()) if block.is_dir() else []
    return [Disk(name=name, path=dev / name) for name in names if not name.startswith(NOT_DISKS)]


def declared_disks(paths: Sequence[Path | str]) -> list[Disk]:
    """The disks given with ``--disk``, named by their absolute paths (each once).

    Raises:
        ValueError: a path is neither a block device nor a regular file.
    """
    disks: dict[str, Disk] = {}
    for given in paths:
        path = Path(os.path.abspath(given))
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise ValueError(f"the disk {path} cannot be read: {type(exc).__name__}") from None
        if not (stat.S_ISBLK(mode) or stat.S_ISREG(mode)):
            raise ValueError(f"the disk {path} is neither a block device nor a regular file")
        disks.setdefault(str(path), Disk(name=str(path), path=path))
    return list(disks.values())


def smart_health(disk: Disk, smartctl: str | None) -> dict[str, Any]:
    """``{"supported", "passed"}`` as ``smartctl`` reads the disk (see the module docstring)."""
    unsupported: dict[str, Any] = {"supported": False, "passed": None}
    if smartctl is None or not disk.block:
        return unsupported
    try:
        done = subprocess.run(  # noqa: S603 - a fixed program and a disk path, no shell
            [smartctl, "--json", "-H", "-i", str(disk.path)],
            capture_output=True,
            timeout=_SMARTCTL_TIMEOUT,
            check=False,
        )
        report = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return unsupported
    # Bits 0 and 1 of the exit status: the command line was not understood, or the device could not be opened.
    if done.returncode & 0b11 or not isinstance(report, dict):
        return unsupported
    support = report.get("smart_support")
    if isinstance(support, dict) and (support.get("available") is False or support.get("enabled") is False):
        return unsupported
    verdict = report.get("smart_status")
    passed = verdict.get("passed") if isinstance(verdict, dict) else None
    if not isinstance(passed, bool):
        return unsupported
    return {"supported": True, "passed": passed}


@attrs.frozen(kw_only=True)
class WipeOutcome:
    """How one disk was wiped, and whether it was."""

    method: str
    ok: bool
    problem: str | None = None
    """Why it failed, for the log (never sent)."""


def _open_for_writing(disk: Disk) -> int:
    flags = os.O_WRONLY | (os.O_EXCL if disk.block else 0)  # O_EXCL: Linux refuses a block device in use
    return os.open(disk.path, flags)


def _zero(fd: int, start: int, length: int) -> None:
    zeros = bytes(min(_CHUNK, length))
    os.lseek(fd, start, os.SEEK_SET)
    left = length
    while left > 0:
        left -= os.write(fd, zeros[: min(len(zeros), left)])


def _zero_head_tail(fd: int, size: int) -> None:
    _zero(fd, 0, min(MIB, size))
    if size > MIB:
        tail = max(MIB, size - MIB)
        _zero(fd, tail, size - tail)


def wipe(disk: Disk, blkdiscard: str | None) -> WipeOutcome:
    """Wipe ``disk`` (see the module docstring)."""
    block = disk.block
    try:
        fd = _open_for_writing(disk)
    except OSError as exc:
        return WipeOutcome(method="none", ok=False, problem=f"cannot open {disk.path}: {type(exc).__name__}")
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        if not block and size <= FULL_WIPE_LIMIT:
            method = "zero-full"
            _zero(fd, 0, size)
        else:
            method = "zero-head-tail"
            _zero_head_tail(fd, size)
        os.fsync(fd)
    except OSError as exc:
        return WipeOutcome(method="zero-head-tail", ok=False, problem=f"writing {disk.path}: {type(exc).__name__}")
    finally:
        os.close(fd)
    if block and blkdiscard is not None:
        try:
            done = subprocess.run(  # noqa: S603 - a fixed program and a disk path, no shell
                [blkdiscard, str(disk.path)], capture_output=True, timeout=_DISCARD_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None and done.returncode == 0:
            method += "+discard"
    return WipeOutcome(method=method, ok=True)


@attrs.frozen(kw_only=True)
class ImageWritten:
    """What writing an image did: the bytes written, their SHA-256, and the error code when it failed."""

    written_bytes: int
    sha256: str
    error: str | None = None
    problem: str | None = None
    """Why it failed, for the log (never sent)."""


def default_opener(url: str) -> BinaryIO:
    """``urllib.request.urlopen`` with a timeout (the scheme was checked to be http or https)."""
    response: BinaryIO = urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT)  # noqa: S310 - http(s) only
    return response


def image_url_ok(url: str) -> bool:
    """Whether ``url`` is one an image may come from: ``http`` or ``https`` with a host."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def write_image(
    disk: Disk, url: str, *, sha256: str, size: int | None, opener: UrlOpener = default_opener
) -> ImageWritten:
    """Stream the image at ``url`` to ``disk`` and check it against ``sha256`` (hex) and ``size`` (see the module
    docstring). Error codes: ``invalid_params``, ``download_failed``, ``write_failed``, ``image_too_large``,
    ``size_mismatch``, ``checksum_mismatch``; a failure after some bytes were written zeroes the first MiB again."""
    outcome = _write_image(disk, url, sha256=sha256, size=size, opener=opener)
    if outcome.error is not None and outcome.written_bytes > 0:
        unboot(disk)
    return outcome


def _write_image(disk: Disk, url: str, *, sha256: str, size: int | None, opener: UrlOpener) -> ImageWritten:
    digest = hashlib.sha256()
    written = 0

    def failed(error: str, problem: str) -> ImageWritten:
        return ImageWritten(written_bytes=written, sha256=digest.hexdigest(), error=error, problem=problem)

    if not image_url_ok(url):
        return failed("invalid_params", "the image URL is not http(s)://host/...")
    block = disk.block
    try:
        fd = _open_for_writing(disk)
    except OSError as exc:
        return failed("write_failed", f"cannot open {disk.path}: {type(exc).__name__}")
    try:
        limit = os.lseek(fd, 0, os.SEEK_END) if block else None
        if limit is not None and size is not None and size > limit:
            return failed("image_too_large", f"the image is {size} bytes, the disk {limit}")
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            source = opener(url)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            return failed("download_failed", f"cannot fetch the image: {type(exc).__name__}")
        with source:
            while True:
                try:
                    chunk = source.read(_CHUNK)
                except (OSError, urllib.error.URLError, ValueError) as exc:
                    return failed("download_failed", f"the image download broke: {type(exc).__name__}")
                if not chunk:
                    break
                if limit is not None and written + len(chunk) > limit:
                    return failed("image_too_large", f"the image is larger than the disk ({limit} bytes)")
                if size is not None and written + len(chunk) > size:
                    return failed("size_mismatch", f"the image is larger than the {size} bytes expected")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                digest.update(chunk)
                written += len(chunk)
        os.fsync(fd)
        if size is not None and written != size:
            return failed("size_mismatch", f"the image is {written} bytes, not the {size} expected")
        if digest.hexdigest() != sha256.lower():
            return failed("checksum_mismatch", "the image's SHA-256 is not the one expected")
        return ImageWritten(written_bytes=written, sha256=digest.hexdigest())
    except OSError as exc:
        return failed("write_failed", f"writing {disk.path}: {type(exc).__name__}")
    finally:
        os.close(fd)


def unboot(disk: Disk) -> None:
    """Zero the first MiB of a disk whose image turned out wrong, so that it does not boot half an image."""
    try:
        fd = _open_for_writing(disk)
    except OSError:
        return
    try:
        _zero(fd, 0, min(MIB, os.lseek(fd, 0, os.SEEK_END)))
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def tool(name: str) -> str | None:
    """The path of a program on ``PATH``, or ``None``."""
    return shutil.which(name)
