"""What the ``metal`` module needs of a store (one repository, ``METAL``), and its records."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository, Sealed

__all__ = ["METAL", "SEALED_BMC_CREDENTIALS", "MachineRecord", "Metal", "SiteRecord", "SiteTokenUse"]


@attrs.frozen(kw_only=True)
class SiteRecord:
    id: str
    tenant: str
    pool_id: str
    name: str
    ramdisk_kernel: str | None
    ramdisk_initrd: str | None
    boot_holder: str | None
    boot_expires_at: dt.datetime | None
    boot_synced_at: dt.datetime | None
    """When the boot lease's holder last fetched the site's plan."""
    boot_http_base: str | None
    """Where the holder serves its files (``http://<address>:<port>``), as it said at its last sync."""
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class SiteTokenUse:
    """What spending a site token found: the site when a use was left, else why not."""

    site: SiteRecord | None
    refusal: str | None


MACHINE_FIELDS = frozenset(
    {
        "state",
        "step",
        "reason",
        "message",
        "workflow_id",
        "system_uuid",
        "serial",
        "macs",
        "power_state",
        "hardware",
        "results",
        "boot",
        "task",
        "tasks",
        "ramdisk_token",
        "image_id",
        "disk",
        "hardware_key",
        "node_id",
    }
)
"""The columns ``Metal.update_machine`` may set."""


@attrs.frozen(kw_only=True)
class MachineRecord:
    id: str
    tenant: str
    pool_id: str
    site_id: str
    name: str | None
    node_id: str
    state: str
    step: str | None
    reason: str | None
    message: str | None
    workflow_id: str | None
    bmc_url: str
    bmc_username: str
    bmc_tls: Mapping[str, Any]
    bmc_secret: bytes = attrs.field(repr=False)
    system_uuid: str | None
    serial: str | None
    macs: tuple[str, ...]
    power_state: str | None
    hardware: Mapping[str, Any]
    results: Mapping[str, Any]
    boot: Mapping[str, Any]
    """What the site serves the machine: ``{"action": "ramdisk"|"local", "token": <sealed, base64>}``."""
    task: Mapping[str, Any] | None
    tasks: tuple[str, ...]
    ramdisk_token: Mapping[str, Any] | None
    """``{"id", "hash" (hex SHA-256 of the secret), "expires_at" (ISO)}`` of the one ramdisk token minted."""
    image_id: str | None
    disk: str | None
    hardware_key: str | None
    created_at: dt.datetime
    updated_at: dt.datetime


class Metal(Protocol):
    """Sites, site tokens, machines and boot records (images are the core's ``IMAGES``). Writes need a
    transaction."""

    async def create_site(
        self, *, id: str, tenant: str, pool_id: str, name: str, kernel: str | None, initrd: str | None
    ) -> SiteRecord | None:
        """Add a site; ``None`` when the tenant has one of that name."""
        ...

    async def get_site(self, id: str) -> SiteRecord | None: ...

    async def list_sites(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[SiteRecord]: ...

    async def create_site_token(
        self, *, id: str, site_id: str, secret_hash: bytes, uses: int, expires_at: dt.datetime
    ) -> None: ...

    async def use_site_token(self, id: str, secret_hash: bytes, *, now: dt.datetime) -> SiteTokenUse:
        """Spend one use of a site token (locked, checked on its latest version)."""
        ...

    async def sync_boot_lease(
        self, site_id: str, agent: str, *, ttl: dt.timedelta, now: dt.datetime, http_base: str | None = None
    ) -> tuple[bool, str | None, dt.datetime | None]:
        """Renew or take the site's boot lease for ``agent`` (noting where it serves its files): (whether it holds
        it, the holder, until when)."""
        ...

    async def create_machine(
        self,
        *,
        id: str,
        tenant: str,
        pool_id: str,
        site_id: str,
        name: str | None,
        node_id: str,
        bmc_url: str,
        bmc_username: str,
        bmc_tls: Mapping[str, Any],
        bmc_secret: bytes,
    ) -> MachineRecord | None:
        """Add a machine as ``enrolled``; ``None`` when its BMC URL or name is taken already."""
        ...

    async def get_machine(self, id: str) -> MachineRecord | None: ...

    async def lock_machine(self, id: str) -> MachineRecord | None:
        """The machine, locked until the transaction ends."""
        ...

    async def list_machines(
        self, tenant: str, *, site_id: str | None, after: Sequence[Any] | None, limit: int
    ) -> list[MachineRecord]: ...

    async def deploying(self) -> list[MachineRecord]:
        """The machines being deployed (their workflows wait for their nodes)."""
        ...

    async def machines_at_site(self, site_id: str) -> list[MachineRecord]:
        """Every machine of a site (its boot plan)."""
        ...

    async def update_machine(self, id: str, **fields: Any) -> MachineRecord | None:
        """Set ``fields`` (names in ``MACHINE_FIELDS``) and ``updated_at``."""
        ...

    async def add_boot_records(self, site_id: str, records: Sequence[Mapping[str, Any]]) -> int:
        """Keep what a site's boot server saw."""
        ...

    async def trim_boot_records(self, *, before: dt.datetime) -> int:
        """Forget the boot records received before ``before``; how many."""
        ...

    async def boot_records(self, machine_id: str, *, limit: int) -> list[dict[str, Any]]:
        """A machine's latest boot records, newest first."""
        ...


METAL: Repository[Metal] = Repository(module="metal", name="metal", adapters={"postgresql": "bettercompute_metal._pg"})
SEALED_BMC_CREDENTIALS: Repository[Sealed] = Repository(
    module="metal", name="sealed_bmc_credentials", adapters={"postgresql": "bettercompute_metal._pg"}
)
"""Each machine's BMC credentials (``machines.bmc_secret``)."""
