"""The ``nodes`` module's tables: nodes, node identity (JoinService and the node CA), and the inventory's devices,
conditions and atoms, which hang off ``nodes`` (the ``inventory`` module's own later changes are its migrations).

The module was called ``identity`` before: ``FORMERLY`` names that, and the runner carries the versions recorded
under the old name over to this one, so a database migrated by older code is not migrated again.

``nodes`` refers to ``pools``: the core migrates the built-in modules in a fixed order, ``pools`` before ``nodes``.
The foreign keys of ``commands`` and ``sessions`` to ``nodes`` are made here when those tables exist already (see
``commands._migrations``).
"""

from __future__ import annotations

from bettercompute.ports import Migration

from ..commands import NODE_KEYS

__all__ = ["FORMERLY", "MIGRATIONS"]

FORMERLY = ("identity",)
"""The names this module's migrations were recorded under before."""

# The node CA: its signing keys (the private key only as the KMS sealed it; one active key per trust domain), every
# certificate it issued (with the certified key's hash, so a renewal retried after a lost answer is recognised), and
# revocations (by serial; a SPIFFE ID's revocation adds a row per certificate of it). Nodes (a machine joined to a
# pool; at most one live node per hardware key in a pool, which is what reclaiming relies on), and JoinService's
# X25519 keys (the private key only as the KMS sealed it; one active key).
_V1 = (
    """
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
    issued_at timestamptz NOT NULL DEFAULT now(),
    key_sha256 text
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
CREATE INDEX nodes_tenant_page ON {schema}.nodes (tenant, created_at, id);

CREATE TABLE {schema}.join_keys (
    id text PRIMARY KEY,
    public_key text NOT NULL,
    sealed_key bytea NOT NULL,
    state text NOT NULL CHECK (state IN ('active', 'previous')),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX join_keys_active ON {schema}.join_keys ((true)) WHERE state = 'active';
"""
    + NODE_KEYS
)

# The CA also issues the gateways' server certificates (role ``gateway``), recorded like the others.
_V2 = """
ALTER TABLE {schema}.certificates DROP CONSTRAINT certificates_role_check,
    ADD CONSTRAINT certificates_role_check CHECK (role IN ('node', 'site', 'ramdisk', 'gateway'));
"""

# A node's desired state (its generation was there from the start) and when it last changed, which gateways read
# changes by.
_V3 = """
ALTER TABLE {schema}.nodes ADD COLUMN desired_state jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN desired_at timestamptz;
CREATE INDEX nodes_desired_at ON {schema}.nodes (desired_at) WHERE desired_at IS NOT NULL;
"""

# The latest content of each inventory section a node reported, as its daemon sent it.
_V4 = """
CREATE TABLE {schema}.node_inventory (
    node_id text NOT NULL REFERENCES {schema}.nodes (id),
    section text NOT NULL,
    content jsonb NOT NULL,
    fake boolean NOT NULL,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (node_id, section)
);
"""

# The node lifecycle and what the inventory controller derives (the ``inventory`` module keeps its records here, next
# to the nodes they hang off): a node may be ``quarantined`` (with a machine-readable reason and the failing check's
# output) or ``unreachable``; it may be cordoned or draining; ``acceptance`` is the current round of acceptance
# checks. Devices (GPUs, NICs, disks) are kept when they disappear (``missing``); a GPU UUID is present on one node
# at most (another node claiming it gets a ``conflict`` device). Conditions are one row per node and type. Atoms, the
# unit of capacity (a whole GPU, or a MIG slice), are never deleted: what was booked on one stays findable.
_V5 = """
ALTER TABLE {schema}.nodes DROP CONSTRAINT nodes_state_check,
    ADD CONSTRAINT nodes_state_check
        CHECK (state IN ('adopting', 'adopted', 'quarantined', 'unreachable', 'failed', 'retired')),
    ADD COLUMN state_reason text,
    ADD COLUMN state_detail jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN state_changed_at timestamptz,
    ADD COLUMN cordoned boolean NOT NULL DEFAULT false,
    ADD COLUMN draining boolean NOT NULL DEFAULT false,
    ADD COLUMN acceptance jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN unreachable_since timestamptz;

CREATE TABLE {schema}.devices (
    id text PRIMARY KEY,
    node_id text NOT NULL REFERENCES {schema}.nodes (id),
    tenant text NOT NULL,
    pool_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('gpu', 'nic', 'disk')),
    ident text NOT NULL,
    slot text,
    model text,
    details jsonb NOT NULL DEFAULT '{}',
    state text NOT NULL CHECK (state IN ('present', 'missing', 'conflict')),
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    missing_since timestamptz,
    UNIQUE (node_id, kind, ident)
);
CREATE UNIQUE INDEX devices_gpu_present ON {schema}.devices (ident) WHERE kind = 'gpu' AND state = 'present';
CREATE INDEX devices_tenant_page ON {schema}.devices (tenant, node_id, kind, ident);

CREATE TABLE {schema}.node_conditions (
    node_id text NOT NULL REFERENCES {schema}.nodes (id),
    type text NOT NULL,
    status text NOT NULL CHECK (status IN ('True', 'False', 'Unknown')),
    reason text NOT NULL,
    message text NOT NULL,
    last_transition_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (node_id, type)
);

CREATE TABLE {schema}.atoms (
    id text PRIMARY KEY,
    node_id text NOT NULL REFERENCES {schema}.nodes (id),
    device_id text NOT NULL REFERENCES {schema}.devices (id),
    tenant text NOT NULL,
    pool_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('gpu', 'mig')),
    ident text NOT NULL,
    model text,
    profile text,
    memory_mib bigint,
    state text NOT NULL CHECK (state IN ('available', 'unavailable')),
    reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (node_id, ident)
);
CREATE INDEX atoms_pool_available ON {schema}.atoms (pool_id, model) WHERE state = 'available';
"""

