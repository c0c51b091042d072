"""Bare metal (v0.2): sites and their boot servers, machines enrolled by their BMC, inspected over Redfish and
commissioned through PXE into ``bcd ramdisk``, deployed from a disk image to join a pool as nodes, and released.

The images it boots (the ramdisk's kernel and initrd, the disk images it deploys) are the core's image registry
(``bettercompute.modules.images``, group ``images``), which VPS shares.

Register with ``Options(modules=[MetalModule()], join=..., kms=...)``: the module needs the node identity module
(its agents get certificates from the control plane's CA) and a KMS (BMC credentials are sealed by it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from bettercompute import GatewayMethod, GroupSet, GroupSpec, Job, ModuleContext, Workflow
from bettercompute.modules.images import IMAGES
from bettercompute.modules.nodes import JOIN_TOKENS, NODES
from bettercompute.modules.pools import POOLS
from bettercompute.ports import Migration, Repository, Sealed
from bettercompute_metal import _service
from bettercompute_metal._gateway import GATEWAY_METHODS as _GATEWAY_METHODS
from bettercompute_metal._gateway import SIGNED_REPORTS, report_message, verify_reports
from bettercompute_metal._pg import MIGRATIONS as _MIGRATIONS
from bettercompute_metal._port import METAL, SEALED_BMC_CREDENTIALS
from bettercompute_metal._workflows import BOOT_RECORDS_TRIM as _BOOT_RECORDS_TRIM
from bettercompute_metal._workflows import NODE_WATCH as _NODE_WATCH
from bettercompute_metal._workflows import WORKFLOWS as _WORKFLOWS

__version__ = "0.2.0"

__all__ = [
    "SIGNED_REPORTS",
    "MetalGroup",
    "MetalGroups",
    "MetalModule",
    "SiteTokensGroup",
    "SitesGroup",
    "report_message",
    "verify_reports",
]

_B = TypeVar("_B")


class SitesGroup(GroupSpec[_B]):
    """Sites: network segments with a boot server (``bcd site``) whose machines join one pool."""

    name = "sites"
    create = _service.create_site
    list = _service.list_sites
    get = _service.get_site


class SiteTokensGroup(GroupSpec[_B]):
    """Tokens a site agent enrolls with (``bcd site join``)."""

    name = "site-tokens"
    create = _service.create_site_token


class MetalGroup(GroupSpec[_B]):
    """Bare-metal machines: enrolled by their BMC, inspected over Redfish, commissioned through the ramdisk."""

    name = "metal"
    enroll = _service.enroll
    get = _service.get_machine
    list = _service.list_machines
    commission = _service.commission
    deploy = _service.deploy
    release = _service.release
    retry = _service.retry
    power = _service.power


class MetalGroups(GroupSet[_B]):
    """The module's groups, typed: ``MetalGroups(compute.api).metal`` or ``MetalGroups(client)``. Images are the
    core's ``images`` group (``compute.api.images``)."""

    sites: SitesGroup[_B]
    site_tokens: SiteTokensGroup[_B]
    metal: MetalGroup[_B]


class MetalModule:
    """The bare-metal module (``Options.modules``); ``initialize()`` runs its migrations."""

    name = "metal"
    version = __version__
    core_range = ">=0.1,<0.3"
    groups: Sequence[type[GroupSpec[Any]]] = (SitesGroup, SiteTokensGroup, MetalGroup)
    actions: Sequence[str] = ("compute:sites:join", "compute:metal:ramdisk-join")
    migrations: Mapping[str, Sequence[Migration]] = {"postgresql": _MIGRATIONS}
    jobs: Sequence[Job] = (_NODE_WATCH, _BOOT_RECORDS_TRIM)
    repositories: Sequence[Repository[Any]] = (METAL, IMAGES, POOLS, JOIN_TOKENS, NODES)
    sealed: Sequence[Repository[Sealed]] = (SEALED_BMC_CREDENTIALS,)
    workflows: Sequence[Workflow] = _WORKFLOWS
    gateway_methods: Sequence[GatewayMethod] = _GATEWAY_METHODS

    async def start(self, context: ModuleContext) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""
