"""The ``pools`` and ``join-tokens`` groups' declarations (actions ``compute:<group>:<method>``)."""

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


class JoinTokensGroup(GroupSpec[B]):
    """One-time tokens that let machines join a pool."""

    name = "join-tokens"
    create = _service.create_token
    list = _service.list_tokens
    get = _service.get_token
    revoke = _service.revoke_token


ACTIONS = tuple(sorted(m.action for g in (PoolsGroup, JoinTokensGroup) for m in g.methods.values()))
