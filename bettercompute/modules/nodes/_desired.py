"""A node's desired state: what its daemon is to apply (the GPUs allocated on it, ...), versioned by a generation.

The change is written in the caller's transaction (``set_desired_state``); gateways push it to the node's live
session when its generation is newer than what they sent, by polling (each liveness flush, so at most about a second
late, however many nodes there are) and sooner on a ``DESIRED_STATE_CHANNEL`` poke sent after the commit
(``poke_gateways``). A daemon acknowledges the generation it applied; that becomes ``observed_generation``.

The control plane signs each desired state as it writes it (``_instructions``): the daemon applies only what the
instruction key signed for it, at a generation no older than one it applied.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from bettercompute._runtime.codec import storable_json
from bettercompute.errors import InvalidInputError, NotFoundError, UnavailableError
from bettercompute.modules.nodes._instructions import Signing, desired_state_message
from bettercompute.modules.nodes._port import NODES, DesiredState, NodeRecord
from bettercompute.ports import Notifier, Transaction

__all__ = ["DESIRED_STATE_CHANNEL", "MAX_DESIRED_STATE_BYTES", "poke_gateways", "set_desired_state"]

log = logging.getLogger("bettercompute.nodes")

DESIRED_STATE_CHANNEL = "desired"
"""The notifier channel gateways listen on for desired-state changes (the payload is ignored)."""
MAX_DESIRED_STATE_BYTES = 256 * 1024
"""The largest desired state, as compact JSON (it travels in one frame, below the gateway's message limit)."""


async def set_desired_state(
    tx: Transaction, node: NodeRecord, content: Mapping[str, Any], *, signer: Signing | None
) -> DesiredState:
    """Give ``node`` (read with ``get_for_update`` in ``tx``) a new desired state in ``tx`` at its next generation,
    signed by ``signer`` (``prepared_signer``, loaded before ``tx``; ``None`` only where node identity is off).

    Raises:
        InvalidInputError: ``content`` is not a JSON object, holds text PostgreSQL cannot store (a NUL, an unpaired
            surrogate), or is larger than ``MAX_DESIRED_STATE_BYTES``.
        NotFoundError: no such node, or it is retired.
        UnavailableError: the node's generation moved since it was read (it was not read for update); retryable.
    """
    try:
        text = json.dumps(dict(content), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise InvalidInputError("desired state: a JSON object", details={"path": "content"}) from None
    value = json.loads(text)
    if len(text.encode()) > MAX_DESIRED_STATE_BYTES:
        raise InvalidInputError(
            f"desired state: at most {MAX_DESIRED_STATE_BYTES} bytes as JSON", details={"path": "content"}
        )
    if not storable_json(value):
        raise InvalidInputError(
            "desired state: holds a NUL character or an unpaired surrogate",
            details={"path": "content", "reason": "unstorable"},
        )
    generation = node.desired_generation + 1
    message = desired_state_message(node_id=node.id, generation=generation, content_json=text)
    desired = DesiredState(
        node_id=node.id,
        generation=generation,
        content=value,
        text=text,
        instruction=signer.sign(message) if signer is not None else None,
    )
    if not await tx.repository(NODES).set_desired(desired):
        if node.state == "retired":
            raise NotFoundError("no such live node", details={"node_id": node.id})
        raise UnavailableError(
            "the node's desired state changed meanwhile; retry", details={"node_id": node.id, "reason": "moved"}
        )
    return desired


async def poke_gateways(notifier: Notifier | None) -> None:
    """Wake the gateways to push desired states now (after the transaction that changed them committed); a lost
    poke costs at most one liveness flush interval."""
    if notifier is None:
        return
    try:
        await notifier.notify(DESIRED_STATE_CHANNEL)
    except Exception as exc:  # the gateways poll anyway
        log.info("desired-state poke not sent: %s", type(exc).__name__)
