"""The ``pools`` group's declaration (actions ``compute:pools:<method>``)."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.pools import _service

B = TypeVar("B")


class PoolsGroup(GroupSpec[B]):
    """Pools of machines: class, acceptance checks and labels."""

    name = "pools"
    create = _service.create_pool
    list = _service.list_pools
    get = _service.get_pool
    update = _service.update_pool


ACTIONS = tuple(sorted(m.action for m in PoolsGroup.methods.values()))
