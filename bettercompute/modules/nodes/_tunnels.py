"""Tunnels: a TCP stream to a port on a node (a local service) or to an instance's port, carried through a gateway
on the node's own connection (``docs/tunnels.md``).

A module opens one in its own transaction with ``open_tunnel_in``: a row in ``tunnels`` and a one-time ticket,
``bctt_<id>.<secret>``, shown once (only the SHA-256 of the secret is stored). The client presents the ticket to a
gateway within ``TICKET_TTL``; the gateway spends it (``GatewayServices.tunnel_accept``), asks the node to connect
and, while bytes flow, asks once a second whether each open tunnel must close (``GatewayServices.tunnel_check``):
closed already, the caller's credential gone, the IAM action no longer allowed on the resource, or what the module
owning the resource type says (its ``tunnel_checks``).
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.errors import InvalidInputError
from bettercompute.modules.nodes._tokens import hash_secret
from bettercompute.ports import AuditRecord, Identity, Repository, ResourceRef, Store, Transaction

__all__ = [
    "STALE_AFTER",
    "TICKET_PREFIX",
    "TICKET_TTL",
    "TUNNELS",
    "TunnelCheck",
    "TunnelGrant",
    "TunnelRecord",
    "TunnelTicket",
    "Tunnels",
    "closed_record",
    "open_tunnel_in",
    "parse_ticket",
    "sweep_tunnels",
]

TICKET_PREFIX = "bctt_"
TICKET_TTL = dt.timedelta(seconds=60)
"""How long a ticket may wait before a gateway spends it."""
STALE_AFTER = dt.timedelta(seconds=60)
"""How long an open tunnel may go unchecked (gateways check theirs every second) before the sweep closes it: the
gateway that carried it is gone."""
_TICKET = re.compile(r"bctt_(tn_[0-9a-f]{20})\.([A-Za-z0-9_-]{43})")
_HOST = re.compile(r"[A-Za-z0-9.:_-]{1,253}")  # an address, or instance:<id> (the daemon resolves it)


@attrs.frozen(kw_only=True)
class TunnelRecord:
    """One tunnel as stored: who opened it under which action on which resource, where it goes, and its life."""

    id: str
    tenant: str
    principal_id: str
    credential_id: str
    identity: Mapping[str, Any]
    """The caller's ``Identity`` fields (re-checked with IAM while the tunnel is open)."""
    node_id: str
    host: str
    port: int
    resource_type: str
    resource_id: str
    action: str
    created_at: dt.datetime
    expires_at: dt.datetime
    used_at: dt.datetime | None
    closed_at: dt.datetime | None
    close_reason: str | None
    bytes_up: int
    bytes_down: int

    def caller(self) -> Identity:
        """The identity that opened the tunnel."""
        known = self.identity
        return Identity(
            principal_id=self.principal_id,
            principal_name=str(known.get("principal_name", "")),
            kind=str(known.get("kind", "")),
            tenant_id=str(known.get("tenant_id", "")),
            is_root=bool(known.get("is_root", False)),
            credential_id=self.credential_id,
        )

    def resource(self) -> ResourceRef:
        """What the tunnel's action was allowed on (in the tunnel's tenant: a resource IAM's projection does not
        know is decided on that tenant, never on a root-scope grant alone)."""
        return ResourceRef(type=self.resource_type, id=self.resource_id, tenant=self.tenant)


@attrs.frozen(kw_only=True)
class TunnelTicket:
    """A tunnel just opened: its id, the one-time ticket (shown once) and until when a gateway takes it."""

    tunnel_id: str
    ticket: str
    expires_at: dt.datetime


@attrs.frozen(kw_only=True)
class TunnelGrant:
    """What a gateway needs to carry a tunnel: where it goes and whose it is."""

    id: str
    tenant: str
    node_id: str
    host: str
    port: int
    resource_type: str
    resource_id: str


TunnelCheck = Callable[[Store, TunnelRecord, dt.datetime], Awaitable[str | None]]
"""A module's check of its open tunnels, by resource type (``tunnel_checks``): ``(store, tunnel, now)`` -> the reason
to close it (``instance_stopped``), or ``None`` to keep it. Called about once a second per open tunnel: it should
be one indexed read."""