# The placer walks a pool's available atoms node by node (``bc_place`` in the capacity module's migrations).
_V6 = """
CREATE INDEX atoms_pool_place ON {schema}.atoms (pool_id, node_id, ident) WHERE state = 'available';
"""

# The placer's hints follow the atoms: the capacity module's ``bc_placement_attach`` makes the triggers on ``atoms``
# that keep its hints, where its migrations ran first (they do wherever it is assembled; it is always on).
_V7 = """
DO $$ BEGIN
    IF to_regprocedure('{schema}.bc_placement_attach()') IS NOT NULL THEN
        PERFORM {schema}.bc_placement_attach();
    END IF;
END $$;
"""

# Tunnels (``docs/tunnels.md``): one row per tunnel, its ticket's hash, who opened it under which action on which
# resource, where it goes, and its life. The gateway's once-a-second check marks the open ones it carries
# (``checked_at``); the sweep closes those no gateway has checked for a while (a gateway that died) and the tickets
# never used, by the one partial index.
_V8 = """
CREATE TABLE {schema}.tunnels (
    id text PRIMARY KEY,
    secret_hash bytea NOT NULL,
    tenant text NOT NULL,
    principal_id text NOT NULL,
    credential_id text NOT NULL,
    identity jsonb NOT NULL DEFAULT '{}',
    node_id text NOT NULL REFERENCES {schema}.nodes (id),
    host text NOT NULL,
    port integer NOT NULL CHECK (port BETWEEN 1 AND 65535),
    resource_type text NOT NULL,
    resource_id text NOT NULL,
    action text NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    used_at timestamptz,
    closed_at timestamptz,
    close_reason text,
    bytes_up bigint NOT NULL DEFAULT 0,
    bytes_down bigint NOT NULL DEFAULT 0,
    checked_at timestamptz,
    CHECK ((closed_at IS NULL) = (close_reason IS NULL))
);
CREATE INDEX tunnels_open ON {schema}.tunnels (coalesce(checked_at, used_at, expires_at)) WHERE closed_at IS NULL;
"""

# The api process's internal listener, which gateway processes dial, has a certificate of its own role (``control``)
# so that no gateway certificate can stand in for it.
_V9 = """
ALTER TABLE {schema}.certificates DROP CONSTRAINT certificates_role_check,
    ADD CONSTRAINT certificates_role_check CHECK (role IN ('node', 'site', 'ramdisk', 'gateway', 'control'));
"""

# An inventory section as the node signed it (the exact JSON text, the epoch, the signature, the signer's serial and
# key) and what the inventory controller found when it checked it: NULL until checked, ``ok``, or why it was refused.
_V10 = """
ALTER TABLE {schema}.node_inventory
    ADD COLUMN content_json text,
    ADD COLUMN epoch bigint,
    ADD COLUMN signature bytea,
    ADD COLUMN signer_serial text,
    ADD COLUMN signer_key bytea,
    ADD COLUMN checked text;
"""

