"""Inputs and outputs of the ``webhooks`` group.

Tenant-scoped like IAM's groups: every input names its ``tenant``, so the core's pre-check refuses a caller from
another tenant before any database access. Field rules are attrs validators raising ``(message, attribute, value)``,
which the codec reports as ``INVALID_INPUT`` at the field's path.
"""

from __future__ import annotations

import datetime as dt
import re
import urllib.parse
from typing import Any, Literal

import attrs

from bettercompute.fields import Integer, Items, Text
from bettercompute.paging import PageInput

__all__ = [
    "CreateWebhookInput",
    "CreatedWebhook",
    "DeleteWebhookInput",
    "DeleteWebhookOutput",
    "Delivery",
    "ListDeliveriesInput",
    "ListDeliveriesOutput",
    "ListWebhooksInput",
    "ListWebhooksOutput",
    "RotateWebhookSecretInput",
    "Webhook",
    "WebhookTestInput",
    "WebhookTestOutput",
]

MAX_EVENT_TYPES = 64
_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
# ``reservation.created`` matches that type; ``reservation.*`` every type under ``reservation.``; ``*`` all.
_EVENT_TYPE_PATTERN = re.compile(r"\*|[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*(\.\*)?")


def _fail(attribute: attrs.Attribute[Any], value: Any, reason: str) -> ValueError:
    return ValueError(reason, attribute, value)


def _url(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if len(value) > 2048:
        raise _fail(attribute, value, "must be at most 2048 characters")
    try:
        parsed = urllib.parse.urlsplit(value)
        port = parsed.port
    except ValueError:
        raise _fail(attribute, value, "must be an absolute http:// or https:// URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise _fail(attribute, value, "must be an absolute http:// or https:// URL")
    if parsed.username is not None or parsed.password is not None:
        # The URL is listed back and stored in the clear: credentials in it would leak. Sign instead.
        raise _fail(attribute, value, "may not carry a user name or password")
    if parsed.fragment or any(c.isspace() for c in value):
        raise _fail(attribute, value, "may not have a fragment or white space")
    del port


_EVENT_TYPES = Items(
    item=Text(
        pattern=_EVENT_TYPE_PATTERN.pattern,
        max_length=128,
        reason="is not an event type pattern: 'reservation.created', 'reservation.*' or '*'",
    ),
    max_items=MAX_EVENT_TYPES,
    reason=f"at most {MAX_EVENT_TYPES} patterns",
)
_DESCRIPTION = Text(max_length=500, reason="must be at most 500 characters")


@attrs.frozen(kw_only=True)
class CreateWebhookInput:
    """A subscription: where to POST the tenant's events, and which types (none listed: every type)."""

    tenant: str = attrs.field(validator=_ID)
    url: str = attrs.field(validator=_url)
    event_types: tuple[str, ...] = attrs.field(default=(), validator=_EVENT_TYPES)
    description: str = attrs.field(default="", validator=_DESCRIPTION)


@attrs.frozen(kw_only=True)
class Webhook:
    """A subscription, without its secret."""

    id: str
    tenant: str
    url: str
    event_types: tuple[str, ...]
    description: str
    created_at: dt.datetime


@attrs.frozen(kw_only=True, repr=False)
class CreatedWebhook:
    """The new subscription and its signing secret, which is shown here only: store it now."""

    webhook: Webhook
    secret: str

    def __repr__(self) -> str:
        return f"CreatedWebhook(webhook={self.webhook!r}, secret=<hidden>)"


@attrs.frozen(kw_only=True)
class ListWebhooksInput(PageInput):
    """The tenant whose subscriptions to list, one page at a time."""

    tenant: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListWebhooksOutput:
    """A page of the tenant's subscriptions, oldest first; ``next_cursor`` is null on the last page."""

    webhooks: tuple[Webhook, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class DeleteWebhookInput:
    """A subscription to delete, with its pending deliveries."""

    tenant: str = attrs.field(validator=_ID)
    id: str = attrs.field(validator=_ID)


MAX_OVERLAP = 7 * 24 * 3600
"""The longest a replaced signing secret keeps signing next to the new one (seconds)."""


@attrs.frozen(kw_only=True)
class RotateWebhookSecretInput:
    """A subscription whose signing secret to replace. The replaced secret keeps signing next to the new one for
    ``overlap_seconds`` (a day by default; 0 ends it at once), while receivers move to the new one."""

    tenant: str = attrs.field(validator=_ID)
    id: str = attrs.field(validator=_ID)
    overlap_seconds: int = attrs.field(
        default=24 * 3600,
        validator=Integer(minimum=0, maximum=MAX_OVERLAP, reason=f"must be between 0 and {MAX_OVERLAP} seconds"),
    )


@attrs.frozen(kw_only=True)
class DeleteWebhookOutput:
    """Always ``deleted=True`` (an unknown subscription is ``NOT_FOUND``)."""

    deleted: bool


@attrs.frozen(kw_only=True)
class WebhookTestInput:
    """A subscription to send a ``webhook.test`` event to."""

    tenant: str = attrs.field(validator=_ID)
    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class WebhookTestOutput:
    """The id of the test event, as the receiver will see it in ``Bettercompute-Event-Id``."""

    event_id: str


@attrs.frozen(kw_only=True)
class ListDeliveriesInput(PageInput):
    """A subscription's delivery log, newest first, one page at a time."""

    tenant: str = attrs.field(validator=_ID)
    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class Delivery:
    """One event's delivery to one subscription: its state, attempts, and the last answer or error."""

    id: int
    event_id: str
    event_type: str
    event_key: str
    status: Literal["pending", "delivered", "dead"]
    attempts: int
    last_status: int | None
    last_error: str | None
    next_attempt_at: dt.datetime | None
    created_at: dt.datetime
    finished_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class ListDeliveriesOutput:
    """A page of a subscription's deliveries, newest first; ``next_cursor`` is null on the last page."""

    deliveries: tuple[Delivery, ...]
    next_cursor: str | None
