"""Inputs and outputs of the ``devices`` group."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

import attrs

from bettercompute.fields import Text
from bettercompute.paging import PageInput

__all__ = ["Atom", "Device", "DeviceKind", "GetDeviceInput", "ListDevicesInput", "ListDevicesOutput"]


DeviceKind = Literal["gpu", "nic", "disk"]
_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")


@attrs.frozen(kw_only=True)
class ListDevicesInput(PageInput):
    """A tenant's devices, of one node and of one kind when given, one page at a time."""

    tenant: str = attrs.field(validator=_ID)
    node_id: str | None = attrs.field(default=None, validator=_ID)
    kind: DeviceKind | None = None


@attrs.frozen(kw_only=True)
class GetDeviceInput:
    """A device of a node."""

    node_id: str = attrs.field(validator=_ID)
    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class Atom:
    """A unit of capacity: a whole GPU or a MIG slice, ``available`` or ``unavailable`` with a reason."""

    id: str
    kind: str
    ident: str
    model: str | None
    profile: str | None
    memory_mib: int | None
    state: str
    reason: str | None


@attrs.frozen(kw_only=True)
class Device:
    """A GPU, NIC or disk of a node: ``present``, ``missing`` (no longer reported, kept with what was on it) or
    ``conflict`` (a GPU UUID another node holds). ``details`` are what the daemon reported (for a GPU: memory, MIG
    mode and slices, NVLink peers, driver)."""

    id: str
    node_id: str
    tenant: str
    pool_id: str
    kind: str
    ident: str
    slot: str | None
    model: str | None
    details: dict[str, Any]
    state: str
    first_seen_at: dt.datetime | None
    missing_since: dt.datetime | None
    atoms: tuple[Atom, ...]


@attrs.frozen(kw_only=True)
class ListDevicesOutput:
    """A page of devices by node, kind and identity; ``next_cursor`` is null on the last page."""

    devices: tuple[Device, ...]
    next_cursor: str | None
