"""The ``audit`` module's migrations: the runtime's ``audit`` table made append-only, the position each row is
linked in, and the table of hash-chain links."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATIONS"]

# txid: the id of the transaction that wrote the row (pg_current_xact_id as a bigint). Rows are linked in (txid, id)
# order, and only once txid is below the oldest transaction still running: no row can then appear before them.
# Rows written before this migration all get 0 (linked first, by id); the constant default rewrites nothing.
#
# Append-only: a trigger refuses UPDATE, DELETE and TRUNCATE on both tables, whoever asks. A superuser can still
# disable it (session_replication_role = replica); the chain is what shows that afterwards.
_V1 = """
ALTER TABLE {schema}.audit ADD COLUMN txid bigint NOT NULL DEFAULT 0;
ALTER TABLE {schema}.audit ALTER COLUMN txid SET DEFAULT CAST(CAST(pg_current_xact_id() AS text) AS bigint);
CREATE INDEX audit_linking ON {schema}.audit (txid, id);
CREATE INDEX audit_tenant ON {schema}.audit (tenant, id);

-- One link per audit row: row audit_id is number seq of its tenant's chain ('' for rows of no tenant), and hash is
-- SHA-256 over the previous link's hash and the row (bettercompute.modules.audit.link_hash). No foreign key: a row
-- removed behind the trigger's back must leave its link behind, for audit.verify to find.
CREATE TABLE {schema}.audit_chain (
    chain text NOT NULL,
    seq bigint NOT NULL CHECK (seq > 0),
    audit_id bigint NOT NULL UNIQUE,
    hash bytea NOT NULL CHECK (length(hash) = 32),
    audit_txid bigint NOT NULL,
    linked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain, seq)
);
CREATE INDEX audit_chain_position ON {schema}.audit_chain (audit_txid, audit_id);

CREATE FUNCTION {schema}.bc_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'table % is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON {schema}.audit
    FOR EACH ROW EXECUTE FUNCTION {schema}.bc_append_only();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON {schema}.audit
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.bc_append_only();
CREATE TRIGGER audit_chain_append_only BEFORE UPDATE OR DELETE ON {schema}.audit_chain
    FOR EACH ROW EXECUTE FUNCTION {schema}.bc_append_only();
CREATE TRIGGER audit_chain_no_truncate BEFORE TRUNCATE ON {schema}.audit_chain
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.bc_append_only();
"""

MIGRATIONS: tuple[Migration, ...] = (Migration(version=1, name="append-only audit and its hash chain", sql=_V1),)
