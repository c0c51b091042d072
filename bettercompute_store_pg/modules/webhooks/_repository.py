"""Webhook subscriptions and their deliveries (``Webhooks``).

A delivery row per (subscription, event), kept after it ends as the subscription's log until ``purge`` deletes it
past its retention. Claims follow the outbox's rule per subscription: only the oldest pending delivery of a
(subscription, event key) is a candidate, so a key's events reach each receiver in order, and a delivery waiting for
its retry holds back the later ones of its key.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from bettercompute.modules.webhooks import (
    DeliveryOutcome,
    DueDelivery,
    WebhookDelivery,
    WebhookSubscription,
    secret_context,
)
from bettercompute_store_pg._db import Database, dumps, utc
from bettercompute_store_pg._repository import PgRepository
from bettercompute_store_pg._sealed import sealed_column

__all__ = ["REPOSITORIES", "PgWebhooks"]

_COLUMNS = "id, tenant, url, event_types, description, created_at"

_CREATE = f"""
INSERT INTO {{s}}.webhook_subscriptions (id, tenant, url, event_types, description, sealed_secret)
VALUES (:id, :tenant, :url, CAST(:event_types AS text[]), :description, :sealed_secret)
RETURNING {_COLUMNS}
"""

_LIST = f"""
SELECT {_COLUMNS} FROM {{s}}.webhook_subscriptions
WHERE tenant = :tenant AND (CAST(:after_at AS timestamptz) IS NULL OR (created_at, id) > (:after_at, :after_id))
ORDER BY created_at, id LIMIT :limit
"""

_DELETE = f"DELETE FROM {{s}}.webhook_subscriptions WHERE id = :id AND tenant = :tenant RETURNING {_COLUMNS}"

_ROTATE = f"""
UPDATE {{s}}.webhook_subscriptions SET
    previous_sealed_secret = CASE WHEN CAST(:previous_until AS timestamptz) IS NULL THEN NULL ELSE sealed_secret END,
    previous_until = :previous_until,
    sealed_secret = :sealed_secret
