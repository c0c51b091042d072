"""The built-in groups as one typed set: ``compute.api``, ``AsyncClient`` and ``Client`` are bound instances of it."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSet
from bettercompute.modules.audit import AuditGroup
from bettercompute.modules.capacity import CapacityGroup, QuotasGroup
from bettercompute.modules.images import ImagesGroup
from bettercompute.modules.inventory import DevicesGroup
from bettercompute.modules.nodes import JoinTokensGroup, KeysGroup, NodesGroup
from bettercompute.modules.pools import PoolsGroup
from bettercompute.modules.secrets import SecretsGroup
from bettercompute.modules.system import SystemGroup
from bettercompute.modules.webhooks import WebhooksGroup

__all__ = ["BuiltinGroups"]

B = TypeVar("B")


class BuiltinGroups(GroupSet[B]):
    """Every group of the core's own modules. ``webhooks`` and ``secrets`` are registered only with ``Options.kms``;
    elsewhere their calls answer ``NOT_FOUND``."""

    system: SystemGroup[B]
    pools: PoolsGroup[B]
    join_tokens: JoinTokensGroup[B]
    images: ImagesGroup[B]
    quotas: QuotasGroup[B]
    capacity: CapacityGroup[B]
    webhooks: WebhooksGroup[B]
    secrets: SecretsGroup[B]
    nodes: NodesGroup[B]
    devices: DevicesGroup[B]
    audit: AuditGroup[B]
    keys: KeysGroup[B]
