"""The ``nodes`` group: list and inspect joined machines, revoke a node's identity, retire a node.

Registered with JoinService (``Options.join`` and ``Options.kms``). A node is projected with its tenant and pool at
its join, so ``get``, ``revoke`` and ``retire`` are decided on the node's pool; ``list`` names the tenant.

- ``revoke`` revokes every certificate of the node (``certificate.revoked`` tells gateways to cut its session). The
  node stays: the machine joins again with a token, and with ``reclaim: same-hardware`` it gets its id back.
- ``retire`` ends the node for good and revokes its certificates; its hardware may join again, as a new node.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, TypeVar

import attrs

from bettercompute._runtime.registry import CallContext, GroupSpec, method
from bettercompute.errors import FailedPreconditionError, NotFoundError
from bettercompute.fields import Text
from bettercompute.modules.nodes._ca import CertificateAuthority
from bettercompute.modules.nodes._port import NODES, NodeRecord
from bettercompute.modules.nodes._tokens import JoinSettings
from bettercompute.paging import Keyset, PageInput
from bettercompute.ports import ResourceRef, Transaction

__all__ = [
    "GetNodeInput",
    "ListNodesInput",
    "ListNodesOutput",
    "Node",
    "NodesGroup",
    "RetireNodeInput",
    "RevokeNodeInput",
    "RevokedNode",
    "retire_node",
]

NODE = "node"
NodeState = Literal["adopting", "adopted", "failed", "retired"]
_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_REASON = Text(max_length=500, reason="at most 500 characters")
B = TypeVar("B")


@attrs.frozen(kw_only=True)
class ListNodesInput(PageInput):
    """A tenant's nodes, of one pool when ``pool_id`` is given, one page at a time."""

    tenant: str = attrs.field(validator=_ID)
    pool_id: str | None = attrs.field(default=None, validator=_ID)


