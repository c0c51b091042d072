"""The ``instances`` section of a node's desired state, read into checked, frozen specs.

Each entry is checked on its own: one malformed instance fails with ``INVALID_SPEC`` (``SpecError``) and the others
still run. The shape is ``docs/vps-node.md``'s.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

__all__ = ["ImageFile", "ImageSpec", "InstanceSpec", "SpecError", "parse_instance", "parse_instances"]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_HOSTNAME = re.compile(r"(?=.{1,253}$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SCHEMES = ("http", "https", "file")


class SpecError(ValueError):
    """An instance entry that cannot be run as written: the first problem found."""


@attrs.frozen(kw_only=True)
class ImageFile:
    """A file of an image (its disk, kernel or initrd), named by its SHA-256: what ``FileCache.ensure`` takes."""

    url: str
    sha256: str
    size: int | None


@attrs.frozen(kw_only=True)
class ImageSpec:
    """An instance's image: a disk (raw or qcow2), and for a direct kernel boot its kernel, initrd and command line."""

    id: str
    disk: ImageFile
    format: Literal["raw", "qcow2"]
    kernel: ImageFile | None = None
    initrd: ImageFile | None = None
    cmdline: str | None = None


@attrs.frozen(kw_only=True)
class InstanceSpec:
    """One instance as the control plane wants it."""

    id: str
    tenant: str
    spec: int
    """Grows with every change of the instance's desired spec."""
    power: Literal["running", "stopped"]
    boot: int
    """A counter: when it grows, a running instance is restarted."""
    vcpu: int
    memory_mib: int
    disk_gib: int
    gpus: tuple[str, ...]
    hostname: str
    ssh_authorized_keys: tuple[str, ...]
    user_data: str
    ports: tuple[int, ...]
    image: ImageSpec

    def hardware(self) -> tuple[object, ...]:
        """What a running VM cannot change without a restart: CPUs, memory, disk, image, GPUs."""
        return (self.vcpu, self.memory_mib, self.disk_gib, self.image, self.gpus)


def parse_instances(content: Mapping[str, Any]) -> tuple[list[InstanceSpec], dict[str, SpecError]]:
    """The instances of a desired state (none when the section is absent) and, by id, the entries that are malformed.

    Raises:
        SpecError: ``instances`` is not a list, or an entry has no usable id, or an id repeats.
    """
    section = content.get("instances")
    if section is None:
        return [], {}
    if not isinstance(section, list):
        raise SpecError("instances must be a list")
    specs: list[InstanceSpec] = []
    problems: dict[str, SpecError] = {}
    seen: set[str] = set()
    for entry in section:
        ident = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(ident, str) or not _ID.fullmatch(ident):
            raise SpecError(f"an instance has no valid id: {str(ident)[:80]!r}")
        if ident in seen:
            raise SpecError(f"instance {ident} is listed twice")
        seen.add(ident)
        try:
            specs.append(parse_instance(entry))
        except SpecError as exc:
            problems[ident] = exc
    return specs, problems


def parse_instance(entry: Mapping[str, Any]) -> InstanceSpec:
    """One instance entry.

    Raises:
        SpecError: a field is missing or malformed (the first one found).
    """
    ident = _string(entry, "id", _ID)
    power = entry.get("power")
    if power not in ("running", "stopped"):
        raise SpecError(f"power must be running or stopped, not {power!r}")
    user_data = entry.get("user_data") or ""
    if not isinstance(user_data, str) or len(user_data.encode()) > 64 * 1024:
        raise SpecError("user_data must be a string of at most 64 KiB")
    keys = _list(entry, "ssh_authorized_keys", str)
    if any("\n" in key or "\r" in key or len(key) > 16 * 1024 for key in keys):
        raise SpecError("an SSH key must be one line")
    ports = _list(entry, "ports", int)
    if any(not 0 < port < 65536 for port in ports):
        raise SpecError("a port must be from 1 to 65535")
    return InstanceSpec(
        id=ident,
        tenant=str(entry.get("tenant") or ""),
        spec=_int(entry, "spec", 0),
        power=power,
        boot=_int(entry, "boot", 0),
        vcpu=_int(entry, "vcpu", 1, 256),
        memory_mib=_int(entry, "memory_mib", 64, 4 * 1024 * 1024),
        disk_gib=_int(entry, "disk_gib", 1, 64 * 1024),
        gpus=tuple(_list(entry, "gpus", str)),
        hostname=_string(entry, "hostname", _HOSTNAME),
        ssh_authorized_keys=tuple(keys),
        user_data=user_data,
        ports=tuple(ports),
        image=_image(entry.get("image")),
    )


def _image(value: Any) -> ImageSpec:
    if not isinstance(value, dict):
        raise SpecError("image must be an object")
    image_format = value.get("format")
    if image_format not in ("raw", "qcow2"):
        raise SpecError(f"image.format must be raw or qcow2, not {image_format!r}")
    cmdline = value.get("cmdline")
    if cmdline is not None and (not isinstance(cmdline, str) or not cmdline.isprintable() or len(cmdline) > 4096):
        raise SpecError("image.cmdline must be one printable line")
    kernel, initrd = _file(value.get("kernel"), "image.kernel"), _file(value.get("initrd"), "image.initrd")
    if initrd is not None and kernel is None:
        raise SpecError("image.initrd needs image.kernel")
    disk = _file(value, "image")
    assert disk is not None  # value is a dict
    return ImageSpec(
        id=str(value.get("id") or ""), disk=disk, format=image_format, kernel=kernel, initrd=initrd, cmdline=cmdline
    )


def _file(value: Any, where: str) -> ImageFile | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SpecError(f"{where} must be an object or null")
    url, sha256, size = value.get("url"), value.get("sha256"), value.get("size")
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme.lower() not in _SCHEMES:
        raise SpecError(f"{where}.url must be an http, https or file URL")
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise SpecError(f"{where}.sha256 must be 64 lower-case hex digits")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise SpecError(f"{where}.size must be a whole number of bytes")
    return ImageFile(url=url, sha256=sha256, size=size)


def _string(entry: Mapping[str, Any], name: str, pattern: re.Pattern[str]) -> str:
    value = entry.get(name)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise SpecError(f"{name} is missing or malformed: {str(value)[:80]!r}")
    return value


def _int(entry: Mapping[str, Any], name: str, low: int, high: int = 2**63) -> int:
    value = entry.get(name, low if name in ("spec", "boot") else None)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise SpecError(f"{name} must be a whole number from {low} to {high}, not {value!r}")
    return value


def _list(entry: Mapping[str, Any], name: str, kind: type) -> Sequence[Any]:
    value = entry.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise SpecError(f"{name} must be a list of {kind.__name__}")
    return value
