"""The built-in groups as one typed set: ``compute.api``, ``AsyncClient`` and ``Client`` are bound instances of it."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSet
from bettercompute.modules.capacity._methods import CapacityGroup, QuotasGroup
from bettercompute.modules.images._methods import ImagesGroup
from bettercompute.modules.inventory._devices import DevicesGroup
from bettercompute.modules.nodes._nodes import NodesGroup
from bettercompute.modules.pools._methods import JoinTokensGroup, PoolsGroup
from bettercompute.modules.secrets._methods import SecretsGroup
from bettercompute.modules.system._methods import SystemGroup
from bettercompute.modules.webhooks._methods import WebhooksGroup

__all__ = ["BuiltinGroups"]

B = TypeVar("B")


class BuiltinGroups(GroupSet[B]):
    """Every group of the core's own modules. ``webhooks`` and ``secrets`` are registered only with ``Options.kms``,
    ``nodes`` and ``devices`` only with ``Options.kms`` and ``Options.join``; elsewhere their calls answer
    ``NOT_FOUND``."""

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
