"""The rules for schema names, and the frozen migrations of the old single module ``"core"``.

Every table now belongs to the module that uses it (``modules/<name>/_migrations.py``). ``LEGACY_CORE_MIGRATIONS``
is kept only to bring a database that older code migrated part of the way up to the last ``"core"`` version, which
the modules' first versions adopt. Never change it: a database records these names and versions.
"""

from __future__ import annotations

import hashlib
import re

from bettercompute.errors import InvalidConfigError
from bettercompute.ports import Migration

__all__ = [
    "LEGACY_CORE_MIGRATIONS",
    "LEGACY_CORE_VERSION",
    "migration_lock_key",
    "quote_schema",
    "render",
    "validate_schema",
]

# Lower-case only, so the quoted name and the name PostgreSQL reports are the same string; 63 bytes is NAMEDATALEN-1.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def validate_schema(schema: str) -> str:
    """Return ``schema`` if it is a safe, lower-case PostgreSQL identifier.

    Raises:
        InvalidConfigError: The name is empty, too long, or has characters other than ``a-z``, ``0-9`` and ``_``.
    """
    if not _SCHEMA_NAME.fullmatch(schema) or schema.startswith("pg_"):
        raise InvalidConfigError(
            "the schema name must be a lower-case identifier of at most 63 characters, not starting with pg_",
            details={"problems": [{"path": "schema", "value": schema}]},
        )
    return schema


def quote_schema(schema: str) -> str:
    """The schema name as a quoted identifier (``validate_schema`` guarantees there is no quote inside)."""
    return f'"{validate_schema(schema)}"'


def render(sql: str, schema: str) -> str:
    """Replace ``{schema}`` in ``sql`` by the quoted schema name.

    Plain replacement rather than ``str.format`` because SQL is full of braces (``'{}'::jsonb``).
    """
    return sql.replace("{schema}", quote_schema(schema))


