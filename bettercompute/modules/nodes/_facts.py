"""Facts a node signs, checked where the control plane uses them (``refusal``), not only where a gateway received
them: a gateway relays a node's fact with the signature, the serial of the certificate it was made under and that
certificate's public key, and the store keeps the three beside the fact, so that anyone can check it again later.

A fact is refused when it carries no signature, when its certificate is not one this control plane issued to that
node for that key, when the certificate is revoked, or when the signature does not verify over the fact's canonical
encoding (``bettercompute_proto``'s ``*_message`` functions, shared with the daemon that signs).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from cryptography.hazmat.primitives import serialization

from bettercompute.errors import ComputeError
from bettercompute.modules.nodes._port import CERTIFICATES, InventoryRecord, NodeRecord, SignedFact
from bettercompute.modules.nodes._proofs import verify_signature
from bettercompute.ports import AuditRecord, Store, Transaction

__all__ = [
    "FACT_REFUSED_ACTION",
    "SignedFact",
    "command_result_message",
    "desired_ack_message",
    "fact_refusal",
    "inventory_section_message",
]

FACT_REFUSED_ACTION = "compute:nodes:fact_refused"
"""The audit action of a fact refused where it was used (``details``: which fact, why, and its signer's serial)."""

_COMMAND_RESULT = b"bettercompute/v1/command-result\x00"
_INVENTORY_SECTION = b"bettercompute/v1/inventory-section\x00"
_DESIRED_ACK = b"bettercompute/v1/desired-ack\x00"


def command_result_message(*, command_id: str, kind: str, outcome: str, result_json: str, epoch: int) -> bytes:
    """The bytes a node key signs for a command's result: a context, each field length-prefixed (so no two results
    share a message), the result as its SHA-256, and the session epoch it was received in.

    The daemon makes the same bytes with ``bettercompute_proto.command_result_message`` (the core imports no wire
    code, so it is written twice; ``tests/unit/nodes/test_facts.py`` holds the two to the same bytes).
    """
    parts = [command_id.encode(), kind.encode(), outcome.encode(), hashlib.sha256(result_json.encode()).digest()]
    framed = b"".join(struct.pack(">I", len(part)) + part for part in parts)
    return _COMMAND_RESULT + framed + struct.pack(">q", epoch)


def inventory_section_message(*, section: str, content_json: str, fake: bool, epoch: int) -> bytes:
    """The bytes a node key signs for an inventory section: a context, the section's name length-prefixed, the
    content as its SHA-256, the fake flag and the session epoch it was sent in (the daemon's side:
    ``bettercompute_proto.inventory_section_message``)."""
    name = section.encode()
    digest = hashlib.sha256(content_json.encode()).digest()
    return _INVENTORY_SECTION + struct.pack(">I", len(name)) + name + digest + bytes([fake]) + struct.pack(">q", epoch)


def desired_ack_message(*, generation: int, epoch: int) -> bytes:
    """The bytes a node key signs to say it applied desired-state ``generation``: a context, the generation and the
    session epoch it was sent in (the daemon's side: ``bettercompute_proto.desired_ack_message``)."""
    return _DESIRED_ACK + struct.pack(">qq", generation, epoch)


async def fact_refusal(
    reader: Store | Transaction, *, node_id: str, message: bytes, signed: SignedFact | None
) -> str | None:
    """Why the fact (``message``, its canonical encoding) is refused for node ``node_id``; ``None`` when the node's
    key signed it: ``unsigned``, ``unknown_signer`` (no certificate of that serial, for that node and key),
    ``revoked_signer`` or ``bad_signature``."""
    if signed is None or not signed.signature:
        return "unsigned"
    certificates = reader.repository(CERTIFICATES)
    issued = await certificates.get(signed.serial)
    digest = hashlib.sha256(signed.key).hexdigest()
    if issued is None or issued.node_id != node_id or issued.key_sha256 != digest:
        return "unknown_signer"
    if await certificates.is_revoked(signed.serial):
        return "revoked_signer"
    try:
        key = serialization.load_der_public_key(signed.key)
        verify_signature(key, signed.signature, message)
    except (ValueError, ComputeError):
        return "bad_signature"
    return None


async def audit_refusal(
    tx: Transaction, *, node_id: str, tenant: str, fact: str, reason: str, signed: SignedFact | None, **details: Any
) -> None:
    """Audit, in ``tx``, that a ``fact`` of node ``node_id`` was refused for ``reason`` (with ``details``)."""
    await tx.audit(
        AuditRecord(
            action=FACT_REFUSED_ACTION,
            actor=f"node:{node_id}",
            tenant=tenant,
            resource_type="node",
            resource_id=node_id,
            decision_id=None,
            outcome="denied",
            details={
                "fact": fact,
                "reason": reason,
                "signer_serial": signed.serial if signed is not None else None,
                **details,
            },
        )
    )


async def section_refusal(reader: Store | Transaction, section: InventoryRecord) -> str | None:
    """Why the inventory section is refused (``fact_refusal``); ``None`` when its node's key signed it."""
    message = inventory_section_message(
        section=section.section, content_json=section.content_json or "", fake=section.fake, epoch=section.epoch or 0
    )
    return await fact_refusal(reader, node_id=section.node_id, message=message, signed=section.signed)


async def ack_refusal(reader: Store | Transaction, node: NodeRecord) -> str | None:
    """Why the node's newest acknowledgement (of ``observed_generation``) is refused (``fact_refusal``); ``None``
    when its key signed it."""
    message = desired_ack_message(generation=node.observed_generation, epoch=node.observed_epoch or 0)
    return await fact_refusal(reader, node_id=node.id, message=message, signed=node.observed_signed)
