"""The ``audit`` group's logic and the ``audit-chain`` job.

Every audit row is linked, shortly after its transaction commits, into the hash chain of its tenant (rows of no
tenant form the chain ``""``): link ``n`` holds SHA-256 over link ``n - 1``'s hash and the row's canonical encoding
(``link_hash``). Rows are linked in the order their transactions began writing, and only once every transaction that
could still add a row before them has ended, so a chain never needs a row put in between two links. The table and the
links are append-only (a trigger refuses UPDATE, DELETE and TRUNCATE); a row removed or altered behind the
database's back (a superuser disabling the trigger) no longer matches its link, which ``audit.verify`` reports.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import Job, job_transaction
from bettercompute._runtime.registry import CallContext, method
from bettercompute.errors import InvalidInputError, NotFoundError
from bettercompute.modules.audit._port import AUDIT_LOG, AuditFilter, AuditRow, ChainLink
from bettercompute.modules.audit._schemas import (
    AuditEntry,
    ChainHead,
    ChainProblem,
    GetAuditInput,
    ListAuditInput,
    ListAuditOutput,
    VerifyAuditInput,
    VerifyAuditOutput,
)
from bettercompute.paging import Keyset
from bettercompute.ports import ResourceRef

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = [
    "AUDIT",
    "AUDIT_CHAIN",
    "GENESIS",
    "LINK_BATCH",
    "entry_view",
    "get_audit",
    "link_audit",
    "link_hash",
    "list_audit",
    "verify_audit",
]

AUDIT = "audit"
"""The resource type IAM decides audit reads on (its tenant: the rows'; none: every row, root only)."""
GENESIS = bytes(32)
"""The hash before a chain's first link."""
LINK_BATCH = 500
"""Rows linked per transaction of the job; a pass goes on while batches come back full (at most 20)."""
_BATCHES_PER_PASS = 20
_WALK_BATCH = 1000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _micros(at: dt.datetime) -> int:
    return (at - _EPOCH) // dt.timedelta(microseconds=1)


def link_hash(previous: bytes, row: AuditRow) -> bytes:
    """A link's hash: SHA-256 over a version tag, the previous link's hash and the row's facts as canonical JSON (an
    array; ``at`` in microseconds since the epoch; object keys sorted; ASCII only)."""
    facts = [
        row.id,
        _micros(row.at),
        row.action,
        row.actor,
        row.tenant,
        row.resource_type,
        row.resource_id,
        row.decision_id,
        row.outcome,
        dict(row.details),
    ]
    body = json.dumps(facts, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(b"bettercompute.audit/v1\x00" + previous + body.encode()).digest()


def _chain_of(row: AuditRow) -> str:
    return row.tenant or ""


async def link_audit(context: ModuleContext) -> int:
    """One pass of the ``audit-chain`` job: link the rows written since the last pass; returns how many."""
    linked = 0
    for _ in range(_BATCHES_PER_PASS):
        async with job_transaction(context) as tx:
            log = tx.repository(AUDIT_LOG)
            rows = await log.linkable(after=await log.linked_until(), limit=LINK_BATCH)
            if not rows:
                break
            heads = await log.heads(sorted({_chain_of(r) for r in rows}))
            links = []
            for row in rows:
                chain = _chain_of(row)
                seq, previous = heads.get(chain, (0, GENESIS))
                link = ChainLink(
                    chain=chain, seq=seq + 1, audit_id=row.id, hash=link_hash(previous, row), position=row.position
                )
                heads[chain] = (link.seq, link.hash)
                links.append(link)
            await log.link(links)
        linked += len(rows)
        if len(rows) < LINK_BATCH:
            break
    return linked


AUDIT_CHAIN = Job(name="audit-chain", role="controllers", interval=dt.timedelta(seconds=5), run=link_audit)
"""The ``audit-chain`` job: a singleton of the ``controllers`` role (lease ``controllers/audit-chain``)."""


def entry_view(row: AuditRow) -> AuditEntry:
    """The ``AuditEntry`` shown for a stored row."""
    return AuditEntry(
        id=row.id,
        at=row.at,
        action=row.action,
        actor=row.actor,
        tenant=row.tenant,
        resource_type=row.resource_type,
        resource_id=row.resource_id,
        decision_id=row.decision_id,
        outcome=row.outcome,
        details=dict(row.details),
        chain_seq=row.chain_seq,
        hash=row.hash.hex() if row.hash is not None else None,
    )


def _rows_of(input: Any) -> ResourceRef:
    return ResourceRef(type=AUDIT, tenant=input.tenant)


_PAGES: Keyset[AuditEntry] = Keyset(int, key=lambda e: (e.id,))


@method(mutates=False, access="manage", resource=_rows_of)
async def list_audit(call: CallContext, input: ListAuditInput) -> ListAuditOutput:
    """A page of audit rows, oldest first: a tenant's (its admins and operators), or every row (root scope).

    Raises:
        InvalidInputError: ``since`` is not before ``until``, or the cursor is not one this list returned.
    """
    if input.since is not None and input.until is not None and input.since >= input.until:
        raise InvalidInputError(
            "since: must be before until", details={"path": "since", "reason": "must be before until"}
        )
    scope = call.method.action
    after = _PAGES.after(scope, input.cursor)
    where = AuditFilter(
        tenant=input.tenant,
        actor=input.actor,
        action=input.action,
        resource_type=input.resource_type,
        resource_id=input.resource_id,
        since=input.since,
        until=input.until,
    )
    after_id = after[0] if after is not None else None
    assert after_id is None or isinstance(after_id, int)  # the keyset's one part is an int
    rows = await call.context.store.repository(AUDIT_LOG).rows(where, after=after_id, limit=input.limit + 1)
    entries, next_cursor = _PAGES.page(scope, [entry_view(r) for r in rows], input.limit)
    return ListAuditOutput(entries=entries, next_cursor=next_cursor)


@method(mutates=False, access="manage", resource=_rows_of)
async def get_audit(call: CallContext, input: GetAuditInput) -> AuditEntry:
    """An audit row by id.

    Raises:
        NotFoundError: there is no such row (in ``tenant``, when it is set).
    """
    row = await call.context.store.repository(AUDIT_LOG).get(input.id)
    if row is None or (input.tenant is not None and row.tenant != input.tenant):
        # Another tenant's row is not told apart from none at all.
        raise NotFoundError("no such audit row", details={"id": input.id})
    return entry_view(row)


@method(mutates=False, access="manage", resource=_rows_of)
async def verify_audit(call: CallContext, input: VerifyAuditInput) -> VerifyAuditOutput:
    """Walk a tenant's hash chain (or every chain, root scope) and report each link whose row is gone or differs, and
    each gap; the newest hash of each chain, to keep elsewhere and compare with a later walk.

    Reads the whole chain: its time grows with the rows (about a second per 100,000 here).
    """
    log = call.context.store.repository(AUDIT_LOG)
    chains = [input.tenant] if input.tenant is not None else await log.chains()
    problems: list[ChainProblem] = []
    heads: dict[str, ChainHead] = {}
    rows = 0
    for chain in chains:
        seq, previous = 0, GENESIS
        while True:
            links = await log.walk(chain, after_seq=seq, limit=_WALK_BATCH)
            for link in links:
                reason = None
                if link.seq != seq + 1:
                    reason = "gap"  # the missing link's hash is unknown: this one's cannot be checked
                elif link.row is None:
                    reason = "missing_row"
                elif link_hash(previous, link.row) != link.hash:
                    reason = "altered"
                if reason is not None:
                    problems.append(ChainProblem(chain=chain, seq=link.seq, audit_id=link.audit_id, reason=reason))
                seq, previous = link.seq, link.hash
                rows += 1
            if len(links) < _WALK_BATCH:
                break
        if seq:
            heads[chain] = ChainHead(seq=seq, hash=previous.hex())
    unlinked = await log.unlinked(after=await log.linked_until())
    return VerifyAuditOutput(
        ok=not problems,
        chains=len(heads),
        rows=rows,
        unlinked=unlinked,
        heads=heads,
        problems=tuple(problems),
    )
