"""What is signed on the wire, written once for both sides: what a daemon signs (the control plane verifies) and the
instructions the control plane signs (the daemon verifies)."""

from __future__ import annotations

import hashlib
import struct

__all__ = [
    "command_message",
    "command_result_message",
    "desired_ack_message",
    "desired_state_message",
    "inventory_section_message",
]

_COMMAND_RESULT = b"bettercompute/v1/command-result\x00"
_INVENTORY_SECTION = b"bettercompute/v1/inventory-section\x00"
_DESIRED_ACK = b"bettercompute/v1/desired-ack\x00"
_DESIRED_STATE = b"bettercompute/v1/desired-state\x00"
_COMMAND = b"bettercompute/v1/command\x00"


def command_result_message(*, command_id: str, kind: str, outcome: str, result_json: str, epoch: int) -> bytes:
    """The bytes a node key signs for a command's result: a context, then each field length-prefixed (so no two
    results share a message), the result as its SHA-256, and the session epoch it was received in."""
    parts = [command_id.encode(), kind.encode(), outcome.encode(), hashlib.sha256(result_json.encode()).digest()]
    framed = b"".join(struct.pack(">I", len(part)) + part for part in parts)
    return _COMMAND_RESULT + framed + struct.pack(">q", epoch)


def inventory_section_message(*, section: str, content_json: str, fake: bool, epoch: int) -> bytes:
    """The bytes a node key signs for an inventory section: a context, the section's name length-prefixed, the
    content as its SHA-256, the fake flag and the session epoch it was sent in."""
    name = section.encode()
    digest = hashlib.sha256(content_json.encode()).digest()
    return _INVENTORY_SECTION + struct.pack(">I", len(name)) + name + digest + bytes([fake]) + struct.pack(">q", epoch)


def desired_ack_message(*, generation: int, epoch: int) -> bytes:
    """The bytes a node key signs to say it applied desired-state ``generation``: a context, the generation and the
    session epoch it was sent in."""
    return _DESIRED_ACK + struct.pack(">qq", generation, epoch)


def _framed(*parts: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(part)) + part for part in parts)


def desired_state_message(*, node_id: str, generation: int, content_json: str) -> bytes:
    """The bytes the control plane's instruction key signs for a desired state: a context, the node id
    length-prefixed, the generation and the content as its SHA-256 (so a state for one node never applies on
    another, and an older one is known by its generation)."""
    digest = hashlib.sha256(content_json.encode()).digest()
    return _DESIRED_STATE + _framed(node_id.encode()) + struct.pack(">q", generation) + digest


def command_message(*, command_id: str, node_id: str, kind: str, arguments_json: str, deadline_ms: int) -> bytes:
    """The bytes the control plane's instruction key signs for a command: a context, the command id, the node id
    and the kind length-prefixed, the arguments as their SHA-256, and the deadline (so a replay after it is
    refused)."""
    digest = hashlib.sha256(arguments_json.encode()).digest()
    parts = _framed(command_id.encode(), node_id.encode(), kind.encode(), digest)
    return _COMMAND + parts + struct.pack(">q", deadline_ms)
