"""The ``nodes`` group: list and inspect joined machines, revoke a node's identity, retire a node.

Registered with JoinService (``Options.join`` and ``Options.kms``). A node is projected with its tenant and pool at
its join, so ``get``, ``revoke`` and ``retire`` are decided on the node's pool; ``list`` names the tenant.

- ``revoke`` revokes every certificate of the node (``certificate.revoked`` tells gateways to cut its session). The
  node stays: the machine joins again with a token, and with ``reclaim: same-hardware`` it gets its id back.
- ``retire`` ends the node for good and revokes its certificates; its hardware may join again, as a new node.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import attrs

from bettercompute._runtime.registry import CallContext, method
from bettercompute.errors import ConflictError, FailedPreconditionError, NotFoundError, UnauthenticatedError
from bettercompute.modules.nodes._ca import CertificateAuthority
from bettercompute.modules.nodes._inventory import acked_item, lifecycle_item
from bettercompute.modules.nodes._port import NODES, ConditionRecord, NodeRecord
from bettercompute.modules.nodes._schemas import (
    NODE,
    Condition,
    CordonNodeInput,
    GetNodeInput,
    ListNodesInput,
    ListNodesOutput,
    Node,
    RequalifyNodeInput,
    RetireNodeInput,
    RevokedNode,
    RevokeNodeInput,
    TunnelNodeInput,
    TunnelOutput,
)
from bettercompute.modules.nodes._tokens import IDENTITY_NEEDS, JoinSettings
from bettercompute.modules.nodes._tunnels import TunnelRecord, TunnelTicket, open_tunnel_in
from bettercompute.paging import Keyset
from bettercompute.ports import Kms, OutboxEvent, ResourceRef, Store, Transaction

__all__ = [
    "NODE_CORDONED",
    "NODE_REQUALIFYING",
    "NODE_UNCORDONED",
    "node_tunnel_check",
    "retire_node",
    "tunnel_output",
]


def _node(record: NodeRecord, conditions: Sequence[ConditionRecord] = ()) -> Node:
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
        state_reason=record.state_reason,
        state_detail=dict(record.state_detail),
        state_changed_at=record.state_changed_at,
        cordoned=record.cordoned,
        draining=record.draining,
        unreachable_since=record.unreachable_since,
        conditions=tuple(
            Condition(
                type=c.type,
                status=c.status,
                reason=c.reason,
                message=c.message,
                last_transition_at=c.last_transition_at,
            )
            for c in conditions
        ),
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
    # Its atoms are withdrawn; what is booked on it (reservations) learns it is gone.
    await tx.enqueue([lifecycle_item(node_id), acked_item(node_id)])
    return node


def _identity(call: CallContext) -> tuple[JoinSettings, Kms]:
    """``Options.join`` and ``Options.kms``; ``FAILED_PRECONDITION`` naming both where node identity is off."""
    join = call.context.settings.get(JoinSettings)
    kms = call.context.kms
    if join is None or kms is None:
        raise FailedPreconditionError(IDENTITY_NEEDS, details={"needs": ["join", "kms"]})
    return join, kms


def _ca(call: CallContext) -> CertificateAuthority:
    join, kms = _identity(call)
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
    conditions = await call.context.store.repository(NODES).conditions([n.id for n in found[: input.limit]])
    nodes, next_cursor = _NODE_PAGES.page(scope, [_node(n, conditions.get(n.id, ())) for n in found], input.limit)
    return ListNodesOutput(nodes=nodes, next_cursor=next_cursor)


@method(mutates=False, resource=_by_id)
async def get_node(call: CallContext, input: GetNodeInput) -> Node:
    """A node by id.

    Raises:
        NotFoundError: there is no such node.
    """
    record = await _existing(call, input.id)
    conditions = await call.context.store.repository(NODES).conditions([record.id])
    return _node(record, conditions.get(record.id, ()))


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


def _by_node_id(input: Any) -> ResourceRef:
    return ResourceRef(type=NODE, id=input.node_id)


@method(mutates=True, resource=_by_node_id, replayable=False)
async def tunnel_node(call: CallContext, input: TunnelNodeInput) -> TunnelOutput:
    """Open a tunnel to ``127.0.0.1:<port>`` on a node, through the gateway holding its session (docs/tunnels.md).
    The answer holds a one-time ticket: an idempotent retry is not answered it again.

    Raises:
        NotFoundError: there is no such node.
        FailedPreconditionError: the node is retired, or node identity is off.
    """
    _identity(call)
    record = await _existing(call, input.node_id)
    if record.state == "retired":
        raise FailedPreconditionError("the node is retired", details={"id": record.id, "state": record.state})
    if call.identity is None:  # pragma: no cover - only open methods are called without an identity
        raise UnauthenticatedError("a tunnel is opened by an authenticated caller")
    async with call.transaction() as tx:
        ticket = await open_tunnel_in(
            tx,
            tenant=record.tenant,
            identity=call.identity,
            node_id=record.id,
            host="127.0.0.1",
            port=input.port,
            resource=ResourceRef(type=NODE, id=record.id),
            action=call.method.action,
            now=call.context.clock.now(),
        )
        call.describe(
            resource_type=NODE,
            resource_id=record.id,
            tenant=record.tenant,
            details={"event": "tunnel_opened", "tunnel_id": ticket.tunnel_id, "port": input.port},
        )
    return await tunnel_output(call, ticket)


async def tunnel_output(call: CallContext, ticket: TunnelTicket) -> TunnelOutput:
    """The answer of a method that opened a tunnel (``nodes.tunnel``, a module's own): the ticket, the gateway to
    dial (``JoinSettings.tunnel_gateway``, else the join address) and the trust bundle to verify it with."""
    settings, _ = _identity(call)
    return TunnelOutput(
        tunnel_id=ticket.tunnel_id,
        ticket=ticket.ticket,
        gateway=settings.tunnel_gateway or settings.gateway_address,
        ca_pem=await _ca(call).trust_bundle_pem(),
        expires_at=ticket.expires_at,
    )


async def node_tunnel_check(store: Store, tunnel: TunnelRecord, now: dt.datetime) -> str | None:
    """The ``node`` resource type's tunnel check: a tunnel to a retired (or vanished) node closes."""
    record = await store.repository(NODES).get(tunnel.resource_id)
    if record is None or record.state == "retired":
        return "node_retired"
    return None


NODE_CORDONED = "node.cordoned"
"""Published when a node stops taking new bookings (payload: node_id, pool_id, draining, reason)."""
NODE_UNCORDONED = "node.uncordoned"
"""Published when a node takes new bookings again (payload: node_id, pool_id, reason)."""
NODE_REQUALIFYING = "node.requalifying"
"""Published when an operator runs a node's acceptance checks again (payload: node_id, pool_id, from, reason)."""
_REQUALIFIABLE = ("adopted", "quarantined", "adopting")


async def _change(call: CallContext, node_id: str, change: Any, event: str, extra: dict[str, Any], reason: str) -> Node:
    """Apply ``change(record) -> record | None`` to the locked node, write it, audit it and publish ``event`` when it
    changed anything (a repeated call changes nothing and publishes nothing, but is audited like any call)."""
    async with call.transaction() as tx:
        record = await tx.repository(NODES).get_for_update(node_id)
        if record is None:
            raise NotFoundError("no such node", details={"id": node_id})
        if record.state == "retired":
            raise FailedPreconditionError("the node is retired", details={"id": node_id, "state": record.state})
        wanted = change(record)
        changed = wanted is not None and wanted != record
        if changed:
            saved = await tx.repository(NODES).save_lifecycle(wanted)
            if saved is None:  # pragma: no cover - the row is locked and not retired
                raise NotFoundError("no such node", details={"id": node_id})
            payload = {"node_id": record.id, "pool_id": record.pool_id, **extra, "reason": reason}
            await tx.publish([OutboxEvent(type=event, key=record.id, payload=payload)])
            if event == NODE_REQUALIFYING:
                await tx.enqueue([lifecycle_item(record.id)])
            record = saved
        call.describe(
            resource_type=NODE,
            resource_id=record.id,
            tenant=record.tenant,
            details={"reason": reason, "changed": changed, **extra},
        )
    conditions = await call.context.store.repository(NODES).conditions([record.id])
    return _node(record, conditions.get(record.id, ()))


@method(mutates=True, resource=_by_id)
async def cordon_node(call: CallContext, input: CordonNodeInput) -> Node:
    """Stop new bookings on a node; what is booked stays. Idempotent.

    Raises:
        NotFoundError: there is no such node.
        FailedPreconditionError: the node is retired.
    """
    return await _change(
        call,
        input.id,
        lambda n: attrs.evolve(n, cordoned=True) if not n.cordoned else None,
        NODE_CORDONED,
        {"draining": False},
        input.reason,
    )


@method(mutates=True, resource=_by_id)
async def drain_node(call: CallContext, input: CordonNodeInput) -> Node:
    """Cordon a node and let its bookings run to their end (none is moved or cut short). Idempotent.

    Raises:
        NotFoundError: there is no such node.
        FailedPreconditionError: the node is retired.
    """
    return await _change(
        call,
        input.id,
        lambda n: attrs.evolve(n, cordoned=True, draining=True) if not n.draining else None,
        NODE_CORDONED,
        {"draining": True},
        input.reason,
    )


@method(mutates=True, resource=_by_id)
async def uncordon_node(call: CallContext, input: CordonNodeInput) -> Node:
    """Let a cordoned or draining node take new bookings again. Idempotent.

    Raises:
        NotFoundError: there is no such node.
        FailedPreconditionError: the node is retired.
    """
    return await _change(
        call,
        input.id,
        lambda n: attrs.evolve(n, cordoned=False, draining=False) if n.cordoned or n.draining else None,
        NODE_UNCORDONED,
        {},
        input.reason,
    )


def _requalify(record: NodeRecord) -> NodeRecord | None:
    if record.state not in _REQUALIFIABLE:
        raise ConflictError(
            f"a node that is {record.state} cannot be requalified",
            details={"id": record.id, "state": record.state, "reason": "wrong_state"},
        )
    if record.state == "adopting" and not record.acceptance.get("finished"):
        return None  # a round is running already: its result stands
    acceptance = {"round": int(record.acceptance.get("round") or 0)}
    return attrs.evolve(record, state="adopting", state_reason="requalifying", state_detail={}, acceptance=acceptance)


@method(mutates=True, resource=_by_id)
async def requalify_node(call: CallContext, input: RequalifyNodeInput) -> Node:
    """Run a node's acceptance checks again: it is ``adopting`` until they end, then ``adopted`` or ``quarantined``.
    A node whose checks are running already is left to them.

    Raises:
        NotFoundError: there is no such node.
        FailedPreconditionError: the node is retired.
        ConflictError: the node is unreachable or failed (reason ``wrong_state``).
    """

    def change(record: NodeRecord) -> NodeRecord | None:
        return _requalify(record)

    record = await _existing(call, input.id)
    return await _change(call, input.id, change, NODE_REQUALIFYING, {"from": record.state}, input.reason)