@attrs.frozen(kw_only=True)
class GetNodeInput:
    """A node by id."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class RevokeNodeInput:
    """Revoke every certificate of a node, saying why (kept in the audit row and the revocations)."""

    id: str = attrs.field(validator=_ID)
    reason: str = attrs.field(default="revoked by an operator", validator=_REASON)


@attrs.frozen(kw_only=True)
class RetireNodeInput:
    """Retire a node for good, saying why."""

    id: str = attrs.field(validator=_ID)
    reason: str = attrs.field(default="retired by an operator", validator=_REASON)


@attrs.frozen(kw_only=True)
class Node:
    """A joined machine: its state, the hardware claims of its latest join, what attestors recorded, its session, and
    its desired-state generations (the latest given, the latest its daemon acknowledged)."""

    id: str
    tenant: str
    pool_id: str
    site_id: str | None
    state: NodeState
    hardware_key: str
    claims: dict[str, Any]
    attestation: dict[str, Any]
    enrollments: int
    session_epoch: int
    last_seen_at: dt.datetime | None
    joined_at: dt.datetime
    created_at: dt.datetime
    retired_at: dt.datetime | None
    desired_generation: int
    observed_generation: int
    desired_state_pending: bool
    """Whether the daemon has yet to acknowledge the latest desired state (``observed_generation`` behind)."""


@attrs.frozen(kw_only=True)
class ListNodesOutput:
    """A page of nodes, oldest first; ``next_cursor`` is null on the last page."""

    nodes: tuple[Node, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class RevokedNode:
    """The node and the serials this call revoked (empty when all were revoked already)."""

    node: Node
    serials: tuple[str, ...]


def _node(record: NodeRecord) -> Node:
    state: Any = record.state
    return Node(
        id=record.id,
        tenant=record.tenant,
        pool_id=record.pool_id,
        site_id=record.site_id,
        state=state,
        hardware_key=record.hardware_key,
        claims=dict(record.claims),
        attestation=dict(record.attestation),
        enrollments=record.enrollments,
        session_epoch=record.session_epoch,
        last_seen_at=record.last_seen_at,
        joined_at=record.joined_at,
        created_at=record.created_at,
        retired_at=record.retired_at,
        desired_generation=record.desired_generation,
        observed_generation=record.observed_generation,
        desired_state_pending=record.observed_generation < record.desired_generation,
    )


async def retire_node(tx: Transaction, ca: CertificateAuthority, node_id: str, *, reason: str) -> NodeRecord:
    """Retire a node and revoke its certificates in ``tx``.

    Raises:
        NotFoundError: there is no such node.
    """
    node = await tx.repository(NODES).retire(node_id)
    if node is None:
        raise NotFoundError("no such node", details={"id": node_id})
    await ca.revoke_spiffe_id_in(tx, ca.spiffe_id(node_id), reason=reason)
    return node


def _ca(call: CallContext) -> CertificateAuthority:
    join = call.context.settings.get(JoinSettings)
    kms = call.context.kms
    if join is None or kms is None:  # pragma: no cover - the group exists only with both
        raise FailedPreconditionError("nodes need Options.join and Options.kms")
    return CertificateAuthority(call.context.store, kms, trust_domain=join.trust_domain, clock=call.context.clock)


async def _existing(call: CallContext, node_id: str) -> NodeRecord:
    record = await call.context.store.repository(NODES).get(node_id)
    if record is None:
        raise NotFoundError("no such node", details={"id": node_id})
    return record


_NODE_PAGES: Keyset[Node] = Keyset(dt.datetime, str, key=lambda n: (n.created_at, n.id))


def _tenant(input: Any) -> ResourceRef:
    return ResourceRef(type=NODE, tenant=input.tenant, pool=input.pool_id)


def _by_id(input: Any) -> ResourceRef:
    # Projected with its tenant and pool at the join.
    return ResourceRef(type=NODE, id=input.id)


@method(mutates=False, resource=_tenant)
async def list_nodes(call: CallContext, input: ListNodesInput) -> ListNodesOutput:
    """A page of a tenant's nodes (of one pool), oldest first.

    Raises:
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _NODE_PAGES.after(scope, input.cursor)
    found = await call.context.store.repository(NODES).for_tenant(
        input.tenant, pool_id=input.pool_id, after=after, limit=input.limit + 1
    )
    nodes, next_cursor = _NODE_PAGES.page(scope, [_node(n) for n in found], input.limit)
    return ListNodesOutput(nodes=nodes, next_cursor=next_cursor)


@method(mutates=False, resource=_by_id)
async def get_node(call: CallContext, input: GetNodeInput) -> Node:
    """A node by id.

    Raises:
        NotFoundError: there is no such node.
    """
    return _node(await _existing(call, input.id))


@method(mutates=True, resource=_by_id)
async def revoke_node(call: CallContext, input: RevokeNodeInput) -> RevokedNode:
    """Revoke every certificate of a node.

    Raises:
        NotFoundError: there is no such node.
    """
    record = await _existing(call, input.id)
    ca = _ca(call)
    async with call.transaction() as tx:
        revoked = await ca.revoke_spiffe_id_in(tx, ca.spiffe_id(record.id), reason=input.reason)
        call.describe(
            resource_type=NODE,
            resource_id=record.id,
            tenant=record.tenant,
            details={"reason": input.reason, "serials": list(revoked.serials)},
        )
    return RevokedNode(node=_node(record), serials=revoked.serials)


@method(mutates=True, resource=_by_id)
async def retire_handler(call: CallContext, input: RetireNodeInput) -> Node:
    """Retire a node for good and revoke its certificates.

    Raises:
        NotFoundError: there is no such node.
    """
    ca = _ca(call)
    async with call.transaction() as tx:
        record = await retire_node(tx, ca, input.id, reason=input.reason)
        call.describe(resource_type=NODE, resource_id=record.id, tenant=record.tenant, details={"reason": input.reason})
    return _node(record)


class NodesGroup(GroupSpec[B]):
    """Joined machines: list, get, revoke their identity, retire them."""

    name = "nodes"
    list = list_nodes
    get = get_node
    revoke = revoke_node
    retire = retire_handler


ACTIONS = tuple(sorted(m.action for m in NodesGroup.methods.values()))
