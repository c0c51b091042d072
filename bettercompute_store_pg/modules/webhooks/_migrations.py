"""The ``webhooks`` module's tables: subscriptions and deliveries (made only where the module is on, with a KMS)."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATIONS"]

# Subscriptions (the signing secret only as the KMS sealed it) and one delivery row per (subscription, event), kept
# after it ends as the subscription's delivery log. The fair claim reads each subscription's first due deliveries
# (webhook_deliveries_heads), so one tenant's backlog never slows another's claims.
_V1 = """
CREATE TABLE {schema}.webhook_subscriptions (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    url text NOT NULL,
    event_types text[] NOT NULL DEFAULT '{}',
    description text NOT NULL DEFAULT '',
    sealed_secret bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_subscriptions_tenant ON {schema}.webhook_subscriptions (tenant, created_at, id);

CREATE TABLE {schema}.webhook_deliveries (
    id bigserial PRIMARY KEY,
    subscription_id text NOT NULL REFERENCES {schema}.webhook_subscriptions (id) ON DELETE CASCADE,
    event_id text NOT NULL,
    event_type text NOT NULL,
    event_key text NOT NULL,
    body text NOT NULL,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz DEFAULT now(),
    claim_token text,
    claimed_until timestamptz,
    last_status integer,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    UNIQUE (subscription_id, event_id)
);
CREATE INDEX webhook_deliveries_key ON {schema}.webhook_deliveries (subscription_id, event_key, id)
    WHERE status = 'pending';
CREATE INDEX webhook_deliveries_log ON {schema}.webhook_deliveries (subscription_id, id);
CREATE INDEX webhook_deliveries_heads ON {schema}.webhook_deliveries (subscription_id, next_attempt_at, id)
    WHERE status = 'pending';
"""

# Signing-secret rotation: the secret being replaced keeps signing, next to the new one, until ``previous_until``.
_V2 = """
ALTER TABLE {schema}.webhook_subscriptions
    ADD COLUMN previous_sealed_secret bytea,
    ADD COLUMN previous_until timestamptz,
    ADD CHECK ((previous_sealed_secret IS NULL) = (previous_until IS NULL));
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(version=1, name="subscriptions and deliveries", sql=_V1),
    Migration(version=2, name="signing-secret rotation", sql=_V2),
)