class Tunnels(Protocol):
    """The ``tunnels`` table. Every change is one statement guarded by the state it leaves."""

    async def create(self, record: TunnelRecord, *, secret_hash: bytes) -> None:
        """Insert a new tunnel (in a transaction)."""
        ...

    async def spend(self, tunnel_id: str, *, secret_hash: bytes, now: dt.datetime) -> TunnelRecord | None:
        """Mark the ticket used, once: the tunnel, or ``None`` when the id or hash does not match, or it was used,
        closed or expired already."""
        ...

    async def get(self, tunnel_id: str) -> TunnelRecord | None:
        """A tunnel by id, or ``None``."""
        ...

    async def checked(self, ids: Sequence[str], *, now: dt.datetime) -> list[TunnelRecord]:
        """The tunnels of these ids that exist, marked as checked ``now`` by a gateway that carries them (one
        statement)."""
        ...

    async def sweep(self, *, stale_before: dt.datetime, now: dt.datetime, limit: int) -> list[TunnelRecord]:
        """Close at most ``limit`` tunnels no gateway carries any more, in one statement: tickets never used that
        expired (``ticket_expired``), and tunnels no gateway checked since ``stale_before`` (``gateway_lost``: the
        gateway that carried them is gone). The closed ones."""
        ...

    async def close(
        self, tunnel_id: str, *, reason: str, bytes_up: int, bytes_down: int, now: dt.datetime
    ) -> TunnelRecord | None:
        """Record the end of a tunnel; ``None`` when there is no such tunnel or it was closed already."""
        ...


TUNNELS: Repository[Tunnels] = Repository(module="nodes", name="tunnels")


def parse_ticket(ticket: str) -> tuple[str, str] | None:
    """A ticket's id and secret, or ``None`` when it is not a ticket."""
    found = _TICKET.fullmatch(ticket) if isinstance(ticket, str) else None
    return (found.group(1), found.group(2)) if found else None


async def open_tunnel_in(
    tx: Transaction,
    *,
    tenant: str,
    identity: Identity,
    node_id: str,
    host: str,
    port: int,
    resource: ResourceRef,
    action: str,
    now: dt.datetime | None = None,
) -> TunnelTicket:
    """Open a tunnel in ``tx``, a transaction of the calling method (whose audit row records the opening).

    Args:
        tenant: The tenant the tunnel is counted against (the resource's).
        identity: The caller, re-checked with IAM for ``action`` on ``resource`` while the tunnel is open.
        node_id: The node whose daemon connects to ``host:port``.
        host: ``127.0.0.1`` for the node's own services, or ``instance:<id>`` for an instance the node runs (its
            daemon resolves it: the instance's address, or its forwarded port with user networking).
        port: The TCP port.
        resource: What ``action`` was allowed on; its ``type`` says which module's ``tunnel_checks`` apply.
        action: The IAM action that allowed the tunnel.
        now: When it opens (the ticket is good for ``TICKET_TTL`` from then); the wall clock by default.

    Raises:
        InvalidInputError: the host, the port or the resource is malformed.
    """
    if not isinstance(host, str) or not _HOST.fullmatch(host):
        raise InvalidInputError("host: not an address", details={"path": "host"})
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidInputError("port: must be 1 to 65535", details={"path": "port"})
    if resource.id is None:
        raise InvalidInputError("a tunnel is opened to one resource", details={"path": "resource"})
    now = now or dt.datetime.now(dt.UTC)
    tunnel_id = f"tn_{secrets.token_hex(10)}"
    secret = secrets.token_urlsafe(32)
    record = TunnelRecord(
        id=tunnel_id,
        tenant=tenant,
        principal_id=identity.principal_id,
        credential_id=identity.credential_id,
        identity={
            "principal_name": identity.principal_name,
            "kind": identity.kind,
            "tenant_id": identity.tenant_id,
            "is_root": identity.is_root,
        },
        node_id=node_id,
        host=host,
        port=port,
        resource_type=resource.type,
        resource_id=resource.id,
        action=action,
        created_at=now,
        expires_at=now + TICKET_TTL,
        used_at=None,
        closed_at=None,
        close_reason=None,
        bytes_up=0,
        bytes_down=0,
    )
    await tx.repository(TUNNELS).create(record, secret_hash=hash_secret(secret))
    return TunnelTicket(
        tunnel_id=tunnel_id, ticket=f"{TICKET_PREFIX}{tunnel_id}.{secret}", expires_at=record.expires_at
    )


def closed_record(record: TunnelRecord) -> AuditRecord:
    """The audit row of a tunnel's end."""
    return AuditRecord(
        action=record.action,
        actor=record.principal_id,
        tenant=record.tenant,
        resource_type=record.resource_type,
        resource_id=record.resource_id,
        decision_id=None,
        outcome="ok",
        details={
            "event": "tunnel_closed",
            "tunnel_id": record.id,
            "node_id": record.node_id,
            "port": record.port,
            "reason": record.close_reason,
            "bytes_up": record.bytes_up,
            "bytes_down": record.bytes_down,
        },
    )


async def sweep_tunnels(store: Store, *, now: dt.datetime, limit: int = 500) -> int:
    """Close what no gateway carries any more (``Tunnels.sweep``) and audit the ends of those that had opened; how
    many were closed."""
    async with store.transaction() as tx:
        closed = await tx.repository(TUNNELS).sweep(stale_before=now - STALE_AFTER, now=now, limit=limit)
        for record in closed:
            if record.used_at is not None:
                await tx.audit(closed_record(record))
    return len(closed)
