"""Re-wrapping the stored KMS blobs under the KMS's current key (``keys.rewrap``), after a KMS key rotation.

An operator gives every process the new key as the current one of a ``KmsRing`` whose previous key is the old one
(``kms_previous_key_file`` in the CLI's configuration), then starts a re-wrap. A ``controllers`` job walks each
sealed column the modules declare (``Module.sealed``), a batch at a time: it opens each blob (under whichever key
of the ring opens it), seals it again under the current key, and writes it back only if the row still holds the
blob it read (a secret rotated or deleted meanwhile is left to what replaced it). Every KMS call happens outside any
transaction; after each batch the progress is stored, so a pass that stops (a lease lost, a process killed, a KMS
that did not answer) is taken up by the next pass, in any process, where it left off. A blob that opens under no
key is counted and named (column and row id), and left as it was; the re-wrap goes on. A KMS that cannot be reached
fails the pass (``UnavailableError``), and the next pass tries the same batch again.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job
from bettercompute._runtime.registry import CallContext, method
from bettercompute.errors import (
    ConflictError,
    FailedPreconditionError,
    InternalError,
    InvalidConfigError,
    NotFoundError,
)
from bettercompute.modules.nodes._port import REWRAPS, RewrapRecord
from bettercompute.modules.nodes._schemas import KEY, GetRewrapInput, Rewrap, RewrapFailure, StartRewrapInput
from bettercompute.ports import Kms, Repository, ResourceRef, Sealed, SealedBlob

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = ["BATCH", "KMS_REWRAP", "PASS_LIMIT", "get_rewrap", "rewrap_pass", "start_rewrap"]

log = logging.getLogger("bettercompute.nodes")

BATCH = 100
"""Blobs read, opened and sealed again between two records of progress."""
PASS_LIMIT = 5_000
"""Blobs one pass of the job handles at most (the next pass goes on two seconds later)."""

NEEDS_KMS = "a re-wrap needs Options.kms (the KMS whose current key the blobs are sealed again under)"


def column_name(key: Repository[Sealed]) -> str:
    """How a re-wrap names a sealed column: ``module.name`` of its repository key."""
    return f"{key.module}.{key.name}"


def _root(input: Any) -> ResourceRef:
    return ResourceRef(type=KEY, tenant=None)


def _rewrap(record: RewrapRecord) -> Rewrap:
    return Rewrap(
        id=record.id,
        state=record.state,  # type: ignore[arg-type]
        columns=record.columns,
        columns_done=min(record.position, len(record.columns)),
        resealed=record.resealed,
        failed=record.failed,
        failures=tuple(RewrapFailure(column=f["column"], key=f["key"]) for f in record.failures),
        created_at=record.created_at,
        finished_at=record.finished_at,
    )


@method(mutates=True, access="manage", resource=_root)
async def start_rewrap(call: CallContext, input: StartRewrapInput) -> Rewrap:
    """Start a re-wrap of every stored KMS blob under the current key; a worker's ``controllers`` job carries it
    out (follow it with ``get_rewrap``).

    Raises:
        NotFoundError: ``columns`` names a column no module here keeps.
        FailedPreconditionError: no KMS is configured.
        ConflictError: a re-wrap is running already (its id is in the details).
    """
    if call.context.kms is None:
        raise FailedPreconditionError(NEEDS_KMS, details={"needs": ["kms"]})
    columns = [column_name(key) for key in call.context.sealed]
    unknown = sorted(set(input.columns) - set(columns))
    if unknown:
        raise NotFoundError(
            "columns: no such sealed column here", details={"path": "columns", "unknown": unknown, "allowed": columns}
        )
    if input.columns:
        columns = [c for c in columns if c in input.columns]
    by = call.identity.principal_id if call.identity is not None else None
    rewraps = call.context.store.repository(REWRAPS)
    started = await rewraps.start(id=f"kmr_{secrets.token_hex(8)}", columns=columns, created_by=by)
    if started is None:
        running = await rewraps.running()
        raise ConflictError(
            "a re-wrap is running already; follow it with keys.get_rewrap",
            details={"id": running.id if running is not None else None},
        )
    call.describe(resource_type=KEY, resource_id=started.id, details={"kind": "kms", "columns": len(columns)})
    log.info("KMS re-wrap %s started over %d columns", started.id, len(columns))
    return _rewrap(started)


@method(mutates=False, access="manage", resource=_root)
async def get_rewrap(call: CallContext, input: GetRewrapInput) -> Rewrap:
    """A re-wrap and how far it has gone.

    Raises:
        NotFoundError: no such re-wrap.
    """
    record = await call.context.store.repository(REWRAPS).get(input.id)
    if record is None:
        raise NotFoundError("no such re-wrap", details={"id": input.id})
    return _rewrap(record)


async def rewrap_pass(context: ModuleContext) -> int:
    """One pass of the running re-wrap, if any: up to ``PASS_LIMIT`` blobs, its progress stored after each batch;
    the blobs it handled."""
    kms = context.kms
    rewraps = context.store.repository(REWRAPS)
    run = await rewraps.running()
    if run is None or kms is None:
        return 0
    columns = {column_name(key): key for key in context.sealed}
    handled = 0
    while handled < PASS_LIMIT:
        if run.position >= len(run.columns):
            await rewraps.advance(
                run.id, position=run.position, after=None, resealed=0, failed=0, failures=(), done=True
            )
            log.info("KMS re-wrap %s done: %d resealed, %d failed", run.id, run.resealed, run.failed)
            break
        name = run.columns[run.position]
        key = columns.get(name)
        batch = await context.store.repository(key).sealed(after=run.after, limit=BATCH) if key is not None else []
        if key is None or not batch:  # this column is done (or no module here declares it any more): the next one
            advanced = await rewraps.advance(
                run.id, position=run.position + 1, after=None, resealed=0, failed=0, failures=(), done=False
            )
            if advanced is None:
                break
            run = advanced
            continue
        resealed, failures = await _reseal(kms, context.store.repository(key), name, batch)
        handled += len(batch)
        advanced = await rewraps.advance(
            run.id,
            position=run.position,
            after=batch[-1].key,
            resealed=resealed,
            failed=len(failures),
            failures=failures,
            done=False,
        )
        if advanced is None:  # finished elsewhere meanwhile
            break
        run = advanced
    return handled


async def _reseal(kms: Kms, column: Sealed, name: str, batch: list[SealedBlob]) -> tuple[int, list[Mapping[str, str]]]:
    """Seal each blob of ``batch`` again; how many were written, and the blobs that opened under no key."""
    resealed = 0
    failures: list[Mapping[str, str]] = []
    for blob in batch:
        try:
            plaintext = await kms.decrypt(blob.blob, context=blob.context)
        except (InternalError, InvalidConfigError):
            log.warning("KMS re-wrap: %s %s opens under no key of the KMS; left as it is", name, blob.key)
            failures.append({"column": name, "key": blob.key})
            continue
        fresh = await kms.encrypt(plaintext, context=blob.context)
        if await column.reseal(blob.key, old=blob.blob, new=fresh):
            resealed += 1
    return resealed, failures


KMS_REWRAP = Job(name="kms-rewrap", role="controllers", interval=None, run=rewrap_pass)
"""The re-wrap's worker: a pass every ``Options.poll_interval`` while one is running (nothing to do otherwise: one
indexed read)."""