# The newest acknowledgement as the node signed it, and what the acknowledgement's controller found when it checked
# it: NULL until checked, ``ok``, or why it was refused (a binding waits for ``ok``).
_V11 = """
ALTER TABLE {schema}.nodes
    ADD COLUMN observed_epoch bigint,
    ADD COLUMN observed_signature bytea,
    ADD COLUMN observed_serial text,
    ADD COLUMN observed_key bytea,
    ADD COLUMN observed_checked text;
"""

# The keys the control plane signs instructions with (sealed by the KMS, with their certificate from the node CA), and
# a desired state as it was signed: the exact JSON text, the signature and the signing key's id.
_V12 = """
CREATE TABLE {schema}.signing_keys (
    id text PRIMARY KEY,
    trust_domain text NOT NULL,
    sealed_key bytea NOT NULL,
    certificate_der bytea NOT NULL,
    certificate_not_after timestamptz NOT NULL,
    state text NOT NULL CHECK (state IN ('active', 'previous', 'retired')),
    created_at timestamptz NOT NULL DEFAULT now(),
    previous_at timestamptz,
    retired_at timestamptz
);
CREATE UNIQUE INDEX signing_keys_active ON {schema}.signing_keys (trust_domain) WHERE state = 'active';

ALTER TABLE {schema}.nodes
    ADD COLUMN desired_text text,
    ADD COLUMN desired_signature bytea,
    ADD COLUMN desired_signer text;
CREATE INDEX nodes_desired_signer ON {schema}.nodes (desired_signer);
"""

# JoinService's key rotates with an overlap: the key before stays ``previous`` (it still opens tokens sealed to it)
# until ``retire_after``, then counts as retired; ``retired`` is also set at once by an operator.
_V13 = """
ALTER TABLE {schema}.join_keys ADD COLUMN retire_after timestamptz,
    DROP CONSTRAINT join_keys_state_check,
    ADD CONSTRAINT join_keys_state_check CHECK (state IN ('active', 'previous', 'retired'));
"""

# The node CA becomes a root and intermediates: a root (``issuer_id`` NULL, self-signed, long-lived) is what daemons
# pin, and it certifies the intermediates (``issuer_id`` its id) that sign every leaf; rotating the CA rotates an
# intermediate, so the pin survives. Keys made before were flat (a root that signed leaves itself, and could certify
# no intermediate): the active one becomes ``previous`` (still trusted until retired) and the next start makes a root
# and its first intermediate. One active root and one active intermediate per trust domain.
_V14 = """
ALTER TABLE {schema}.ca_keys ADD COLUMN issuer_id text REFERENCES {schema}.ca_keys (id);
UPDATE {schema}.ca_keys SET state = 'previous' WHERE state = 'active';
DROP INDEX {schema}.ca_keys_active;
CREATE UNIQUE INDEX ca_keys_active ON {schema}.ca_keys (trust_domain, (issuer_id IS NULL)) WHERE state = 'active';
"""

# A re-wrap of every KMS blob under the current key (``keys.rewrap``), walked column by column and resumable: where it
# is (``position`` in ``columns``, ``after`` the last key handled there) is kept after each batch.
_V15 = """
CREATE TABLE {schema}.kms_rewraps (
    id text PRIMARY KEY,
    state text NOT NULL CHECK (state IN ('running', 'done')),
    columns text[] NOT NULL,
    position integer NOT NULL DEFAULT 0,
    after text,
    resealed bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    failures jsonb NOT NULL DEFAULT '[]',
    created_by text,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE UNIQUE INDEX kms_rewraps_running ON {schema}.kms_rewraps ((true)) WHERE state = 'running';
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(version=1, name="node identity", sql=_V1),
    Migration(version=2, name="gateway certificates", sql=_V2),
    Migration(version=3, name="desired state", sql=_V3),
    Migration(version=4, name="inventory sections", sql=_V4),
    Migration(version=5, name="node lifecycle, devices, conditions and atoms", sql=_V5),
    Migration(version=6, name="the placer's index on atoms", sql=_V6),
    Migration(version=7, name="the placer's hints follow the atoms", sql=_V7),
    Migration(version=8, name="tunnels", sql=_V8),
    Migration(version=9, name="the internal listener's certificates", sql=_V9),
    Migration(version=10, name="signed inventory sections", sql=_V10),
    Migration(version=11, name="signed acknowledgements", sql=_V11),
    Migration(version=12, name="signed instructions", sql=_V12),
    Migration(version=13, name="JoinService key rotation", sql=_V13),
    Migration(version=14, name="a root CA with intermediates", sql=_V14),
    Migration(version=15, name="KMS re-wraps", sql=_V15),
)
