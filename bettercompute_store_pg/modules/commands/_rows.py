"""Records from the rows of the commands module's tables, shared by its adapters."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bettercompute.modules.commands import CommandRecord
from bettercompute.modules.nodes import InstructionSignature, SignedFact
from bettercompute.ports import WorkItem
from bettercompute_store_pg._db import utc

__all__ = ["command_of", "optional_time"]


def optional_time(value: dt.datetime | None) -> dt.datetime | None:
    """``value`` in UTC, or ``None``."""
    return utc(value) if value is not None else None


def command_of(row: Any) -> CommandRecord:
    """A command from one of its rows."""
    return CommandRecord(
        id=row.id,
        node_id=row.node_id,
        tenant=row.tenant,
        kind=row.kind,
        payload=dict(row.payload),
        state=row.state,
        on_session_loss=row.on_session_loss,
        deadline=utc(row.deadline),
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        session_epoch=row.session_epoch,
        dispatched_at=optional_time(row.dispatched_at),
        result=dict(row.result) if row.result is not None else None,
        reason=row.reason,
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
        finished_at=optional_time(row.finished_at),
        wake=WorkItem(kind=row.wake_kind, key=row.wake_key, shard=row.wake_shard) if row.wake_kind else None,
        result_json=row.result_json,
        signed=SignedFact(signature=bytes(row.signature), serial=row.signer_serial, key=bytes(row.signer_key))
        if row.signature is not None and row.signer_serial is not None and row.signer_key is not None
        else None,
        arguments_json=row.arguments_json,
        instruction=InstructionSignature(signature=bytes(row.instruction_signature), signer=row.instruction_signer)
        if row.instruction_signature is not None and row.instruction_signer is not None
        else None,
    )