def migration_lock_key(schema: str) -> int:
    """The advisory lock key that serializes migrations of one schema across every process (a signed 64-bit int)."""
    digest = hashlib.sha256(f"bettercompute.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


_CORE_V1 = """
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
"""

# The authorization projection: which tenant, pool and owner each resource belongs to, written by modules in the
# transaction that creates the resource and read by IAM for resource-scoped decisions.
_CORE_V2 = """
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
"""

# Worker membership: one row per (role, worker id), live while unexpired; shard ownership is computed from it.
_CORE_V3 = """
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
"""

# Webhooks: subscriptions (the signing secret only as the KMS sealed it) and one delivery row per (subscription,
# event), kept after it ends as the subscription's delivery log.
_CORE_V4 = """
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
CREATE INDEX webhook_deliveries_due ON {schema}.webhook_deliveries (next_attempt_at, id) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_key ON {schema}.webhook_deliveries (subscription_id, event_key, id)
    WHERE status = 'pending';
CREATE INDEX webhook_deliveries_log ON {schema}.webhook_deliveries (subscription_id, id);
"""

# Workflows: one row per workflow (its current step, attempts, reason, data and wait) and its step log. The engine
# locks the row and writes progress in the transaction that holds the step's own writes.
_CORE_V5 = """
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
"""

# Pools (one name per tenant; the class and the acceptance checks a joining machine must pass) and their join
# tokens (only the SHA-256 of a token's secret; uses left, expiry, revocation, expected claims, the reclaim rule).
_CORE_V6 = """
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

# The node CA: its signing keys (the private key only as the KMS sealed it; one active key per trust domain), every
# certificate it issued, and revocations (by serial; a SPIFFE ID's revocation adds a row per certificate of it).
_CORE_V7 = """
CREATE TABLE {schema}.ca_keys (
    id text PRIMARY KEY,
    trust_domain text NOT NULL,
    algorithm text NOT NULL,
    sealed_key bytea NOT NULL,
    certificate_pem text NOT NULL,
    state text NOT NULL CHECK (state IN ('active', 'previous', 'retired')),
    not_after timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz
);
CREATE UNIQUE INDEX ca_keys_active ON {schema}.ca_keys (trust_domain) WHERE state = 'active';
CREATE INDEX ca_keys_trust_domain ON {schema}.ca_keys (trust_domain, created_at);

CREATE TABLE {schema}.certificates (
    serial text PRIMARY KEY,
    node_id text NOT NULL,
    spiffe_id text NOT NULL,
    role text NOT NULL CHECK (role IN ('node', 'site', 'ramdisk')),
    ca_key_id text NOT NULL REFERENCES {schema}.ca_keys (id),
    not_before timestamptz NOT NULL,
    not_after timestamptz NOT NULL,
    issued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX certificates_spiffe_id ON {schema}.certificates (spiffe_id, issued_at);
CREATE INDEX certificates_ca_key ON {schema}.certificates (ca_key_id, not_after);

CREATE TABLE {schema}.revocations (
    serial text PRIMARY KEY REFERENCES {schema}.certificates (serial),
    spiffe_id text NOT NULL,
    reason text NOT NULL,
    revoked_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX revocations_spiffe_id ON {schema}.revocations (spiffe_id, revoked_at);
"""

# Replay protection of sealed join payloads (a nonce is remembered until its payload would be refused as expired
# anyway), and the secrets of the ``secrets`` group (the value only as the KMS sealed it, bound to tenant and name).
_CORE_V8 = """
CREATE TABLE {schema}.replay_nonces (
    scope text NOT NULL,
    nonce bytea NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (scope, nonce)
);
CREATE INDEX replay_nonces_expires_at ON {schema}.replay_nonces (expires_at);

CREATE TABLE {schema}.secrets (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    name text NOT NULL,
    scope text NOT NULL CHECK (scope ~ '^(node|pool|site):.+$'),
    description text NOT NULL DEFAULT '',
    sealed_value bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, name)
);
CREATE INDEX secrets_name_scope ON {schema}.secrets (name, scope);
"""

# Nodes (a machine joined to a pool; at most one live node per hardware key in a pool, which is what reclaiming
# relies on), JoinService's X25519 keys (the private key only as the KMS sealed it; one active key), and the
# certified key's hash on each certificate (a renewal retried after a lost answer is recognised by it).
_CORE_V9 = """
CREATE TABLE {schema}.nodes (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    pool_id text NOT NULL REFERENCES {schema}.pools (id),
    site_id text,
    state text NOT NULL CHECK (state IN ('adopting', 'adopted', 'failed', 'retired')),
    hardware_key text NOT NULL,
    claims jsonb NOT NULL DEFAULT '{}',
    attestation jsonb NOT NULL DEFAULT '{}',
    join_token_id text,
    enrollments integer NOT NULL DEFAULT 1,
    session_epoch bigint NOT NULL DEFAULT 0,
    desired_generation bigint NOT NULL DEFAULT 0,
    observed_generation bigint NOT NULL DEFAULT 0,
    last_seen_at timestamptz,
    joined_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz,
    CHECK ((state = 'retired') = (retired_at IS NOT NULL))
);
CREATE UNIQUE INDEX nodes_live_hardware ON {schema}.nodes (pool_id, hardware_key) WHERE state <> 'retired';
CREATE INDEX nodes_pool ON {schema}.nodes (pool_id, created_at);

CREATE TABLE {schema}.join_keys (
    id text PRIMARY KEY,
    public_key text NOT NULL,
    sealed_key bytea NOT NULL,
    state text NOT NULL CHECK (state IN ('active', 'previous')),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX join_keys_active ON {schema}.join_keys ((true)) WHERE state = 'active';

ALTER TABLE {schema}.certificates ADD COLUMN key_sha256 text;
"""

# Commands for daemons (a deadline, what to do when the session they were sent on dies, the result) and daemon
# sessions (one row per node: its latest epoch, the gateway holding it, when it was last seen).
_CORE_V10 = """
CREATE TABLE {schema}.commands (
    id text PRIMARY KEY,
    node_id text NOT NULL REFERENCES {schema}.nodes (id),
    tenant text NOT NULL,
    kind text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    state text NOT NULL
        CHECK (state IN ('pending', 'dispatched', 'succeeded', 'failed', 'expired', 'cancelled')),
    on_session_loss text NOT NULL CHECK (on_session_loss IN ('redispatch', 'fail')),
    deadline timestamptz NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 100),
    session_epoch bigint,
    dispatched_at timestamptz,
    result jsonb,
    reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    CHECK (state <> 'dispatched' OR session_epoch IS NOT NULL)
);
CREATE INDEX commands_open_deadline ON {schema}.commands (deadline) WHERE state IN ('pending', 'dispatched');
CREATE INDEX commands_pending ON {schema}.commands (node_id, created_at) WHERE state = 'pending';
CREATE INDEX commands_dispatched ON {schema}.commands (dispatched_at) WHERE state = 'dispatched';

CREATE TABLE {schema}.sessions (
    node_id text PRIMARY KEY REFERENCES {schema}.nodes (id),
    epoch bigint NOT NULL,
    gateway text NOT NULL,
    opened_at timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    closed_at timestamptz
);
"""

# Bookings of atoms by reservations, which PostgreSQL itself keeps from overlapping (an exclusion constraint; the
# btree_gist extension, shipped with the server, gives gist the text equality), and usage records per tenant, pool
# and period with the watermark of the periods accounted so far.
_CORE_V11 = """
DO $$ BEGIN
    CREATE EXTENSION IF NOT EXISTS btree_gist;
EXCEPTION WHEN unique_violation THEN NULL;  -- another schema's migration created it at the same moment
END $$;

CREATE TABLE {schema}.bookings (
    id bigserial PRIMARY KEY,
    atom_id text NOT NULL,
    reservation_id text NOT NULL,
    tenant text NOT NULL,
    pool_id text NOT NULL,
    gpus numeric(9, 6) NOT NULL DEFAULT 0 CHECK (gpus >= 0 AND gpus <= 1),
    during tstzrange NOT NULL CHECK (NOT isempty(during) AND NOT lower_inf(during)),
    EXCLUDE USING gist (atom_id WITH =, during WITH &&)
);
CREATE INDEX bookings_reservation ON {schema}.bookings (reservation_id);
CREATE INDEX bookings_during ON {schema}.bookings USING gist (during);

CREATE TABLE {schema}.usage_records (
    tenant text NOT NULL,
    pool_id text NOT NULL,
    period_start timestamptz NOT NULL,
    period_end timestamptz NOT NULL,
    gpu_seconds numeric(20, 3) NOT NULL,
    computed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, period_start, pool_id)
);
CREATE INDEX usage_records_period ON {schema}.usage_records (period_start);

CREATE TABLE {schema}.usage_state (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    accounted_until timestamptz NOT NULL
);
"""

# Indexes for reading in the order the reads want, so each stops early. The fair webhook claim takes each
# subscription's first due heads; the global due index it replaces let the planner walk every pending row of every
# tenant once per subscription (one tenant's large backlog then made every claim of every tenant take seconds). The
# paged lists walk a tenant's pools and nodes by (created_at, id).
_CORE_V12 = """
DROP INDEX {schema}.webhook_deliveries_due;
CREATE INDEX webhook_deliveries_heads ON {schema}.webhook_deliveries (subscription_id, next_attempt_at, id)
    WHERE status = 'pending';
CREATE INDEX pools_tenant_page ON {schema}.pools (tenant, created_at, id);
CREATE INDEX nodes_tenant_page ON {schema}.nodes (tenant, created_at, id);
"""

LEGACY_CORE_MIGRATIONS: tuple[Migration, ...] = (
    Migration(version=1, name="core tables", sql=_CORE_V1),
    Migration(version=2, name="authorization projection", sql=_CORE_V2),
    Migration(version=3, name="worker membership", sql=_CORE_V3),
    Migration(version=4, name="webhooks", sql=_CORE_V4),
    Migration(version=5, name="workflows", sql=_CORE_V5),
    Migration(version=6, name="pools and join tokens", sql=_CORE_V6),
    Migration(version=7, name="node certificate authority", sql=_CORE_V7),
    Migration(version=8, name="join nonces and secrets", sql=_CORE_V8),
    Migration(version=9, name="nodes and join keys", sql=_CORE_V9),
    Migration(version=10, name="commands and sessions", sql=_CORE_V10),
    Migration(version=11, name="bookings and usage", sql=_CORE_V11),
    Migration(version=12, name="claim and paging indexes", sql=_CORE_V12),
)
"""The old migrations of module ``"core"``, frozen: run only on a database where ``"core"`` is recorded already."""

LEGACY_CORE_VERSION = LEGACY_CORE_MIGRATIONS[-1].version
"""The last ``"core"`` version: each module's first migration adopts ``("core", LEGACY_CORE_VERSION)``."""
