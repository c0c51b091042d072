"""Inputs and outputs of the ``maintenance`` group."""

from __future__ import annotations

import datetime as dt

import attrs

from bettercompute.fields import Text
from bettercompute.paging import PageInput

__all__ = ["CreateWindowInput", "ListWindowsInput", "ListWindowsOutput", "Window"]

_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_REASON = Text(pattern=r"[^\x00-\x1f\x7f]{1,200}", reason="must be 1 to 200 characters, no control characters")


def _aware(_: object, attribute: attrs.Attribute[dt.datetime], value: dt.datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must name its time zone", attribute, "<hidden>")


@attrs.frozen(kw_only=True)
class CreateWindowInput:
    """A window during which a pool's machines may be taken down."""

    tenant: str = attrs.field(validator=_ID)
    pool_id: str = attrs.field(validator=_ID)
    starts_at: dt.datetime = attrs.field(validator=_aware)
    ends_at: dt.datetime = attrs.field(validator=_aware)
    reason: str = attrs.field(validator=_REASON)


@attrs.frozen(kw_only=True)
class Window:
    """A maintenance window."""

    id: str
    tenant: str
    pool_id: str
    starts_at: dt.datetime
    ends_at: dt.datetime
    reason: str


@attrs.frozen(kw_only=True)
class ListWindowsInput(PageInput):
    """The tenant whose windows to list, by start, one page at a time."""

    tenant: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListWindowsOutput:
    """A page of windows; ``next_cursor`` is null on the last page."""

    windows: tuple[Window, ...]
    next_cursor: str | None
