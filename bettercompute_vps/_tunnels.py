"""Tunnels to a hosted instance's ports, through the gateway holding its node's session (docs/tunnels.md)."""

from __future__ import annotations

import datetime as dt

from bettercompute import CallContext, JoinSettings, method
from bettercompute.errors import FailedPreconditionError, InvalidInputError, UnauthenticatedError
from bettercompute.modules.nodes import TunnelOutput, TunnelRecord, open_tunnel_in, tunnel_output
from bettercompute.ports import ResourceRef, Store
from bettercompute_vps._lifecycle import HOSTED, INSTANCE, on_instance
from bettercompute_vps._port import VPS
from bettercompute_vps._reads import existing
from bettercompute_vps._schemas import TunnelInput

__all__ = ["instance_tunnel_check", "tunnel"]


@method(mutates=True, resource=on_instance, replayable=False)
async def tunnel(call: CallContext, input: TunnelInput) -> TunnelOutput:
    """Open a tunnel to one of a running hosted instance's ``ports``, through the gateway holding its node's session
    (``better-compute tunnel <id> --port P --local L``; docs/tunnels.md). The answer holds a one-time ticket; the
    tunnel closes when the instance stops or is deleted, or the caller loses ``compute:instances:tunnel`` on it.

    Raises:
        NotFoundError: no such instance.
        InvalidInputError: the port is not one the instance exposes (``ports``).
        FailedPreconditionError: the instance is not running on a node (a provider pool's instances are reached at
            their provider's addresses).
    """
    record = await existing(call, input.id)
    if input.port not in record.ports:
        reason = f"the instance exposes ports {list(record.ports)} only"
        raise InvalidInputError(f"port: {reason}", details={"path": "port", "reason": reason})
    if record.pool_class != HOSTED or record.node_id is None:
        raise FailedPreconditionError(
            "only an instance on a node of a vps-host pool is reached through a tunnel",
            details={"pool_class": record.pool_class},
        )
    if record.deleting or record.state != "running" or record.power != "running":
        raise FailedPreconditionError(
            f"the instance is {record.state}; a tunnel needs it running", details={"state": record.state}
        )
    if call.identity is None:  # pragma: no cover - only open methods are called without an identity
        raise UnauthenticatedError("a tunnel is opened by an authenticated caller")
    settings = call.context.settings.get(JoinSettings)
    kms = call.context.kms
    if settings is None or kms is None:
        raise FailedPreconditionError("tunnels need node identity (Options.join) and a KMS")
    async with call.transaction() as tx:
        ticket = await open_tunnel_in(
            tx,
            tenant=record.tenant,
            identity=call.identity,
            node_id=record.node_id,
            host=f"instance:{record.id}",
            port=input.port,
            resource=ResourceRef(type=INSTANCE, id=record.id),
            action=call.method.action,
            now=call.context.clock.now(),
        )
        call.describe(
            resource_type=INSTANCE,
            resource_id=record.id,
            tenant=record.tenant,
            details={"event": "tunnel_opened", "tunnel_id": ticket.tunnel_id, "port": input.port},
        )
    return await tunnel_output(call, ticket)


async def instance_tunnel_check(store: Store, tunnel: TunnelRecord, now: dt.datetime) -> str | None:
    """Tunnels to an instance close when it no longer runs: stopped, being deleted, failed, or gone."""
    record = await store.repository(VPS).get_instance(tunnel.resource_id)
    if record is None or record.deleted_at is not None or record.deleting:
        return "instance_deleted"
    if record.power != "running" or record.state not in ("running", "provisioning"):
        return "instance_stopped"
    return None
