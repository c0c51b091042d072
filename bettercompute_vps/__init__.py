"""VPS instances (v0.3): on ``vps-host`` pools, run by ``bcd node`` as QEMU virtual machines from the node's desired
state; on ``provider`` pools, launched at a cloud provider by the ``vps-provider`` workflow (EC2 is the adapter
built in), with no agent of ours in the tenant's machine.

Register with ``Options(modules=[VpsModule()])``. Images come from the core's ``images`` group (shared with bare
metal); a provider pool's credentials are a secret of the ``secrets`` group (so the control plane needs a KMS).


The provider adapter port and its helpers need the ``vps`` extra; ``Ec2Adapter`` and its settings need the ``ec2``
extra (boto3) and are imported on first use, so a control plane without boto3 can still import this package.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from bettercompute import GatewayMethod, GroupSet, GroupSpec, Job, ModuleContext, Reconciler, Workflow
from bettercompute.modules.images import IMAGES
from bettercompute.modules.nodes import NODES, TunnelCheck
from bettercompute.modules.pools import POOLS
from bettercompute.ports import Migration, Repository
from bettercompute_vps import _pools, _reads, _transitions, _tunnels
from bettercompute_vps._hosted import HOST_SYNC, NODE_CONTROLLER, NODE_WATCH, REPORT
from bettercompute_vps._lifecycle import INSTANCE as _INSTANCE
from bettercompute_vps._pg import MIGRATIONS as _MIGRATIONS
from bettercompute_vps._port import VPS
from bettercompute_vps._provider import (
    MAX_USER_DATA_BYTES,
    PROVIDER_AUTH_FAILED,
    PROVIDER_ERROR_CODES,
    PROVIDER_IMAGE_NOT_FOUND,
    PROVIDER_INVALID,
    PROVIDER_NOT_FOUND,
    PROVIDER_QUOTA,
    PROVIDER_STATES,
    PROVIDER_THROTTLED,
    PROVIDER_UNAVAILABLE,
    InstanceType,
    LaunchRequest,
    ProviderAdapter,
    ProviderError,
    ProviderInstance,
    compose_user_data,
    pick_instance_type,
)
from bettercompute_vps._workflows import AdapterFactory
from bettercompute_vps._workflows import default_adapters as _default_adapters
from bettercompute_vps._workflows import provider_workflow as _provider_workflow

if typing.TYPE_CHECKING:
    from bettercompute_vps._ec2 import CLIENT_TOKEN_TAG, Ec2Adapter, Ec2Credentials, Ec2Settings

__version__ = "0.3.0"

__all__ = [
    "CLIENT_TOKEN_TAG",
    "MAX_USER_DATA_BYTES",
    "PROVIDER_AUTH_FAILED",
    "PROVIDER_ERROR_CODES",
    "PROVIDER_IMAGE_NOT_FOUND",
    "PROVIDER_INVALID",
    "PROVIDER_NOT_FOUND",
    "PROVIDER_QUOTA",
    "PROVIDER_STATES",
    "PROVIDER_THROTTLED",
    "PROVIDER_UNAVAILABLE",
    "AdapterFactory",
    "Ec2Adapter",
    "Ec2Credentials",
    "Ec2Settings",
    "InstanceType",
    "InstancesGroup",
    "LaunchRequest",
    "ProviderAdapter",
    "ProviderError",
    "ProviderInstance",
    "VpsGroups",
    "VpsModule",
    "VpsPoolsGroup",
    "__version__",
    "compose_user_data",
    "pick_instance_type",
]

_EC2_NAMES = frozenset({"CLIENT_TOKEN_TAG", "Ec2Adapter", "Ec2Credentials", "Ec2Settings"})


def __getattr__(name: str) -> Any:
    if name in _EC2_NAMES:
        from bettercompute_vps import _ec2

        return getattr(_ec2, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_B = TypeVar("_B")


class InstancesGroup(GroupSpec[_B]):
    """VPS instances: created through admission on ``compute-instance``, then changed only through their desired
    state (power, size, reboot, deletion), which their node or their provider workflow converges to."""

    name = "instances"
    create = _transitions.create
    get = _reads.get
    list = _reads.list_instances
    start = _transitions.start
    stop = _transitions.stop
    reboot = _transitions.reboot
    resize = _transitions.resize
    delete = _transitions.delete
    console = _reads.console
    usage = _reads.usage
    tunnel = _tunnels.tunnel


class VpsPoolsGroup(GroupSpec[_B]):
    """How ``vps-host`` and ``provider`` pools run instances: overcommit ratios, per-tenant quotas, the provider."""

    name = "vps-pools"
    configure = _pools.configure_pool
    get = _pools.get_pool


class VpsGroups(GroupSet[_B]):
    """The module's groups, typed: ``VpsGroups(compute.api).instances`` or ``VpsGroups(client)``."""

    instances: InstancesGroup[_B]
    vps_pools: VpsPoolsGroup[_B]


class VpsModule:
    """The VPS module (``Options.modules``); ``initialize()`` runs its migrations.

    Args:
        adapters: Provider adapters by provider kind (``{"ec2": ...}`` by default): a factory taking the pool's
            provider settings and its decrypted credentials.
    """

    name = "vps"
    version = __version__
    core_range = ">=0.1,<0.4"
    groups: Sequence[type[GroupSpec[Any]]] = (InstancesGroup, VpsPoolsGroup)
    actions: Sequence[str] = ()
    migrations: Mapping[str, Sequence[Migration]] = {"postgresql": _MIGRATIONS}
    jobs: Sequence[Job] = (HOST_SYNC, NODE_WATCH)
    reconcilers: Sequence[Reconciler] = (NODE_CONTROLLER,)
    repositories: Sequence[Repository[Any]] = (VPS, IMAGES, POOLS, NODES)
    gateway_methods: Sequence[GatewayMethod] = (REPORT,)
    tunnel_checks: Mapping[str, TunnelCheck] = {_INSTANCE: _tunnels.instance_tunnel_check}

    def __init__(self, *, adapters: Mapping[str, AdapterFactory] | None = None) -> None:
        self.workflows: Sequence[Workflow] = (
            _provider_workflow(dict(adapters) if adapters is not None else _default_adapters()),
        )

    async def start(self, context: ModuleContext) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""