WHERE id = :id AND tenant = :tenant
RETURNING {_COLUMNS}
"""

_ADD = """
INSERT INTO {s}.webhook_deliveries (subscription_id, event_id, event_type, event_key, body)
SELECT id, :event_id, :event_type, :event_key, :body FROM {s}.webhook_subscriptions
WHERE id = :id AND tenant = :tenant
ON CONFLICT (subscription_id, event_id) DO NOTHING
RETURNING id
"""

# A pattern is an exact type, '*', or 'prefix.*' (matching every type that starts with 'prefix.').
_FAN_OUT = """
INSERT INTO {s}.webhook_deliveries (subscription_id, event_id, event_type, event_key, body)
SELECT w.id, :event_id, :event_type, :event_key, :body FROM {s}.webhook_subscriptions AS w
WHERE w.tenant = :tenant AND (
    cardinality(w.event_types) = 0
    OR EXISTS (
        SELECT 1 FROM unnest(w.event_types) AS p(pattern)
        WHERE p.pattern = :event_type OR p.pattern = '*'
           OR (right(p.pattern, 2) = '.*' AND starts_with(:event_type, left(p.pattern, -1)))
    )
)
ORDER BY w.id
ON CONFLICT (subscription_id, event_id) DO NOTHING
"""

# Fair claims: each subscription offers at most :per_webhook of its due heads (oldest due first, through the index on
# (subscription_id, event_key, id) and a short scan per subscription), then each tenant's candidates are numbered
# round-robin over its subscriptions, and the claim takes turn 1 of every tenant, then turn 2, ... up to :per_tenant.
# One tenant's thousands of failing deliveries thus take at most :per_tenant slots of a pass, and never the first.
_CLAIM = """
WITH offered AS (
    SELECT c.id, c.next_attempt_at, w.tenant, c.subscription_id,
        row_number() OVER (PARTITION BY c.subscription_id ORDER BY c.next_attempt_at, c.id) AS hook_turn
    FROM {s}.webhook_subscriptions AS w
    CROSS JOIN LATERAL (
        SELECT d.id, d.subscription_id, d.next_attempt_at FROM {s}.webhook_deliveries AS d
        WHERE d.subscription_id = w.id AND d.status = 'pending' AND d.next_attempt_at <= now()
          AND (d.claimed_until IS NULL OR d.claimed_until <= now())
          AND NOT EXISTS (
              SELECT 1 FROM {s}.webhook_deliveries AS e
              WHERE e.subscription_id = d.subscription_id AND e.event_key = d.event_key AND e.status = 'pending'
                AND e.id < d.id
          )
        ORDER BY d.next_attempt_at, d.id LIMIT :per_webhook
    ) AS c
), turns AS (
    SELECT id, next_attempt_at,
        row_number() OVER (PARTITION BY tenant ORDER BY hook_turn, next_attempt_at, id) AS turn
    FROM offered
), chosen AS (
    SELECT id, turn, next_attempt_at FROM turns WHERE turn <= :per_tenant
    ORDER BY turn, next_attempt_at, id LIMIT :limit
), picked AS (
    -- Chosen first, then locked by primary key: the join never reads the deliveries table as a whole.
    SELECT d.id, c.turn FROM chosen AS c JOIN {s}.webhook_deliveries AS d ON d.id = c.id
    ORDER BY c.turn, c.next_attempt_at, c.id
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE {s}.webhook_deliveries AS d SET claim_token = gen_random_uuid()::text, claimed_until = now() + :claim_for
FROM picked, {s}.webhook_subscriptions AS w
WHERE d.id = picked.id AND w.id = d.subscription_id
RETURNING d.id, d.claim_token, d.subscription_id, w.tenant, w.url, w.sealed_secret, d.event_id, d.event_type, d.body,
    d.attempts, d.next_attempt_at, picked.turn,
    CASE WHEN w.previous_until > now() THEN w.previous_sealed_secret END AS previous_sealed_secret
"""

_RECORD = """
UPDATE {s}.webhook_deliveries AS d SET
    attempts = d.attempts + CASE WHEN r.attempted THEN 1 ELSE 0 END,
    status = r.status,
    next_attempt_at = CASE WHEN r.status = 'pending' THEN now() + make_interval(secs => r.retry_in) END,
    finished_at = CASE WHEN r.status = 'pending' THEN NULL ELSE now() END,
    last_status = r.http_status,
    last_error = r.error,
    claim_token = NULL,
    claimed_until = NULL
FROM jsonb_to_recordset(CAST(:outcomes AS jsonb))
    AS r(id bigint, token text, status text, http_status integer, error text, retry_in double precision,
        attempted boolean)
WHERE d.id = r.id AND d.claim_token = r.token AND d.status = 'pending'
"""

_DELIVERIES = """
SELECT w.id AS subscription_id, d.* FROM {s}.webhook_subscriptions AS w
LEFT JOIN LATERAL (
    SELECT id, event_id, event_type, event_key, status, attempts, last_status, last_error, next_attempt_at,
        created_at, finished_at
    FROM {s}.webhook_deliveries
    WHERE subscription_id = w.id AND (CAST(:after AS bigint) IS NULL OR id < :after)
    ORDER BY id DESC LIMIT :limit
) AS d ON true
WHERE w.id = :id AND w.tenant = :tenant
ORDER BY d.id DESC
"""


# One bounded step of the purge: the next ``batch`` rows by primary key after ``after``, of which the finished ones
# past their retention are deleted. It needs no index on finished_at (there is none): walking the key from the
# oldest row, a pass stops at the first step that reaches rows created within the shorter retention (a row finishes
# after it is created, so none from there on can be due), so each pass reads the retained old rows (dead letters
# younger than dead_retention) plus what it deletes, never the young bulk of the table.
_PURGE = """
WITH chunk AS (
    SELECT id, created_at FROM {s}.webhook_deliveries WHERE id > :after ORDER BY id LIMIT :batch
), purged AS (
    DELETE FROM {s}.webhook_deliveries AS d USING chunk
    WHERE d.id = chunk.id AND (
        (d.status = 'delivered' AND d.finished_at < now() - :retention)
        OR (d.status = 'dead' AND d.finished_at < now() - :dead_retention)
    )
    RETURNING d.id
), last AS (
    SELECT id, created_at FROM chunk ORDER BY id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM chunk) AS scanned, (SELECT count(*) FROM purged) AS purged,
    (SELECT id FROM last) AS last_id,
    coalesce((SELECT created_at >= now() - :horizon FROM last), true) AS reached_recent
"""


def _subscription(row: Any) -> WebhookSubscription:
    return WebhookSubscription(
        id=row.id,
        tenant=row.tenant,
        url=row.url,
        event_types=tuple(row.event_types),
        description=row.description,
        created_at=utc(row.created_at),
    )


def _due(row: Any) -> DueDelivery:
    return DueDelivery(
        id=row.id,
        token=row.claim_token,
        subscription_id=row.subscription_id,
        tenant=row.tenant,
        url=row.url,
        sealed_secret=bytes(row.sealed_secret),
        previous_sealed_secret=bytes(row.previous_sealed_secret) if row.previous_sealed_secret is not None else None,
        event_id=row.event_id,
        event_type=row.event_type,
        body=row.body,
        attempts=row.attempts,
    )


def _delivery(row: Any) -> WebhookDelivery:
    return WebhookDelivery(
        id=row.id,
        event_id=row.event_id,
        event_type=row.event_type,
        event_key=row.event_key,
        status=row.status,
        attempts=row.attempts,
        last_status=row.last_status,
        last_error=row.last_error,
        next_attempt_at=utc(row.next_attempt_at) if row.next_attempt_at is not None else None,
        created_at=utc(row.created_at),
        finished_at=utc(row.finished_at) if row.finished_at is not None else None,
    )


class PgWebhooks(PgRepository):
    """``Webhooks`` on ``webhook_subscriptions`` and ``webhook_deliveries``; one statement per
    call, except ``purge`` (one bounded statement per step)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._create = db.sql(_CREATE)
        self._list = db.sql(_LIST)
        self._delete = db.sql(_DELETE)
        self._rotate = db.sql(_ROTATE)
        self._add = db.sql(_ADD)
        self._fan_out = db.sql(_FAN_OUT)
        self._claim = db.sql(_CLAIM)
        self._record = db.sql(_RECORD)
        self._deliveries = db.sql(_DELIVERIES)
        self._purge = db.sql(_PURGE)

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
        """Add a subscription in the caller's transaction."""
        params = {
            "id": id,
            "tenant": tenant,
            "url": url,
            "event_types": list(event_types),
            "description": description,
            "sealed_secret": sealed_secret,
        }
        rows = await self._fetch_in_transaction("create", self._create, params)
        return _subscription(rows[0])

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[WebhookSubscription]:
        """The tenant's subscriptions in ``(created_at, id)`` order, after ``after``."""
        after_at, after_id = after if after is not None else (None, None)
        params = {"tenant": tenant, "after_at": after_at, "after_id": after_id, "limit": limit}
        rows = await self._fetch(self._list, params)
        return [_subscription(row) for row in rows]

    async def delete(self, *, tenant: str, id: str) -> WebhookSubscription | None:
        """Delete a subscription of ``tenant`` (its deliveries go with it)."""
        rows = await self._fetch_in_transaction("delete", self._delete, {"id": id, "tenant": tenant})
        return _subscription(rows[0]) if rows else None

    async def rotate(
        self, *, tenant: str, id: str, sealed_secret: bytes, previous_until: dt.datetime | None
    ) -> WebhookSubscription | None:
        """Replace the subscription's secret in the caller's transaction; the one replaced keeps signing until
        ``previous_until`` (not at all when ``None``)."""
        params = {"id": id, "tenant": tenant, "sealed_secret": sealed_secret, "previous_until": previous_until}
        rows = await self._fetch_in_transaction("rotate", self._rotate, params)
        return _subscription(rows[0]) if rows else None

    async def add_delivery(
        self, *, tenant: str, id: str, event_id: str, event_type: str, event_key: str, body: str
    ) -> bool:
        """Queue one event for one subscription of ``tenant``; ``False`` when it has no such one."""
        params = {
            "id": id,
            "tenant": tenant,
            "event_id": event_id,
            "event_type": event_type,
            "event_key": event_key,
            "body": body,
        }
        return bool(await self._fetch_in_transaction("add_delivery", self._add, params))

    async def fan_out(self, *, tenant: str, event_id: str, event_type: str, event_key: str, body: str) -> int:
        """Queue an event for every matching subscription of ``tenant``, once per (subscription, event)."""
        params = {"tenant": tenant, "event_id": event_id, "event_type": event_type, "event_key": event_key}
        return await self._rowcount(self._fan_out, {**params, "body": body})

    async def claim(
        self, *, limit: int, claim_for: dt.timedelta, per_tenant: int, per_webhook: int
    ) -> list[DueDelivery]:
        """Claim up to ``limit`` due deliveries, heads of their (subscription, key) only, in turns per tenant."""
        if min(limit, per_tenant, per_webhook) <= 0:
            return []
        params = {"limit": limit, "claim_for": claim_for, "per_tenant": per_tenant, "per_webhook": per_webhook}
        rows = await self._fetch(self._claim, params)
        return [_due(row) for row in sorted(rows, key=lambda r: (r.turn, r.next_attempt_at, r.id))]

    async def record(self, outcomes: Sequence[DeliveryOutcome]) -> int:
        """Record outcomes (attempts + 1 where ``attempted``); those whose claim was lost are ignored."""
        if not outcomes:
            return 0
        payload = [
            {
                "id": o.delivery.id,
                "token": o.delivery.token,
                "status": o.status,
                "http_status": o.http_status,
                "error": o.error,
                "retry_in": o.retry_in.total_seconds(),
                "attempted": o.attempted,
            }
            for o in outcomes
        ]
        return await self._rowcount(self._record, {"outcomes": dumps(payload)})

    async def deliveries(
        self, *, tenant: str, id: str, after: Sequence[Any] | None, limit: int
    ) -> list[WebhookDelivery] | None:
        """A subscription of ``tenant``'s deliveries, newest first, below the id in ``after``; ``None`` when the
        tenant has no such subscription."""
        params = {"tenant": tenant, "id": id, "after": after[0] if after is not None else None, "limit": limit}
        rows = await self._fetch(self._deliveries, params)
        if not rows:
            return None
        return [_delivery(row) for row in rows if row.id is not None]

    async def purge(self, *, retention: dt.timedelta, dead_retention: dt.timedelta, batch: int) -> int:
        """Delete finished deliveries past their retention, walking the primary key ``batch`` rows per statement."""
        if batch <= 0:
            return 0
        params = {
            "retention": retention,
            "dead_retention": dead_retention,
            "horizon": min(retention, dead_retention),
            "batch": batch,
        }
        after, deleted = 0, 0
        while True:
            (row,) = await self._fetch(self._purge, {**params, "after": after})
            deleted += int(row.purged)
            if row.scanned < batch or row.reached_recent:
                return deleted
            after = int(row.last_id)


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {
    "webhooks": PgWebhooks,
    "sealed_secrets": sealed_column(
        "webhook_subscriptions", "sealed_secret", lambda r: secret_context(r.tenant, r.id), fields=("tenant",)
    ),
    "sealed_previous_secrets": sealed_column(
        "webhook_subscriptions", "previous_sealed_secret", lambda r: secret_context(r.tenant, r.id), fields=("tenant",)
    ),
}
"""The adapters of this module's repositories, by ``Repository.name``."""
