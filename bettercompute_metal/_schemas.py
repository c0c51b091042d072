"""Inputs and outputs of the ``sites``, ``site-tokens`` and ``metal`` groups (images are the core's:
``bettercompute.modules.images``)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

import attrs

from bettercompute.fields import Integer, Text
from bettercompute.paging import PageInput

PowerAction = Literal["on", "off", "shutdown", "reset"]
MachineState = Literal[
    "enrolled", "inspected", "commissioning", "ready", "deploying", "deployed", "releasing", "failed"
]

_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_NAME = Text(
    pattern=r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
    reason="must be a DNS label: 1 to 63 of a-z, 0-9 and '-', not starting or ending in '-'",
)
_SHA256 = Text(pattern=r"[0-9a-f]{64}", reason="must be 64 lower-case hex digits (a SHA-256)")
_BMC_URL = Text(
    pattern=r"https://[\x21-\x7e]{1,500}", reason="must be an https URL of printable ASCII characters, at most 508"
)
_USER = Text(
    pattern=r"[\x21-\x7e]([\x20-\x7e]{0,126}[\x21-\x7e])?",
    reason="must be 1 to 128 printable ASCII characters, not starting or ending in a space",
)
_PASSWORD = Text(pattern=r"[\x20-\x7e]{1,256}", reason="must be 1 to 256 printable ASCII characters")
_PEM = Text(
    pattern=r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\r\n -]{1,65000}-----END CERTIFICATE-----\s*",
    reason="must be PEM certificates",
)
_DISK = Text(pattern=r"[A-Za-z0-9._/-]{1,128}", reason="must be a disk name like 'sda' or 'nvme0n1'")
_USES = Integer(minimum=1, maximum=100, reason="must be between 1 and 100")
_EXPIRY = Integer(minimum=60, maximum=7 * 86400, reason="must be between 60 and 604800 seconds (7 days)")


# --- sites ------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateSiteInput:
    """A site: a network segment with a boot server, in a tenant, whose machines join ``pool_id``.

    ``ramdisk_kernel`` and ``ramdisk_initrd`` name registered images (kinds ``kernel`` and ``initrd``) the site boots
    machines into for commissioning, deploy and release.
    """

    tenant: str = attrs.field(validator=_ID)
    pool_id: str = attrs.field(validator=_ID)
    name: str = attrs.field(validator=_NAME)
    ramdisk_kernel: str | None = attrs.field(default=None, validator=_ID)
    ramdisk_initrd: str | None = attrs.field(default=None, validator=_ID)


@attrs.frozen(kw_only=True)
class Site:
    """A site and who serves its boots now (``boot_holder``: the agent holding the boot lease, until
    ``boot_lease_expires_at``)."""

    id: str
    tenant: str
    pool_id: str
    name: str
    ramdisk_kernel: str | None
    ramdisk_initrd: str | None
    boot_holder: str | None
    boot_lease_expires_at: dt.datetime | None
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class ListSitesInput(PageInput):
    """The tenant whose sites to list."""

    tenant: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListSitesOutput:
    """A page of sites, oldest first."""

    sites: tuple[Site, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class GetSiteInput:
    """A site by id."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class CreateSiteTokenInput:
    """A token a site agent enrolls with (``bcd site join``): single use by default, expiring."""

    site_id: str = attrs.field(validator=_ID)
    uses: int = attrs.field(default=1, validator=_USES)
    expires_in_seconds: int = attrs.field(default=3600, validator=_EXPIRY)


@attrs.frozen(kw_only=True)
class CreatedSiteToken:
    """The token, shown this once (only its hash is kept), and the command that uses it."""

    id: str
    site_id: str
    token: str
    uses: int
    expires_at: dt.datetime
    command: str


# --- machines ---------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class BmcInput:
    """How to reach a machine's BMC over Redfish. Its TLS is trusted one way or the other, never not at all:
    ``ca_pem`` verifies the chain and the host name, ``pin_sha256`` pins the exact certificate (the SHA-256 of its
    DER encoding). The password is sealed by the KMS and never returned."""

    url: str = attrs.field(validator=_BMC_URL)
    username: str = attrs.field(validator=_USER)
    password: str = attrs.field(validator=_PASSWORD, repr=False)
    ca_pem: str | None = attrs.field(default=None, validator=_PEM)
    pin_sha256: str | None = attrs.field(default=None, validator=_SHA256)


@attrs.frozen(kw_only=True)
class EnrollInput:
    """A machine to enroll by its BMC, at a site (whose pool it will join)."""

    site_id: str = attrs.field(validator=_ID)
    bmc: BmcInput
    name: str | None = attrs.field(default=None, validator=_NAME)


@attrs.frozen(kw_only=True)
class Bmc:
    """A machine's BMC as shown: where, how its TLS is trusted, and a reference to its sealed credentials."""

    url: str
    username: str
    tls: Literal["ca", "pin"]
    credentials_ref: str


@attrs.frozen(kw_only=True)
class Machine:
    """A bare-metal machine: its state, the workflow step it is at and why, what inspection and the ramdisk found.

    ``node_id`` is the node the machine joins as once deployed (it keeps it across redeploys).
    """

    id: str
    tenant: str
    pool_id: str
    site_id: str
    name: str | None
    node_id: str
    state: MachineState
    step: str | None
    reason: str | None
    message: str | None
    workflow_id: str | None
    bmc: Bmc
    system_uuid: str | None
    serial: str | None
    macs: tuple[str, ...]
    power_state: str | None
    hardware: dict[str, Any]
    results: dict[str, Any]
    image_id: str | None
    disk: str | None
    boot_records: tuple[dict[str, Any], ...]
    """What the site's boot server last saw of the machine (DHCP, TFTP, script and file requests), newest first;
    in ``metal.get`` only (lists leave it empty)."""
    created_at: dt.datetime
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class MachineInput:
    """A machine by id."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListMachinesInput(PageInput):
    """The tenant whose machines to list (optionally one site's)."""

    tenant: str = attrs.field(validator=_ID)
    site_id: str | None = attrs.field(default=None, validator=_ID)


@attrs.frozen(kw_only=True)
class ListMachinesOutput:
    """A page of machines, oldest first."""

    machines: tuple[Machine, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class PowerInput:
    """A power action through the BMC."""

    id: str = attrs.field(validator=_ID)
    action: PowerAction


@attrs.frozen(kw_only=True)
class DeployInput:
    """Deploy a registered disk image to a ready machine's disk (the first disk the ramdisk reported when left
    out)."""

    id: str = attrs.field(validator=_ID)
    image_id: str = attrs.field(validator=_ID)
    disk: str | None = attrs.field(default=None, validator=_DISK)


@attrs.frozen(kw_only=True)
class PowerOutput:
    """The power state the BMC reported after the action was accepted (it may take seconds to change)."""

    id: str
    action: PowerAction
    power_state: str | None
