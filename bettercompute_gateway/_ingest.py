"""What daemons report on their sessions, written to the control plane: command results (once the node's signature
over them verifies), inventory sections, events, and desired-state acknowledgements (gathered, one statement for
many)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import bettercompute_proto as wire
from bettercompute.errors import ComputeError
from bettercompute.modules.commands import EDGE, SignedAck
from bettercompute.modules.nodes import INVENTORY_SECTIONS, SignedFact, verify_signature
from bettercompute.ports import Store

from ._sessions import Session
from ._wire import json_object, json_value

__all__ = ["ACK_GATHER_SECONDS", "Ingest"]

log = logging.getLogger("bettercompute.gateway")

ACK_GATHER_SECONDS = 0.02
"""How long the acknowledgement writer gathers acks after the first before writing them (``Ingest.run``)."""
_EVENTS_PER_MINUTE = 60
_EVENT_TYPE = re.compile(r"[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*")


class Ingest:
    """Takes the reports of every session into the ``store``."""

    def __init__(self, store: Store) -> None:
        self._edge = store.repository(EDGE)
        self._acks: dict[str, SignedAck] = {}  # the newest acknowledgement of each node since the last write
        self._wake = asyncio.Event()  # set when an acknowledgement arrives

    def ack(self, session: Session, ack: wire.DesiredStateAck) -> None:
        """Note that the daemon applied a desired-state generation; only one sent on this session counts, signed
        by the session's key for this session (the control plane checks the signature again before it relies on
        it)."""
        generation = ack.observed_generation
        if not 0 < generation <= (session.sent_generation or 0) or ack.epoch != session.epoch:
            return
        held = self._acks.get(session.node_id)
        if held is not None and held.generation >= generation:
            return
        try:
            verify_signature(
                session.public_key, ack.signature, wire.desired_ack_message(generation=generation, epoch=ack.epoch)
            )
        except ComputeError:
            log.warning(
                "node %s: dropped an acknowledgement of generation %d without its signature",
                session.node_id,
                generation,
            )
            return
        signed = SignedFact(signature=ack.signature, serial=session.serial, key=session.public_key_der)
        self._acks[session.node_id] = SignedAck(
            node_id=session.node_id, generation=generation, epoch=ack.epoch, signed=signed
        )
        self._wake.set()

    async def run(self) -> None:
        """Write acknowledgements as they arrive rather than with the next liveness flush, so what waits on one (a
        reservation binding) hears of it in milliseconds instead of up to ``liveness_flush_interval``. The acks of
        one change (a desired state sent to many nodes) arrive together: they are gathered for
        ``ACK_GATHER_SECONDS`` and written in one statement. A write that fails leaves them to the flush loop."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(ACK_GATHER_SECONDS)
            try:
                await self.write_acks()
            except Exception as exc:
                log.debug("acknowledgements not written now (%s); the flush loop tries again", type(exc).__name__)

    async def write_acks(self) -> None:
        """The desired-state generations acknowledged since the last write, in one transaction (none: nothing)."""
        acks, self._acks = self._acks, {}
        if acks:
            try:
                # What waits on an acknowledgement (a reservation binding) hears of it in the same transaction.
                await self._edge.observe(list(acks.values()))
            except BaseException:
                for node_id, ack in acks.items():
                    held = self._acks.get(node_id)
                    if held is None or held.generation < ack.generation:
                        self._acks[node_id] = ack
                raise

    async def inventory(self, session: Session, section: wire.InventorySection) -> None:
        """Keep a reported inventory section as the node signed it, and publish ``node.inventory_reported``; an
        unknown section, one not signed by the session's key for this session, or content that is not JSON
        PostgreSQL can store, is dropped and logged (the session goes on). The control plane checks the signature
        again before it uses the section."""
        if section.section not in INVENTORY_SECTIONS:
            log.warning("node %s: dropped an inventory section of an unknown name", session.node_id)
            return
        if section.epoch != session.epoch:
            log.warning(
                "node %s: dropped inventory section %s signed for another session", session.node_id, section.section
            )
            return
        message = wire.inventory_section_message(
            section=section.section, content_json=section.content_json, fake=section.fake, epoch=section.epoch
        )
        try:
            verify_signature(session.public_key, section.signature, message)
            json_value(section.content_json, "content_json")
            await self._edge.record_inventory(
                session.node_id,
                section.section,
                section.content_json,
                fake=section.fake,
                epoch=section.epoch,
                signed=SignedFact(signature=section.signature, serial=session.serial, key=session.public_key_der),
            )
        except ComputeError as exc:
            log.warning("node %s: inventory section %s not kept: %s", session.node_id, section.section, exc.code)

    async def event(self, session: Session, event: wire.NodeEvent) -> None:
        """Publish what the daemon reports (``node.reported``, with its type and payload); at most
        ``_EVENTS_PER_MINUTE`` a minute per session, and a malformed one is dropped and logged."""
        now = time.monotonic()
        if now - session.events_since > 60:
            session.events_since, session.events = now, 0
        session.events += 1
        if session.events > _EVENTS_PER_MINUTE:
            if session.events == _EVENTS_PER_MINUTE + 1:
                log.warning("node %s: more than %d events a minute; dropping", session.node_id, _EVENTS_PER_MINUTE)
            return
        if len(event.type) > 128 or not _EVENT_TYPE.fullmatch(event.type):
            log.warning("node %s: dropped an event with a malformed type", session.node_id)
            return
        try:
            body = json_object(event.payload_json or "{}", "payload_json")
            await self._edge.report_event(session.node_id, type=event.type, payload=body, at_ms=event.at_ms)
        except ComputeError as exc:
            log.warning("node %s: event %s not published: %s", session.node_id, event.type, exc.code)

    async def result(self, session: Session, result: wire.CommandResult) -> None:
        """Record a command's result, once its node's signature over it verifies; refuse (and log) it otherwise."""
        why, body = _checked(session, result)
        if why is not None:
            log.warning("node %s: refused a result for command %s: %s", session.node_id, result.command_id[:64], why)
            return
        reason = body.get("reason") if result.outcome == "failed" else None
        try:
            # Whoever asked for the command hears of it at once: its wake item is enqueued with the result.
            finished = await self._edge.finish(
                id=result.command_id,
                epoch=session.epoch,
                state=result.outcome,
                result_json=result.result_json,
                reason=reason if isinstance(reason, str) else None,
                signed=SignedFact(signature=result.signature, serial=session.serial, key=session.public_key_der),
            )
        except ComputeError as exc:  # text the database cannot hold (a NUL), or the database away: not recorded
            log.warning(
                "node %s: result for command %s not recorded: %s", session.node_id, result.command_id[:64], exc.code
            )
            return
        del session.commands[result.command_id]
        if finished is None:
            log.info("node %s: command %s was no longer waiting for a result", session.node_id, result.command_id)


def _checked(session: Session, result: wire.CommandResult) -> tuple[str | None, dict[str, Any]]:
    """Why a result is refused (``None``: it is not), and its body once it is taken."""
    kind = session.commands.get(result.command_id)
    if kind is None or kind != result.kind:
        return "not a command dispatched on this session", {}
    if result.epoch != session.epoch:
        return "signed for another session", {}
    if result.outcome not in ("succeeded", "failed"):
        return "an outcome other than succeeded or failed", {}
    message = wire.command_result_message(
        command_id=result.command_id,
        kind=result.kind,
        outcome=result.outcome,
        result_json=result.result_json,
        epoch=result.epoch,
    )
    try:
        verify_signature(session.public_key, result.signature, message)
        return None, json_object(result.result_json, "result_json")
    except ComputeError as exc:
        return ("a bad signature" if exc.details.get("reason") == "bad_signature" else "a malformed result"), {}
