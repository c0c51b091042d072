"""``verify_facts``: check again, at any time, every stored fact a node signed that the control plane relies on (its
acceptance results, its inventory sections, its newest desired-state acknowledgement), as the controllers checked
them when they used them (``fact_refusal``)."""

from __future__ import annotations

import attrs

from bettercompute.errors import NotFoundError
from bettercompute.modules.commands import COMMANDS
from bettercompute.modules.nodes import (
    NODES,
    command_result_message,
    desired_ack_message,
    fact_refusal,
    inventory_section_message,
)
from bettercompute.ports import Store

__all__ = ["FactVerdict", "verify_facts"]


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


async def verify_facts(store: Store, node_id: str) -> list[FactVerdict]:
    """Every fact of node ``node_id`` that the control plane relies on, checked now against the certificates and
    revocations as they are now.

    Raises:
        NotFoundError: no such node.
    """
    node = await store.repository(NODES).get(node_id)
    if node is None:
        raise NotFoundError("no such node", details={"id": node_id})
    found: list[FactVerdict] = []
    for command_id in sorted((node.acceptance.get("commands") or {}).values()):
        command = await store.repository(COMMANDS).get(str(command_id))
        if command is None or command.state not in ("succeeded", "failed"):
            continue
        message = command_result_message(
            command_id=command.id,
            kind=command.kind,
            outcome=command.state,
            result_json=command.result_json or "",
            epoch=command.session_epoch or 0,
        )
        why = await fact_refusal(store, node_id=node.id, message=message, signed=command.signed)
        serial = command.signed.serial if command.signed is not None else None
        found.append(
            FactVerdict(
                node_id=node.id, fact="command_result", id=command.id, verdict=why or "ok", signer_serial=serial
            )
        )
    for section in await store.repository(NODES).inventory(node.id):
        message = inventory_section_message(
            section=section.section,
            content_json=section.content_json or "",
            fake=section.fake,
            epoch=section.epoch or 0,
        )
        why = await fact_refusal(store, node_id=node.id, message=message, signed=section.signed)
        serial = section.signed.serial if section.signed is not None else None
        found.append(
            FactVerdict(
                node_id=node.id, fact="inventory_section", id=section.section, verdict=why or "ok", signer_serial=serial
            )
        )
    if node.observed_generation > 0:
        message = desired_ack_message(generation=node.observed_generation, epoch=node.observed_epoch or 0)
        why = await fact_refusal(store, node_id=node.id, message=message, signed=node.observed_signed)
        serial = node.observed_signed.serial if node.observed_signed is not None else None
        found.append(
            FactVerdict(
                node_id=node.id,
                fact="desired_ack",
                id=str(node.observed_generation),
                verdict=why or "ok",
                signer_serial=serial,
            )
        )
    return found
