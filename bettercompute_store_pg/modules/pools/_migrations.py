"""The ``pools`` module's tables: pools and their join tokens."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATIONS"]

# Pools (one name per tenant; the class and the acceptance checks a joining machine must pass; paged by tenant in
# (created_at, id) order) and their join tokens (only the SHA-256 of a token's secret; uses left, expiry,
# revocation, expected claims, the reclaim rule).
_V1 = """
CREATE TABLE {schema}.pools (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    name text NOT NULL,
    pool_class text NOT NULL CHECK (pool_class IN ('gpu', 'vps-host', 'provider')),
    acceptance_checks text[] NOT NULL DEFAULT '{diag.nvml}',
    labels jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, name)
);
CREATE INDEX pools_tenant_page ON {schema}.pools (tenant, created_at, id);

CREATE TABLE {schema}.join_tokens (
    id text PRIMARY KEY,
    pool_id text NOT NULL REFERENCES {schema}.pools (id),
    tenant text NOT NULL,
    secret_hash bytea NOT NULL CHECK (octet_length(secret_hash) = 32),
    uses integer NOT NULL CHECK (uses BETWEEN 1 AND 10000),
    uses_left integer NOT NULL CHECK (uses_left BETWEEN 0 AND uses),
    expires_at timestamptz NOT NULL,
    expect jsonb NOT NULL DEFAULT '{}',
    reclaim text NOT NULL CHECK (reclaim IN ('none', 'same-hardware')),
    created_by text,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at timestamptz
);
CREATE INDEX join_tokens_pool ON {schema}.join_tokens (pool_id, created_at);
"""

# How a pool judges its machines (``NodePolicy``: the acceptance gate's thresholds, check deadlines, the grace of an
# unreachable node); an empty object means the defaults.
_V2 = """
ALTER TABLE {schema}.pools ADD COLUMN node_policy jsonb NOT NULL DEFAULT '{}';
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(version=1, name="pools and join tokens", sql=_V1),
    Migration(version=2, name="node policy", sql=_V2),
)
