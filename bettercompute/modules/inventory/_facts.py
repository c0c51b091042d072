"""``verify_facts``: check again, at any time, every stored fact a node signed that the control plane relies on (its
acceptance results, its inventory sections, its newest desired-state acknowledgement), as the controllers checked
them when they used them (``fact_refusal``)."""

from __future__ import annotations

import re

import attrs

from bettercompute.errors import InvalidInputError, NotFoundError
from bettercompute.modules.commands import COMMANDS, CommandRecord
from bettercompute.modules.nodes import (
    NODES,
    SignedFact,
    ack_refusal,
    command_result_message,
    fact_refusal,
    section_refusal,
)
from bettercompute.ports import Store, Transaction

__all__ = ["FactVerdict", "result_refusal", "verify_facts"]

_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


@attrs.frozen(kw_only=True)
class FactVerdict:
    """One fact and what checking it found: ``verdict`` is ``ok`` or why it is refused (``unsigned``,
    ``unknown_signer``, ``revoked_signer``, ``bad_signature``). ``fact`` is ``command_result`` (``id``: the command),
    ``inventory_section`` (``id``: the section) or ``desired_ack`` (``id``: the generation)."""

    node_id: str
    fact: str
    id: str
    verdict: str
    signer_serial: str | None


async def result_refusal(reader: Store | Transaction, node_id: str, command: CommandRecord) -> str | None:
    """Why the result of ``command`` (succeeded or failed) is refused for node ``node_id`` (``fact_refusal``);
    ``None`` when its key signed it."""
    message = command_result_message(
        command_id=command.id,
        kind=command.kind,
        outcome=command.state,
        result_json=command.result_json or "",
        epoch=command.session_epoch or 0,
    )
    return await fact_refusal(reader, node_id=node_id, message=message, signed=command.signed)


async def verify_facts(store: Store, node_id: str) -> list[FactVerdict]:
    """Every fact of node ``node_id`` that the control plane relies on, checked now against the certificates and
    revocations as they are now.

    Raises:
        InvalidInputError: ``node_id`` is not an id (1 to 128 of A-Z, a-z, 0-9, ``.``, ``_`` and ``-``).
        NotFoundError: no such node.
    """
    if not _ID.fullmatch(node_id):
        raise InvalidInputError("id: must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'", details={"path": "id"})
    node = await store.repository(NODES).get(node_id)
    if node is None:
        raise NotFoundError("no such node", details={"id": node_id})
    found: list[FactVerdict] = []
    for command_id in sorted((node.acceptance.get("commands") or {}).values()):
        command = await store.repository(COMMANDS).get(str(command_id))
        if command is None or command.state not in ("succeeded", "failed"):
            continue
        why = await result_refusal(store, node.id, command)
        found.append(_verdict(node.id, "command_result", command.id, why, command.signed))
    for section in await store.repository(NODES).inventory(node.id):
        why = await section_refusal(store, section)
        found.append(_verdict(node.id, "inventory_section", section.section, why, section.signed))
    if node.observed_generation > 0:
        why = await ack_refusal(store, node)
        found.append(_verdict(node.id, "desired_ack", str(node.observed_generation), why, node.observed_signed))
    return found


def _verdict(node_id: str, fact: str, id: str, why: str | None, signed: SignedFact | None) -> FactVerdict:
    serial = signed.serial if signed is not None else None
    return FactVerdict(node_id=node_id, fact=fact, id=id, verdict=why or "ok", signer_serial=serial)
