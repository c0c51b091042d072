"""Capacity version 4: a draft keeps the idempotency key its admission reserved."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATION"]

# A draft remembers the idempotency key its transaction 1 reserved, so that undoing a draft its process left behind
# (the drafts sweeper: the process stopped, or lost the database, between admission's two transactions) gives the
# key back too. Before, such a key stayed reserved for its whole 24 hours and every retry with it was answered
# UNAVAILABLE (found by tests/reliability: an api killed, or PostgreSQL restarted, mid-admission).
_V4 = r"""
ALTER TABLE {schema}.reservations ADD COLUMN draft_key jsonb;

CREATE OR REPLACE FUNCTION {schema}.bc_undo_draft(p_id text, p_identity text, p_key text) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE
    kept jsonb;
BEGIN
    DELETE FROM {schema}.reservations WHERE id = p_id AND state = 'draft' RETURNING draft_key INTO kept;
    DELETE FROM {schema}.authz_resources WHERE resource_type = 'reservation' AND resource_id = p_id;
    IF p_key IS NULL AND kept IS NOT NULL THEN
        p_identity := kept ->> 'identity';
        p_key := kept ->> 'key';
    END IF;
    IF p_key IS NOT NULL THEN
        DELETE FROM {schema}.idempotency_keys
        WHERE identity = p_identity AND key = p_key AND state = 'in_progress';
    END IF;
END
$f$;
"""

MIGRATION = Migration(version=4, name="drafts keep their idempotency key", sql=_V4)
