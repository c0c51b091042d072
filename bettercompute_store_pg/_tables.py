"""The store's own tables, the runtime's: leases, work queue, outbox, idempotency keys, audit, the authorization
projection, worker membership, workflows and the replay guard's nonces. ``PgStore.install()`` applies them, under the
name ``"runtime"``, before any module's; they are not a module's (no module may take that name)."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATIONS"]

_V1 = """
CREATE TABLE {schema}.leases (
    name text PRIMARY KEY,
    holder text NOT NULL,
    token bigint NOT NULL,
    expires_at timestamptz NOT NULL
);

-- One row per (kind, key). Enqueuing a key that is being worked on records a rerun on the claimed row instead of
-- adding a second row, so a key can never be claimed twice at once, whatever the timing.
CREATE TABLE {schema}.work_queue (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    key text NOT NULL,
    shard smallint NOT NULL DEFAULT 0,
    payload jsonb NOT NULL DEFAULT '{}',
    run_at timestamptz NOT NULL,
    state text NOT NULL DEFAULT 'ready' CHECK (state IN ('ready', 'claimed')),
    attempts integer NOT NULL DEFAULT 0,
    claim_token text,
    claimed_by text,
    claimed_until timestamptz,
    last_error text,
    rerun_at timestamptz,
    rerun_payload jsonb,
    CHECK ((state = 'claimed') = (claim_token IS NOT NULL AND claimed_until IS NOT NULL))
);
CREATE UNIQUE INDEX work_queue_kind_key ON {schema}.work_queue (kind, key);
CREATE INDEX work_queue_ready ON {schema}.work_queue (kind, run_at, id) WHERE state = 'ready';
CREATE INDEX work_queue_claimed ON {schema}.work_queue (claimed_until, id) WHERE state = 'claimed';

-- The last sequence number given out per key. Upserting it in the publishing transaction makes writers of one key
-- wait for each other, so sequence numbers follow commit order.
CREATE TABLE {schema}.outbox_keys (
    key text PRIMARY KEY,
    last_seq bigint NOT NULL
);

-- Undelivered events only: ack deletes a row (outbox_keys keeps the numbering going).
CREATE TABLE {schema}.outbox (
    id bigserial PRIMARY KEY,
    type text NOT NULL,
    key text NOT NULL,
    seq bigint NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now(),
    claim_token text,
    claimed_by text,
    claimed_until timestamptz,
    UNIQUE (key, seq)
);

CREATE TABLE {schema}.idempotency_keys (
    identity text NOT NULL,
    key text NOT NULL,
    request_hash text NOT NULL,
    state text NOT NULL CHECK (state IN ('in_progress', 'done')),
    result jsonb,
    attempt text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (identity, key)
);
CREATE INDEX idempotency_keys_expires_at ON {schema}.idempotency_keys (expires_at);

CREATE TABLE {schema}.audit (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    action text NOT NULL,
    actor text NOT NULL,
    tenant text,
    resource_type text NOT NULL,
    resource_id text,
    decision_id text,
    outcome text NOT NULL,
    details jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_at ON {schema}.audit (at);
CREATE INDEX audit_resource ON {schema}.audit (resource_type, resource_id, at);

-- The authorization projection: which tenant, pool and owner each resource belongs to, written by modules in the
-- transaction that creates the resource and read by IAM for resource-scoped decisions.
CREATE TABLE {schema}.authz_resources (
    resource_type text NOT NULL,
    resource_id text NOT NULL,
    tenant_id text NOT NULL,
    pool_id text,
    owner text,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource_type, resource_id)
);
CREATE INDEX authz_resources_tenant ON {schema}.authz_resources (tenant_id);

-- Worker membership: one row per (role, worker id), live while unexpired; shard ownership is computed from it.
CREATE TABLE {schema}.workers (
    role text NOT NULL,
    id text NOT NULL,
    instance text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (role, id)
);
CREATE INDEX workers_expires_at ON {schema}.workers (role, expires_at);

-- Workflows: one row per workflow (its current step, attempts, reason, data and wait) and its step log. The engine
-- locks the row and writes progress in the transaction that holds the step's own writes.
CREATE TABLE {schema}.workflows (
    id text PRIMARY KEY,
    type text NOT NULL,
    tenant text NOT NULL,
    subject text NOT NULL DEFAULT '',
    state text NOT NULL
        CHECK (state IN ('running', 'waiting', 'succeeded', 'failed', 'cancelling', 'cancelled')),
    step_index integer NOT NULL DEFAULT 0,
    step text,
    attempt integer NOT NULL DEFAULT 1,
    completed integer NOT NULL DEFAULT 0,
    compensating boolean NOT NULL DEFAULT false,
    reason text,
    message text NOT NULL DEFAULT '',
    data jsonb NOT NULL DEFAULT '{}',
    inbox jsonb NOT NULL DEFAULT '{}',
    waiting_for text,
    on_timeout text CHECK (on_timeout IN ('fail', 'next')),
    wake_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workflows_tenant ON {schema}.workflows (tenant, created_at, id);
CREATE INDEX workflows_subject ON {schema}.workflows (subject, created_at);
CREATE INDEX workflows_active ON {schema}.workflows (state, updated_at)
    WHERE state IN ('running', 'waiting', 'cancelling');

CREATE TABLE {schema}.workflow_steps (
    id bigserial PRIMARY KEY,
    workflow_id text NOT NULL REFERENCES {schema}.workflows (id) ON DELETE CASCADE,
    step_index integer NOT NULL,
    step text NOT NULL,
    attempt integer NOT NULL,
    outcome text NOT NULL,
    reason text,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workflow_steps_workflow ON {schema}.workflow_steps (workflow_id, id);

-- Replay protection of sealed payloads: a nonce is remembered until its payload would be refused as expired anyway.
CREATE TABLE {schema}.replay_nonces (
    scope text NOT NULL,
    nonce bytea NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (scope, nonce)
);
CREATE INDEX replay_nonces_expires_at ON {schema}.replay_nonces (expires_at);
"""

MIGRATIONS: tuple[Migration, ...] = (Migration(version=1, name="runtime tables", sql=_V1),)
