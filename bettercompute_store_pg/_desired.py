"""A node's desired state from a row, as the nodes and commands adapters both read it (the nodes table's own reads,
and the gateway's functions that return the same columns)."""

from __future__ import annotations

from typing import Any

from bettercompute.modules.nodes import DesiredState, InstructionSignature

__all__ = ["desired_state_of"]


def desired_state_of(row: Any) -> DesiredState:
    """A ``DesiredState`` from a row with ``id``, ``desired_generation``, ``desired_state``, ``desired_text``,
    ``desired_signature`` and ``desired_signer``."""
    return DesiredState(
        node_id=row.id,
        generation=row.desired_generation,
        content=dict(row.desired_state),
        text=row.desired_text,
        instruction=InstructionSignature(signature=bytes(row.desired_signature), signer=row.desired_signer)
        if row.desired_signature is not None and row.desired_signer is not None
        else None,
    )
