"""The ``nodes`` and ``join-tokens`` groups' declarations (actions ``compute:<group>:<method>``)."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.nodes import _join_tokens, _keys, _rewrap, _service

B = TypeVar("B")


class NodesGroup(GroupSpec[B]):
    """Joined machines: list, get, cordon, drain, uncordon, requalify, revoke, retire, tunnel to a local service."""

    name = "nodes"
    list = _service.list_nodes
    get = _service.get_node
    cordon = _service.cordon_node
    drain = _service.drain_node
    uncordon = _service.uncordon_node
    requalify = _service.requalify_node
    revoke = _service.revoke_node
    retire = _service.retire_handler
    tunnel = _service.tunnel_node


class JoinTokensGroup(GroupSpec[B]):
    """One-time tokens that let machines join a pool."""

    name = "join-tokens"
    create = _join_tokens.create_token
    list = _join_tokens.list_tokens
    get = _join_tokens.get_token
    revoke = _join_tokens.revoke_token


class KeysGroup(GroupSpec[B]):
    """The control plane's own keys: list, rotate and retire them (root scope only).

    Kinds: the node CA's keys (``ca``), the key instructions to nodes are signed with (``instructions``) and
    JoinService's key (``join``). The KMS's own key rotates in the configuration (a ``KmsRing``); ``rewrap`` then
    seals every stored blob again under the new one."""

    name = "keys"
    list = _keys.list_keys
    rotate = _keys.rotate_key
    retire = _keys.retire_key
    rewrap = _rewrap.start_rewrap
    get_rewrap = _rewrap.get_rewrap


ACTIONS = tuple(sorted(m.action for g in (NodesGroup, JoinTokensGroup, KeysGroup) for m in g.methods.values()))
