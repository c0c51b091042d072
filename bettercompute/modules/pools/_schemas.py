"""Inputs and outputs of the ``pools`` group.

Field rules are declared with ``bettercompute.fields``: the codec enforces them (``INVALID_INPUT`` at the field's
path) and the OpenAPI document publishes them. The pool's class is ``pool_class`` on the wire (``class`` is a Python
keyword).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from bettercompute.fields import Entries, Integer, Items, Text
from bettercompute.paging import PageInput

__all__ = [
    "DEFAULT_ACCEPTANCE_CHECKS",
    "LABELS",
    "CreatePoolInput",
    "GetPoolInput",
    "ListPoolsInput",
    "ListPoolsOutput",
    "NodePolicy",
    "Pool",
    "PoolClass",
    "UpdatePoolInput",
]

PoolClass = Literal["gpu", "vps-host", "provider"]

DEFAULT_ACCEPTANCE_CHECKS = ("diag.nvml",)
MAX_LABELS = 64
MAX_CHECKS = 32

_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_NAME = Text(
    pattern=r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
    reason="must be a DNS label: 1 to 63 of a-z, 0-9 and '-', not starting or ending in '-'",
)
_CHECKS = Items(
    item=Text(
        pattern=r"[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*", max_length=128, reason="is not a check name like 'diag.nvml'"
    ),
    max_items=MAX_CHECKS,
    unique=True,
    reason=f"at most {MAX_CHECKS} checks",
)
# Kubernetes-style: an optional DNS-subdomain prefix and '/', then a name of alphanumerics, '-', '_', '.'.
_LABELS = Entries(
    key=Text(
        pattern=r"([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?",
        max_length=317,
        reason="is not a label key like 'zone' or 'example.com/rack'",
    ),
    value=Text(
        pattern=r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?",
        reason="must be at most 63 of A-Z, a-z, 0-9, '.', '_', '-'",
    ),
    max_entries=MAX_LABELS,
    reason=f"at most {MAX_LABELS} labels",
)
LABELS = _LABELS
"""The rule on a resource's labels (Kubernetes-style keys and values, at most ``MAX_LABELS``)."""
DEFAULT_FATAL_XIDS = (48, 63, 64, 74, 79, 92, 93, 94, 95)
_XIDS = Items(
    item=Integer(minimum=1, maximum=1023, reason="must be an XID between 1 and 1023"),
    max_items=256,
    unique=True,
    reason="at most 256 XIDs, each once",
)


# --- pools ------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class NodePolicy:
    """How a pool judges its machines: the acceptance gate's thresholds on NVML's facts, how long a check may run,
    and how long an unreachable node keeps its capacity.

    A node is quarantined when a GPU has more uncorrectable (volatile) ECC errors than ``max_ecc_uncorrectable``,
    when one of ``fatal_xids`` was seen, when pages are pending retirement (``quarantine_retired_pages_pending``) or
    when NVML asks for a recovery action (``quarantine_recovery_action``).
    """

    max_ecc_uncorrectable: int = attrs.field(
        default=0, validator=Integer(minimum=0, maximum=1_000_000, reason="must be between 0 and 1000000")
    )
    fatal_xids: tuple[int, ...] = attrs.field(default=DEFAULT_FATAL_XIDS, validator=_XIDS)
    quarantine_retired_pages_pending: bool = True
    quarantine_recovery_action: bool = True
    check_deadline_seconds: int = attrs.field(
        default=120, validator=Integer(minimum=5, maximum=3600, reason="must be between 5 and 3600 seconds")
    )
    unreachable_grace_seconds: int = attrs.field(
        default=300, validator=Integer(minimum=0, maximum=7 * 86400, reason="must be between 0 and 604800 seconds")
    )

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> NodePolicy:
        """The policy as stored (a field not stored, from an older release, takes its default)."""
        known = {f.name for f in attrs.fields(cls)}
        values = {k: v for k, v in stored.items() if k in known}
        if "fatal_xids" in values:
            values["fatal_xids"] = tuple(values["fatal_xids"])
        return cls(**values)

    def stored(self) -> dict[str, Any]:
        """The policy as a JSON object."""
        return {**attrs.asdict(self), "fatal_xids": list(self.fatal_xids)}


@attrs.frozen(kw_only=True)
class CreatePoolInput:
    """A pool of a tenant: its name (a DNS label, unique in the tenant), class, acceptance checks and labels."""

    tenant: str = attrs.field(validator=_ID)
    name: str = attrs.field(validator=_NAME)
    pool_class: PoolClass = "gpu"
    acceptance_checks: tuple[str, ...] = attrs.field(default=DEFAULT_ACCEPTANCE_CHECKS, validator=_CHECKS)
    labels: dict[str, str] = attrs.field(factory=dict, validator=_LABELS)
    node_policy: NodePolicy = attrs.field(factory=NodePolicy)


@attrs.frozen(kw_only=True)
class Pool:
    """A pool: where joined machines go, and the checks they pass to be adopted."""

    id: str
    tenant: str
    name: str
    pool_class: PoolClass
    acceptance_checks: tuple[str, ...]
    labels: dict[str, str]
    node_policy: NodePolicy
    created_at: dt.datetime
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class ListPoolsInput(PageInput):
    """The tenant whose pools to list, one page at a time."""

    tenant: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListPoolsOutput:
    """A page of the tenant's pools, oldest first; ``next_cursor`` is null on the last page."""

    pools: tuple[Pool, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class GetPoolInput:
    """A pool by id."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class UpdatePoolInput:
    """A pool's new name, acceptance checks, labels or node policy (a field left out stays as it is; labels and the
    policy are replaced whole).

    The class is fixed at ``create``.
    """

    id: str = attrs.field(validator=_ID)
    name: str | None = attrs.field(default=None, validator=_NAME)
    acceptance_checks: tuple[str, ...] | None = attrs.field(default=None, validator=_CHECKS)
    labels: dict[str, str] | None = attrs.field(default=None, validator=_LABELS)
    node_policy: NodePolicy | None = None
