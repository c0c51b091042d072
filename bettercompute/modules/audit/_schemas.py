"""Inputs and outputs of the ``audit`` group.

A tenant's admins and operators read the tenant's rows (``tenant`` set); a root-scope principal reads every row,
including those of no tenant (``tenant`` null). Filters combine with AND.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from bettercompute.fields import Integer, Text
from bettercompute.paging import PageInput

__all__ = [
    "AuditEntry",
    "ChainHead",
    "ChainProblem",
    "GetAuditInput",
    "ListAuditInput",
    "ListAuditOutput",
    "VerifyAuditInput",
    "VerifyAuditOutput",
]

_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_ACTION = Text(
    pattern=r"[a-z][a-z0-9_-]{0,63}:[a-z][a-z0-9_-]{0,63}:[a-z][a-z0-9_-]{0,63}",
    reason="must be an action like 'compute:nodes:join'",
)
# Principals, resource ids: printable ASCII without spaces, as they are recorded.
_WORD = Text(pattern=r"[\x21-\x7e]{1,256}", reason="must be 1 to 256 printable ASCII characters, no space")
_TYPE = Text(pattern=r"[a-z][a-z0-9_-]{0,63}", reason="must be a resource type like 'reservation'")
_ROW = Integer(minimum=1, maximum=2**63 - 1, reason="must be an audit row id (a positive integer)")


@attrs.frozen(kw_only=True)
class AuditEntry:
    """One audit row: who (``actor``) did what (``action``) to which resource, under which IAM decision, with what
    outcome. ``chain_seq`` and ``hash`` (hex SHA-256) are its link in its tenant's hash chain, null until the
    ``audit-chain`` job has linked it (seconds after it was written)."""

    id: int
    at: dt.datetime
    action: str
    actor: str
    tenant: str | None
    resource_type: str
    resource_id: str | None
    decision_id: str | None
    outcome: str
    details: dict[str, Any]
    chain_seq: int | None
    hash: str | None


@attrs.frozen(kw_only=True)
class ListAuditInput(PageInput):
    """Audit rows, oldest first: of ``tenant`` (null: every row, for a root-scope principal only), narrowed by any of
    the filters. ``since`` is inclusive, ``until`` exclusive."""

    tenant: str | None = attrs.field(default=None, validator=_ID)
    actor: str | None = attrs.field(default=None, validator=_WORD)
    action: str | None = attrs.field(default=None, validator=_ACTION)
    resource_type: str | None = attrs.field(default=None, validator=_TYPE)
    resource_id: str | None = attrs.field(default=None, validator=_WORD)
    since: dt.datetime | None = None
    until: dt.datetime | None = None


@attrs.frozen(kw_only=True)
class ListAuditOutput:
    """A page of audit rows, oldest first."""

    entries: tuple[AuditEntry, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class GetAuditInput:
    """An audit row by id; ``tenant`` as in ``list`` (a row of another tenant is not found)."""

    id: int = attrs.field(validator=_ROW)
    tenant: str | None = attrs.field(default=None, validator=_ID)


@attrs.frozen(kw_only=True)
class VerifyAuditInput:
    """Walk the hash chain of ``tenant`` (null: every chain, for a root-scope principal only)."""

    tenant: str | None = attrs.field(default=None, validator=_ID)


@attrs.frozen(kw_only=True)
class ChainProblem:
    """Where a chain does not hold. ``reason``: ``missing_row`` (a linked row is gone), ``altered`` (a row's facts or
    its link's hash are not what was linked), ``gap`` (a link is gone: ``seq`` is the first one after the gap).
    ``chain`` is the tenant, ``""`` for rows of no tenant."""

    chain: str
    seq: int
    audit_id: int | None
    reason: str


@attrs.frozen(kw_only=True)
class ChainHead:
    """A chain's newest link: its number (the chain's length) and its hash (hex)."""

    seq: int
    hash: str


@attrs.frozen(kw_only=True)
class VerifyAuditOutput:
    """What the walk found. ``ok`` when no problem was found; ``heads`` maps each chain walked to its newest link:
    keep them elsewhere, and a later walk whose link of the same number has another hash shows a rewritten chain.
    ``unlinked`` counts rows not linked yet (written since the job's last pass)."""

    ok: bool
    chains: int
    rows: int
    unlinked: int
    heads: dict[str, ChainHead]
    problems: tuple[ChainProblem, ...]
