"""The ``commands`` module's tables: commands for daemons and daemon sessions.

Both refer to ``nodes``, a table of the ``identity`` module, which exists only where JoinService is on. The foreign
keys are therefore made by whichever of the two modules migrates second (``NODE_KEYS``): here when ``nodes`` is
already there, else by ``identity``'s first migration. Without ``identity`` no node exists, so no command or session
can either, and the tables stay empty.
"""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATIONS", "NODE_KEYS"]

NODE_KEYS = """
DO $$
BEGIN
    IF to_regclass('{schema}.nodes') IS NOT NULL AND to_regclass('{schema}.commands') IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conrelid = '{schema}.commands'::regclass AND conname = 'commands_node_id_fkey') THEN
            ALTER TABLE {schema}.commands ADD CONSTRAINT commands_node_id_fkey
                FOREIGN KEY (node_id) REFERENCES {schema}.nodes (id);
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conrelid = '{schema}.sessions'::regclass AND conname = 'sessions_node_id_fkey') THEN
            ALTER TABLE {schema}.sessions ADD CONSTRAINT sessions_node_id_fkey
                FOREIGN KEY (node_id) REFERENCES {schema}.nodes (id);
        END IF;
    END IF;
END $$;
"""
"""Add the foreign keys of ``commands`` and ``sessions`` to ``nodes`` once all three tables exist (idempotent)."""

# Commands (a deadline, what to do when the session they were sent on dies, the result) and sessions (one row per
# node: its latest epoch, the gateway holding it, when it was last seen).
_V1 = (
    """
CREATE TABLE {schema}.commands (
    id text PRIMARY KEY,
    node_id text NOT NULL,
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
    node_id text PRIMARY KEY,
    epoch bigint NOT NULL,
    gateway text NOT NULL,
    opened_at timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    closed_at timestamptz
);
"""
    + NODE_KEYS
)

# A node is announced unreachable once per session (``unreachable_at``); the sweep looks only at sessions not yet
# marked, by when they were last seen.
_V2 = """
ALTER TABLE {schema}.sessions ADD COLUMN unreachable_at timestamptz;
CREATE INDEX sessions_unmarked ON {schema}.sessions (last_seen_at) WHERE unreachable_at IS NULL;
"""

# A command may name a work item to enqueue when it ends (``wake_kind``/``wake_key``/``wake_shard``): the controller
# that asked for it learns of the result at once instead of polling for it.
_V3 = """
ALTER TABLE {schema}.commands ADD COLUMN wake_kind text, ADD COLUMN wake_key text, ADD COLUMN wake_shard integer,
    ADD CONSTRAINT commands_wake
        CHECK ((wake_kind IS NULL) = (wake_key IS NULL) AND (wake_kind IS NULL) = (wake_shard IS NULL));
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(version=1, name="commands and sessions", sql=_V1),
    Migration(version=2, name="unreachable nodes", sql=_V2),
    Migration(version=3, name="command wake-ups", sql=_V3),
)
