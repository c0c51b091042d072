"""Webhook subscriptions and their deliveries."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository, Sealed

__all__ = [
    "SEALED_PREVIOUS_WEBHOOK_SECRETS",
    "SEALED_WEBHOOK_SECRETS",
    "WEBHOOKS",
    "DeliveryOutcome",
    "DueDelivery",
    "WebhookDelivery",
    "WebhookSubscription",
    "Webhooks",
]


@attrs.frozen(kw_only=True)
class WebhookSubscription:
    """A stored webhook subscription. ``secret`` is the signing secret as the KMS sealed it, never in the clear."""

    id: str
    tenant: str
    url: str
    event_types: tuple[str, ...]
    description: str
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class WebhookDelivery:
    """One event's delivery to one subscription, as its log shows it (``status``: pending, delivered, dead)."""

    id: int
    event_id: str
    event_type: str
    event_key: str
    status: str
    attempts: int
    last_status: int | None
    last_error: str | None
    next_attempt_at: dt.datetime | None
    created_at: dt.datetime
    finished_at: dt.datetime | None


@attrs.frozen(kw_only=True, repr=False)
class DueDelivery:
    """A delivery claimed for one attempt until ``claimed_until``; ``token`` proves the claim is still its own.

    ``sealed_secret`` is the subscription's KMS blob (context ``webhook:<tenant>:<subscription_id>``), and
    ``previous_sealed_secret`` the one it replaced while that still signs too (a rotation's overlap); ``body`` the
    exact bytes to sign and send; ``attempts`` counts the attempts made before this one.
    """

    id: int
    token: str
    subscription_id: str
    tenant: str
    url: str
    sealed_secret: bytes
    event_id: str
    event_type: str
    body: str
    attempts: int
    previous_sealed_secret: bytes | None = None

    def __repr__(self) -> str:
        return f"DueDelivery(id={self.id}, subscription_id={self.subscription_id!r}, event_id={self.event_id!r})"


@attrs.frozen(kw_only=True)
class DeliveryOutcome:
    """What an attempt came to: ``status`` ``delivered``, ``pending`` (retry after ``retry_in``) or ``dead``.

    ``attempted`` is ``False`` when no request was made for a reason that is this worker's, not the receiver's (it
    cannot open the signing secret): the delivery goes back to ``pending`` and its attempts stay as they were.
    """

    delivery: DueDelivery
    status: str
    http_status: int | None = None
    error: str | None = None
    retry_in: dt.timedelta = dt.timedelta(0)
    attempted: bool = True


class Webhooks(Protocol):
    """Webhook subscriptions of tenants, and their deliveries (the ``webhooks`` module's state).

    Deliveries of one subscription and one event key are handed out one at a time in the order they were added: a
    delivery is not claimed while an earlier one of its key is still pending (delivered and dead ones no longer
    hold it back). A subscription's deletion deletes its deliveries. ``create``, ``rotate``, ``delete`` and
    ``add_delivery`` need a transaction (``tx.repository(WEBHOOKS)``); the deliveries' own writes (``fan_out``,
    ``claim``, ``record``, ``purge``) commit on their own.
    """

    async def create(
        self,
        *,
        id: str,
        tenant: str,
        url: str,
        event_types: Sequence[str],
        description: str,
        sealed_secret: bytes,
    ) -> WebhookSubscription:
        """Add a subscription."""
        ...

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[WebhookSubscription]:
        """The tenant's subscriptions in ``(created_at, id)`` order: at most ``limit``, after the key ``after``."""
        ...

    async def delete(self, *, tenant: str, id: str) -> WebhookSubscription | None:
        """Delete a subscription of ``tenant`` and its deliveries; ``None`` when the tenant has no such one."""
        ...

    async def rotate(
        self, *, tenant: str, id: str, sealed_secret: bytes, previous_until: dt.datetime | None
    ) -> WebhookSubscription | None:
        """Give a subscription of ``tenant`` a new sealed secret; the one it replaces keeps signing next to it until
        ``previous_until`` (not at all when ``None``). ``None`` when the tenant has no such subscription."""
        ...

    async def add_delivery(
        self, *, tenant: str, id: str, event_id: str, event_type: str, event_key: str, body: str
    ) -> bool:
        """Queue one event for one subscription of ``tenant``; ``False`` when the tenant has no such one."""
        ...

    async def fan_out(self, *, tenant: str, event_id: str, event_type: str, event_key: str, body: str) -> int:
        """Queue an event for every subscription of ``tenant`` whose filters match ``event_type``; returns how many.

        Idempotent per ``(subscription, event_id)``: an event handed out twice is queued once.
        """
        ...

    async def claim(
        self, *, limit: int, claim_for: dt.timedelta, per_tenant: int, per_webhook: int
    ) -> list[DueDelivery]:
        """Claim up to ``limit`` due deliveries (expired claims are due again), at most ``per_tenant`` of one tenant
        and ``per_webhook`` of one subscription, taken in turns: each tenant's oldest due first, then each one's
        second, and so on (within a tenant, its subscriptions likewise). Returned in that order, so a tenant with a
        large or failing backlog neither fills a pass nor goes first in it."""
        ...

    async def record(self, outcomes: Sequence[DeliveryOutcome]) -> int:
        """Record outcomes (attempts + 1 for each one ``attempted``); returns how many claims were still held (others
        are ignored)."""
        ...

    async def deliveries(
        self, *, tenant: str, id: str, after: Sequence[Any] | None, limit: int
    ) -> list[WebhookDelivery] | None:
        """A subscription of ``tenant``'s deliveries, newest first (``id`` descending): at most ``limit``, with ids
        below ``after``'s one part; ``None`` when the tenant has no such subscription."""
        ...

    async def purge(self, *, retention: dt.timedelta, dead_retention: dt.timedelta, batch: int) -> int:
        """Delete ``delivered`` deliveries that finished more than ``retention`` ago and ``dead`` ones more than
        ``dead_retention`` ago, by the store's clock; never a ``pending`` one. Each statement touches at most
        ``batch`` rows and commits on its own (an interrupted purge keeps what it deleted; safe to run again).
        Returns how many were deleted."""
        ...


WEBHOOKS: Repository[Webhooks] = Repository(module="webhooks", name="webhooks")
"""``tx.repository(WEBHOOKS)`` in a transaction, ``store.repository(WEBHOOKS)`` outside one: the store's ``Webhooks``"""
SEALED_WEBHOOK_SECRETS: Repository[Sealed] = Repository(module="webhooks", name="sealed_secrets")
"""Each subscription's signing secret (``webhook_subscriptions.sealed_secret``)."""
SEALED_PREVIOUS_WEBHOOK_SECRETS: Repository[Sealed] = Repository(module="webhooks", name="sealed_previous_secrets")
"""The secret a rotation replaced, while its overlap lasts (``webhook_subscriptions.previous_sealed_secret``)."""
