"""What ``bcd site`` boots, and what it saw: the boot plan the control plane hands it, and the records it hands back.

A ``BootPlan`` is a snapshot: the control plane sends a whole new one (a higher ``generation``) whenever something
changes, and the boot server swaps it in at once. Machines are found by a MAC address of theirs first and by their
SMBIOS UUID only when no entry names the MAC (a machine with a new NIC, a MAC not yet discovered).

Files are content-addressed: a ``BootFile`` names its SHA-256, and the site serves it only under that name and only
after the bytes it downloaded hash to it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["ACTIONS", "RECORD_KINDS", "BootEntry", "BootFile", "BootPlan", "BootRecord", "normalize_mac"]

ACTIONS = frozenset({"ramdisk", "local"})
"""``ramdisk``: boot the entry's kernel and initrd over HTTP; ``local``: leave the machine to its own disks."""
RECORD_KINDS = frozenset({"dhcp", "tftp", "script", "file"})

_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAC_DIGITS = re.compile(r"[0-9a-f]{12}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def normalize_mac(text: str) -> str:
    """``text`` as ``aa:bb:cc:dd:ee:ff``; it may be written with colons, hyphens or neither, in either case.

    Raises:
        ValueError: not six bytes of hex.
    """
    digits = text.strip().lower().replace(":", "").replace("-", "")
    if not _MAC_DIGITS.fullmatch(digits):
        raise ValueError(f"not a MAC address: {text!r}")
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


def normalize_uuid(text: str) -> str:
    """``text`` in the canonical lower-case form of a UUID.

    Raises:
        ValueError: not a UUID.
    """
    return str(uuid.UUID(text.strip()))


def _check_sha256(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _SHA256.fullmatch(value):
        raise ValueError(f"{attribute.name} must be 64 lower-case hex digits, not {value!r}")


def _macs(values: Any) -> tuple[str, ...]:
    return tuple(normalize_mac(value) for value in values)


def _optional_uuid(value: str | None) -> str | None:
    return None if value is None else normalize_uuid(value)


@attrs.frozen(kw_only=True)
class BootFile:
    """A file a machine boots (a kernel, an initrd, a disk image), named by its content."""

    sha256: str = attrs.field(validator=_check_sha256)
    """The SHA-256 of the bytes, lower-case hex: the only name the site serves the file under."""
    url: str
    """Where the site downloads it from (``http``, ``https`` or ``file``)."""
    size: int | None = None
    """The size in bytes, when known: a download that grows past it stops early."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BootFile:
        """A file from its JSON form (``{"sha256", "url", "size"?}``)."""
        size = data.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise ValueError(f"size must be a whole number of bytes, not {size!r}")
        return cls(sha256=str(data["sha256"]), url=str(data["url"]), size=size)


@attrs.frozen(kw_only=True)
class BootEntry:
    """How one machine boots."""

    machine_id: str
    macs: tuple[str, ...] = attrs.field(converter=_macs)
    """Its NICs' MAC addresses, normalized to ``aa:bb:cc:dd:ee:ff``."""
    system_uuid: str | None = attrs.field(default=None, converter=_optional_uuid)
    """Its SMBIOS system UUID (canonical lower-case form), used when none of its MACs is seen."""
    action: str = attrs.field(default="local", validator=attrs.validators.in_(ACTIONS))
    kernel: BootFile | None = None
    initrd: BootFile | None = None
    image: BootFile | None = None
    """A disk image the ramdisk is to write (a deploy): cached and served like the kernel and initrd."""
    cmdline: str = ""
    """The kernel command line; it may not hold control characters (it becomes one line of an iPXE script)."""

    def __attrs_post_init__(self) -> None:
        if self.action == "ramdisk" and self.kernel is None:
            raise ValueError(f"machine {self.machine_id}: a ramdisk boot needs a kernel")
        if _CONTROL.search(self.cmdline):
            raise ValueError(f"machine {self.machine_id}: the command line holds a control character")

    def files(self) -> tuple[BootFile, ...]:
        """The files this entry boots (none unless its action is ``ramdisk``)."""
        if self.action != "ramdisk":
            return ()
        return tuple(file for file in (self.kernel, self.initrd, self.image) if file is not None)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BootEntry:
        """An entry from its JSON form (the field names; ``kernel`` and ``initrd`` as ``BootFile.from_json``)."""
        kernel, initrd, image = data.get("kernel"), data.get("initrd"), data.get("image")
        return cls(
            machine_id=str(data["machine_id"]),
            macs=list(data.get("macs", [])),
            system_uuid=data.get("system_uuid"),
            action=str(data.get("action", "local")),
            kernel=None if kernel is None else BootFile.from_json(kernel),
            initrd=None if initrd is None else BootFile.from_json(initrd),
            image=None if image is None else BootFile.from_json(image),
            cmdline=str(data.get("cmdline", "")),
        )


@attrs.frozen(kw_only=True)
class BootPlan:
    """Every machine the site boots, as of one generation of the control plane's plan.

    Raises:
        ValueError: two entries share a MAC, a system UUID or a machine id.
    """

    entries: tuple[BootEntry, ...] = ()
    generation: int = 0
    _by_mac: dict[str, BootEntry] = attrs.field(init=False, eq=False, repr=False)
    _by_uuid: dict[str, BootEntry] = attrs.field(init=False, eq=False, repr=False)
    _files: dict[str, BootFile] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        by_mac: dict[str, BootEntry] = {}
        by_uuid: dict[str, BootEntry] = {}
        files: dict[str, BootFile] = {}
        ids: set[str] = set()
        for entry in self.entries:
            if entry.machine_id in ids:
                raise ValueError(f"machine {entry.machine_id} appears twice in the plan")
            ids.add(entry.machine_id)
            for mac in entry.macs:
                if mac in by_mac:
                    raise ValueError(f"MAC {mac} belongs to both {by_mac[mac].machine_id} and {entry.machine_id}")
                by_mac[mac] = entry
            if entry.system_uuid is not None:
                if entry.system_uuid in by_uuid:
                    other = by_uuid[entry.system_uuid].machine_id
                    raise ValueError(f"system UUID {entry.system_uuid} belongs to both {other} and {entry.machine_id}")
                by_uuid[entry.system_uuid] = entry
            for file in entry.files():
                files[file.sha256] = file
        object.__setattr__(self, "_by_mac", by_mac)
        object.__setattr__(self, "_by_uuid", by_uuid)
        object.__setattr__(self, "_files", files)

    def find(self, mac: str | None = None, system_uuid: str | None = None) -> BootEntry | None:
        """The entry of the machine with this MAC, else the one with this SMBIOS UUID (both case-insensitive, in any
        usual spelling); ``None`` when neither is known or either is malformed."""
        if mac:
            try:
                entry = self._by_mac.get(normalize_mac(mac))
            except ValueError:
                entry = None
            if entry is not None:
                return entry
        if system_uuid:
            try:
                return self._by_uuid.get(normalize_uuid(system_uuid))
            except ValueError:
                return None
        return None

    def file(self, sha256: str) -> BootFile | None:
        """The file of this plan with this SHA-256, if some entry boots it."""
        return self._files.get(sha256)

    def files(self) -> tuple[BootFile, ...]:
        """Every file some entry boots, each once."""
        return tuple(self._files.values())

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BootPlan:
        """A plan from its JSON form: ``{"generation": int, "entries": [BootEntry.from_json, ...]}``."""
        generation = data.get("generation", 0)
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise ValueError(f"generation must be a whole number, not {generation!r}")
        return cls(entries=tuple(BootEntry.from_json(e) for e in data.get("entries", [])), generation=generation)


@attrs.frozen(kw_only=True)
class BootRecord:
    """One thing the boot server did for a machine, for the control plane (and ``bcd site serve-local``'s output)."""

    kind: str = attrs.field(validator=attrs.validators.in_(RECORD_KINDS))
    """``dhcp`` (a proxy offer or acknowledgement was sent), ``tftp`` (an iPXE binary was sent in full), ``script``
    (an iPXE script was served), ``file`` (a boot file was sent in full)."""
    mac: str | None
    system_uuid: str | None
    machine_id: str | None
    """The plan's machine, or ``None`` when the plan does not know it."""
    detail: str
    at: float
    """When, in seconds since the epoch."""

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict."""
        return attrs.asdict(self)
