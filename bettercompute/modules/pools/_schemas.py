"""Inputs and outputs of the ``pools`` and ``join-tokens`` groups.

Field rules are attrs validators raising ``(message, attribute, value)``, which the codec reports as
``INVALID_INPUT`` at the field's path. The pool's class is ``pool_class`` on the wire (``class`` is a Python keyword).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Literal

import attrs

from ...paging import PageInput

__all__ = [
    "DEFAULT_ACCEPTANCE_CHECKS",
    "CreateJoinTokenInput",
    "CreatePoolInput",
    "CreatedJoinToken",
    "GetJoinTokenInput",
    "GetPoolInput",
    "JoinExpect",
    "JoinToken",
    "ListJoinTokensInput",
    "ListJoinTokensOutput",
    "ListPoolsInput",
    "ListPoolsOutput",
    "Pool",
    "PoolClass",
    "Reclaim",
    "RevokeJoinTokenInput",
    "UpdatePoolInput",
]

PoolClass = Literal["gpu", "vps-host", "provider"]
Reclaim = Literal["none", "same-hardware"]
TokenState = Literal["active", "expired", "revoked", "exhausted"]

DEFAULT_ACCEPTANCE_CHECKS = ("diag.nvml",)
MAX_USES = 10_000
MIN_EXPIRY = 60
MAX_EXPIRY = 30 * 24 * 3600
MAX_LABELS = 64
MAX_CHECKS = 32

_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_CHECK = re.compile(r"[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*")
# Kubernetes-style: an optional DNS-subdomain prefix and '/', then a name of alphanumerics, '-', '_', '.'.
_LABEL_KEY = re.compile(r"([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")
_CLAIM = re.compile(r"[\x21-\x7e]([\x20-\x7e]{0,126}[\x21-\x7e])?")


def _fail(attribute: attrs.Attribute[Any], value: Any, reason: str) -> ValueError:
    return ValueError(reason, attribute, value)


def _id(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not _ID.fullmatch(value):
        raise _fail(attribute, value, "must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")


def _name(_: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not _DNS_LABEL.fullmatch(value):
        raise _fail(attribute, value, "must be a DNS label: 1 to 63 of a-z, 0-9 and '-', not starting or ending in '-'")


def _checks(_: Any, attribute: attrs.Attribute[Any], value: tuple[str, ...] | None) -> None:
    if value is None:
        return
    if len(value) > MAX_CHECKS:
        raise _fail(attribute, value, f"at most {MAX_CHECKS} checks")
    for check in value:
        if len(check) > 128 or not _CHECK.fullmatch(check):
            raise _fail(attribute, value, f"{check!r} is not a check name like 'diag.nvml'")
    if len(set(value)) != len(value):
        raise _fail(attribute, value, "lists a check twice")


def _labels(_: Any, attribute: attrs.Attribute[Any], value: dict[str, str] | None) -> None:
    if value is None:
        return
    if len(value) > MAX_LABELS:
        raise _fail(attribute, value, f"at most {MAX_LABELS} labels")
    for key, item in value.items():
        if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key) or len(key) > 317:
            raise _fail(attribute, value, f"{key!r} is not a label key like 'zone' or 'example.com/rack'")
        if not isinstance(item, str) or not _LABEL_VALUE.fullmatch(item):
            raise _fail(attribute, value, f"the value of {key!r} must be at most 63 of A-Z, a-z, 0-9, '.', '_', '-'")


def _uses(_: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not 1 <= value <= MAX_USES:
        raise _fail(attribute, value, f"must be between 1 and {MAX_USES}")


def _expiry(_: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not MIN_EXPIRY <= value <= MAX_EXPIRY:
        raise _fail(attribute, value, f"must be between {MIN_EXPIRY} and {MAX_EXPIRY} seconds (30 days)")


def _claim(_: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not _CLAIM.fullmatch(value):
        raise _fail(attribute, value, "must be 1 to 128 printable ASCII characters, not starting or ending in a space")


def _gpu_count(_: Any, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not 0 <= value <= 1024):
        raise _fail(attribute, value, "must be between 0 and 1024")


# --- pools ------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreatePoolInput:
    """A pool of a tenant: its name (a DNS label, unique in the tenant), class, acceptance checks and labels."""

    tenant: str = attrs.field(validator=_id)
    name: str = attrs.field(validator=_name)
    pool_class: PoolClass = "gpu"
    acceptance_checks: tuple[str, ...] = attrs.field(default=DEFAULT_ACCEPTANCE_CHECKS, validator=_checks)
    labels: dict[str, str] = attrs.field(factory=dict, validator=_labels)


@attrs.frozen(kw_only=True)
class Pool:
    """A pool: where joined machines go, and the checks they pass to be adopted."""

    id: str
    tenant: str
    name: str
    pool_class: PoolClass
    acceptance_checks: tuple[str, ...]
    labels: dict[str, str]
    created_at: dt.datetime
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class ListPoolsInput(PageInput):
    """The tenant whose pools to list, one page at a time."""

    tenant: str = attrs.field(validator=_id)


@attrs.frozen(kw_only=True)
class ListPoolsOutput:
    """A page of the tenant's pools, oldest first; ``next_cursor`` is null on the last page."""

    pools: tuple[Pool, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class GetPoolInput:
    """A pool by id."""

    id: str = attrs.field(validator=_id)


@attrs.frozen(kw_only=True)
class UpdatePoolInput:
    """A pool's new name, acceptance checks or labels (a field left out stays as it is; labels are replaced whole).

    The class is fixed at ``create``.
    """

    id: str = attrs.field(validator=_id)
    name: str | None = attrs.field(default=None, validator=_name)
    acceptance_checks: tuple[str, ...] | None = attrs.field(default=None, validator=_checks)
    labels: dict[str, str] | None = attrs.field(default=None, validator=_labels)


# --- join tokens ------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class JoinExpect:
    """Hardware claims a joining machine must match (each one left out is not checked)."""

    serial: str | None = attrs.field(default=None, validator=_claim)
    product: str | None = attrs.field(default=None, validator=_claim)
    gpu_model: str | None = attrs.field(default=None, validator=_claim)
    gpu_count: int | None = attrs.field(default=None, validator=_gpu_count)


@attrs.frozen(kw_only=True)
class CreateJoinTokenInput:
    """A token for joining machines to a pool.

    ``reclaim``: ``same-hardware`` lets a re-imaged machine with the same hardware key take back its node id;
    ``none`` makes every join a new node.
    """

    pool_id: str = attrs.field(validator=_id)
    uses: int = attrs.field(default=1, validator=_uses)
    expires_in_seconds: int = attrs.field(default=24 * 3600, validator=_expiry)
    expect: JoinExpect = attrs.field(factory=JoinExpect)
    reclaim: Reclaim = "none"


@attrs.frozen(kw_only=True)
class JoinToken:
    """A join token without its secret: ``state`` is ``active``, ``expired``, ``revoked`` or ``exhausted``."""

    id: str
    pool_id: str
    tenant: str
    uses: int
    uses_left: int
    expires_at: dt.datetime
    expect: JoinExpect
    reclaim: Reclaim
    state: TokenState
    created_at: dt.datetime
    revoked_at: dt.datetime | None


@attrs.frozen(kw_only=True, repr=False)
class CreatedJoinToken:
    """The new token, shown here only, and the ``bcd join`` command that carries it."""

    id: str
    token: str
    pool_id: str
    uses_left: int
    expires_at: dt.datetime
    expect: JoinExpect
    reclaim: Reclaim
    join_command: str

    def __repr__(self) -> str:
        return f"CreatedJoinToken(id={self.id!r}, pool_id={self.pool_id!r}, token=<hidden>)"


@attrs.frozen(kw_only=True)
class ListJoinTokensInput(PageInput):
    """The pool whose tokens to list, one page at a time."""

    pool_id: str = attrs.field(validator=_id)


@attrs.frozen(kw_only=True)
class ListJoinTokensOutput:
    """A page of the pool's tokens, newest first, without secrets; ``next_cursor`` is null on the last page."""

    tokens: tuple[JoinToken, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class GetJoinTokenInput:
    """A token by id."""

    id: str = attrs.field(validator=_id)


@attrs.frozen(kw_only=True)
class RevokeJoinTokenInput:
    """A token to end now (revoking a revoked token changes nothing)."""

    id: str = attrs.field(validator=_id)
