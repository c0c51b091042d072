"""``Edge``: everything a gateway reads and writes in the store, and nothing more.

A gateway faces the internet, so the store gives it a narrow door: each method is one call of a function the store
owns (in PostgreSQL, a ``SECURITY DEFINER`` function the gateway's database role may execute, while it holds no grant
on any table). Each function writes what a gateway is allowed to say and the events and work that follow from it,
with their types fixed by the store, not by the caller: a session opened or closed, sessions seen alive,
desired-state acknowledgements, an inventory section, a daemon's event, a command's result. It reads only what a
gateway needs to relay: pending commands for its sessions, desired states, revoked certificate serials.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.modules.commands._port import CommandRecord
from bettercompute.modules.nodes import DesiredState, SignedFact
from bettercompute.ports import Repository

__all__ = ["EDGE", "Edge", "SignedAck"]


@attrs.frozen(kw_only=True)
class SignedAck:
    """A daemon's word that it applied desired-state ``generation``, signed in session ``epoch``."""

    node_id: str
    generation: int
    epoch: int
    signed: SignedFact


class Edge(Protocol):
    """The gateway's door into the store; every call is its own transaction, and its pokes (work enqueued, events
    published) follow the commit."""

    async def open_session(self, *, node_id: str, gateway: str) -> int:
        """Open the node's next session on ``gateway``, publish ``node.session_opened`` and enqueue the node's
        lifecycle item; the new epoch.

        Raises:
            NotFoundError: no such live node.
        """
        ...

    async def close_session(self, *, node_id: str, epoch: int, gateway: str, reason: str) -> bool:
        """End session ``epoch`` of the node; publish ``node.session_closed`` (with ``reason``) when it was still
        current or when ``reason`` is ``superseded``, and enqueue the lifecycle item when it was current. Whether
        it was current."""
        ...

    async def seen(self, alive: Sequence[tuple[str, int]], *, gateway: str) -> list[str]:
        """Mark these sessions of ``gateway`` seen now; the node ids whose session was still current."""
        ...

    async def observe(self, acks: Sequence[SignedAck]) -> list[str]:
        """Record acknowledged desired-state generations (each no newer than the node's desired one) with their
        signatures, unchecked, and enqueue the acknowledgement item of each node whose observed generation moved
        (whose controller checks the signature before anything relies on it); those node ids."""
        ...

    async def record_inventory(
        self, node_id: str, section: str, content_json: str, *, fake: bool, epoch: int, signed: SignedFact
    ) -> bool:
        """Keep one inventory section of a live node as the node signed it (unchecked: the inventory controller
        checks the signature before it uses it), publish ``node.inventory_reported`` and enqueue the node's
        inventory item; ``False`` (nothing written) for a retired or unknown node."""
        ...

    async def report_event(self, node_id: str, *, type: str, payload: Mapping[str, Any], at_ms: int) -> None:
        """Publish ``node.reported`` for a daemon's event (nothing for a retired or unknown node).

        Raises:
            InvalidInputError: the type is not dotted lower case, or the payload is not an object.
        """
        ...

    async def dispatch(self, sessions: Sequence[tuple[str, int]], *, limit: int) -> list[CommandRecord]:
        """Mark the oldest pending commands of each session's node dispatched on its epoch (dated by the
        database's clock, not the caller's), oldest first."""
        ...

    async def finish(
        self, *, id: str, epoch: int, state: str, result_json: str, reason: str | None, signed: SignedFact
    ) -> CommandRecord | None:
        """Record the outcome of a command dispatched on session ``epoch``, with the result as the node signed it
        (a JSON object's text) and its signature, and enqueue its wake item; ``None`` when it was not waiting for
        that result. Whoever uses the result checks the signature (``fact_refusal``)."""
        ...

    async def desired_newer(self, known: Sequence[tuple[str, int]], *, gateway: str) -> list[DesiredState]:
        """The nodes whose desired generation is beyond the one given for them, among those with an open session
        on ``gateway``."""
        ...

    async def desired_since(self, since: dt.datetime, *, gateway: str) -> tuple[list[DesiredState], dt.datetime]:
        """The desired states changed after ``since`` of the nodes with an open session on ``gateway``, and the
        database's time of the read."""
        ...

    async def revoked_among(self, serials: Sequence[str]) -> set[str]:
        """Which of these certificate serials are revoked."""
        ...

    async def signers(self) -> dict[str, bytes]:
        """The current certificates (DER) of the control plane's instruction-signing keys that are not retired, by
        key id: public, sent to nodes beside each signature."""
        ...


EDGE: Repository[Edge] = Repository(module="commands", name="edge")
"""The gateway's door into the store (``store.repository(EDGE)``)."""
