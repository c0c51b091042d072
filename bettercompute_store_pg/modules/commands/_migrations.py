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

# The gateway's door (``bettercompute.modules.commands.EDGE``): functions that run as their owner, so that a gateway's
# database role needs EXECUTE on them and no grant on any table (``PgStore.grant_roles``). Each pins its search_path
# and names every table by its schema. The two helpers that publish and enqueue are not granted to the gateway: event
# types and work kinds are fixed here, not chosen by the caller. A shard comes from the caller (the blake2b of the key,
# which PostgreSQL cannot compute): a lying gateway can only misroute, so delay, the work of a node it reports on.
_V4 = """
SET LOCAL check_function_bodies = off;

CREATE FUNCTION {schema}.bc_gw_publish(p_type text, p_key text, p_payload jsonb) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE v_seq bigint;
BEGIN
    INSERT INTO {schema}.outbox_keys AS k (key, last_seq) VALUES (p_key, 1)
    ON CONFLICT (key) DO UPDATE SET last_seq = k.last_seq + 1
    RETURNING k.last_seq INTO v_seq;
    INSERT INTO {schema}.outbox (type, key, seq, payload) VALUES (p_type, p_key, v_seq, p_payload);
END $$;

CREATE FUNCTION {schema}.bc_gw_enqueue(p_kind text, p_key text, p_shard integer) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO {schema}.work_queue AS q (kind, key, shard, payload, run_at)
    VALUES (p_kind, p_key, p_shard, '{}', now())
    ON CONFLICT (kind, key) DO UPDATE SET
        shard = EXCLUDED.shard,
        run_at = CASE WHEN q.state = 'ready' THEN LEAST(q.run_at, EXCLUDED.run_at) ELSE q.run_at END,
        payload = CASE WHEN q.state = 'ready' THEN EXCLUDED.payload ELSE q.payload END,
        rerun_at = CASE WHEN q.state = 'claimed' THEN LEAST(q.rerun_at, EXCLUDED.run_at) END,
        rerun_payload = CASE WHEN q.state = 'claimed' THEN EXCLUDED.payload END;
END $$;

CREATE FUNCTION {schema}.bc_gw_session_open(p_node_id text, p_gateway text, p_shard integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE v_epoch bigint;
BEGIN
    UPDATE {schema}.nodes SET session_epoch = session_epoch + 1, last_seen_at = now(), updated_at = now()
    WHERE id = p_node_id AND state <> 'retired'
    RETURNING session_epoch INTO v_epoch;
    IF v_epoch IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO {schema}.sessions AS s (node_id, epoch, gateway, opened_at, last_seen_at, closed_at)
    VALUES (p_node_id, v_epoch, p_gateway, now(), now(), NULL)
    ON CONFLICT (node_id) DO UPDATE SET epoch = EXCLUDED.epoch, gateway = EXCLUDED.gateway,
        opened_at = EXCLUDED.opened_at, last_seen_at = EXCLUDED.last_seen_at, closed_at = NULL, unreachable_at = NULL;
    PERFORM {schema}.bc_gw_publish('node.session_opened', p_node_id,
        jsonb_build_object('node_id', p_node_id, 'epoch', v_epoch, 'gateway', p_gateway));
    PERFORM {schema}.bc_gw_enqueue('node-lifecycle', p_node_id, p_shard);
    RETURN v_epoch;
END $$;

CREATE FUNCTION {schema}.bc_gw_session_close(
    p_node_id text, p_epoch bigint, p_gateway text, p_reason text, p_shard integer
) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE v_current boolean;
BEGIN
    IF p_reason !~ '^[a-z][a-z_]{0,31}$' THEN
        RAISE EXCEPTION 'a session closes for a reason in lower case' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE {schema}.sessions SET closed_at = now()
    WHERE node_id = p_node_id AND epoch = p_epoch AND gateway = p_gateway AND closed_at IS NULL;
    v_current := FOUND;
    IF v_current OR (p_reason = 'superseded'
                     AND EXISTS (SELECT 1 FROM {schema}.nodes WHERE id = p_node_id AND session_epoch > p_epoch)) THEN
        PERFORM {schema}.bc_gw_publish('node.session_closed', p_node_id, jsonb_build_object(
            'node_id', p_node_id, 'epoch', p_epoch, 'gateway', p_gateway, 'reason', p_reason));
    END IF;
    IF v_current THEN
        PERFORM {schema}.bc_gw_enqueue('node-lifecycle', p_node_id, p_shard);
    END IF;
    RETURN v_current;
END $$;

CREATE FUNCTION {schema}.bc_gw_seen(p_node_ids text[], p_epochs bigint[], p_gateway text) RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
WITH alive AS (
    SELECT * FROM unnest(p_node_ids, p_epochs) AS a (node_id, epoch)
),
touched AS (
    UPDATE {schema}.sessions AS s SET last_seen_at = now()
    FROM alive WHERE s.node_id = alive.node_id AND s.epoch = alive.epoch AND s.gateway = p_gateway
      AND s.closed_at IS NULL
    RETURNING s.node_id
)
UPDATE {schema}.nodes AS n SET last_seen_at = now() FROM touched WHERE n.id = touched.node_id
RETURNING n.id
$$;

CREATE FUNCTION {schema}.bc_gw_observe(p_node_ids text[], p_generations bigint[], p_shards integer[])
RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE v_moved record;
BEGIN
    FOR v_moved IN
        UPDATE {schema}.nodes AS n SET observed_generation = a.generation, updated_at = now()
        FROM unnest(p_node_ids, p_generations, p_shards) AS a (node_id, generation, shard)
        WHERE n.id = a.node_id AND a.generation > n.observed_generation AND a.generation <= n.desired_generation
        RETURNING n.id, a.shard
    LOOP
        PERFORM {schema}.bc_gw_enqueue('desired-acked', v_moved.id, v_moved.shard);
        RETURN NEXT v_moved.id;
    END LOOP;
END $$;

CREATE FUNCTION {schema}.bc_gw_inventory(
    p_node_id text, p_section text, p_content jsonb, p_fake boolean, p_shard integer
) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_section !~ '^[a-z][a-z0-9_]{0,31}$' THEN
        RAISE EXCEPTION 'an inventory section has a lower-case name' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO {schema}.node_inventory AS i (node_id, section, content, fake, received_at)
    SELECT id, p_section, p_content, p_fake, now() FROM {schema}.nodes WHERE id = p_node_id AND state <> 'retired'
    ON CONFLICT (node_id, section) DO UPDATE
        SET content = EXCLUDED.content, fake = EXCLUDED.fake, received_at = EXCLUDED.received_at;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM {schema}.bc_gw_publish('node.inventory_reported', p_node_id,
        jsonb_build_object('node_id', p_node_id, 'section', p_section, 'fake', p_fake));
    PERFORM {schema}.bc_gw_enqueue('inventory', p_node_id, p_shard);
    RETURN true;
END $$;

CREATE FUNCTION {schema}.bc_gw_event(p_node_id text, p_type text, p_payload jsonb, p_at_ms bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_type !~ '^[a-z][a-z0-9_-]*(\\.[a-z][a-z0-9_-]*)*$' OR length(p_type) > 128
       OR jsonb_typeof(p_payload) <> 'object' THEN
        RAISE EXCEPTION 'a node event has a dotted lower-case type and an object payload'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {schema}.nodes WHERE id = p_node_id AND state <> 'retired') THEN
        RETURN false;
    END IF;
    PERFORM {schema}.bc_gw_publish('node.reported', p_node_id, jsonb_build_object(
        'node_id', p_node_id, 'type', p_type, 'payload', p_payload, 'at_ms', p_at_ms));
    RETURN true;
END $$;

CREATE FUNCTION {schema}.bc_gw_dispatch(p_node_ids text[], p_epochs bigint[], p_limit integer)
RETURNS SETOF {schema}.commands
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
WITH s AS (
    SELECT a.node_id, a.epoch FROM unnest(p_node_ids, p_epochs) AS a (node_id, epoch)
    JOIN {schema}.sessions AS live ON live.node_id = a.node_id AND live.epoch = a.epoch AND live.closed_at IS NULL
),
picked AS (
    SELECT p.id, s.epoch FROM s CROSS JOIN LATERAL (
        SELECT id FROM {schema}.commands
        WHERE node_id = s.node_id AND state = 'pending' AND deadline > now()
        ORDER BY created_at, id LIMIT least(p_limit, 64)
        FOR UPDATE SKIP LOCKED
    ) AS p
)
UPDATE {schema}.commands AS c SET state = 'dispatched', session_epoch = picked.epoch, dispatched_at = now(),
    attempts = c.attempts + 1, updated_at = now()
FROM picked WHERE c.id = picked.id
RETURNING c.*
$$;

CREATE FUNCTION {schema}.bc_gw_finish(p_id text, p_epoch bigint, p_state text, p_result jsonb, p_reason text)
RETURNS SETOF {schema}.commands
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE v_done {schema}.commands;
BEGIN
    IF p_state NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'a command finishes as succeeded or failed' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE {schema}.commands AS c SET state = p_state, result = p_result, reason = p_reason,
        finished_at = now(), updated_at = now()
    WHERE c.id = p_id AND c.state = 'dispatched' AND c.session_epoch = p_epoch
    RETURNING c.* INTO v_done;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_done.wake_kind IS NOT NULL THEN
        PERFORM {schema}.bc_gw_enqueue(v_done.wake_kind, v_done.wake_key, v_done.wake_shard);
    END IF;
    RETURN NEXT v_done;
END $$;

CREATE FUNCTION {schema}.bc_gw_desired_newer(p_node_ids text[], p_generations bigint[], p_gateway text)
RETURNS TABLE (id text, desired_generation bigint, desired_state jsonb)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT n.id, n.desired_generation, n.desired_state
FROM unnest(p_node_ids, p_generations) AS k (node_id, generation)
JOIN {schema}.sessions AS s ON s.node_id = k.node_id AND s.gateway = p_gateway AND s.closed_at IS NULL
JOIN {schema}.nodes AS n ON n.id = k.node_id
WHERE n.desired_generation > k.generation
$$;

CREATE FUNCTION {schema}.bc_gw_desired_since(p_since timestamptz, p_gateway text)
RETURNS TABLE (at timestamptz, id text, desired_generation bigint, desired_state jsonb)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT t.at, n.id, n.desired_generation, n.desired_state
FROM (SELECT clock_timestamp() AS at) AS t
LEFT JOIN ({schema}.nodes AS n JOIN {schema}.sessions AS s
           ON s.node_id = n.id AND s.gateway = p_gateway AND s.closed_at IS NULL)
    ON n.desired_at > p_since
$$;

CREATE FUNCTION {schema}.bc_gw_revoked(p_serials text[]) RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT serial FROM {schema}.revocations WHERE serial = ANY(p_serials)
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
"""

# A command's result as the node signed it: the exact JSON text, the signature, the serial of the certificate it was
# signed under and that certificate's key, so that whoever uses the result checks it (``fact_refusal``), now or later.
# ``result`` is parsed from that text in the function, so it cannot say anything the signed text does not.
_V5 = """
SET LOCAL check_function_bodies = off;

ALTER TABLE {schema}.commands
    ADD COLUMN result_json text,
    ADD COLUMN signature bytea,
    ADD COLUMN signer_serial text,
    ADD COLUMN signer_key bytea;

DROP FUNCTION {schema}.bc_gw_finish(text, bigint, text, jsonb, text);

CREATE FUNCTION {schema}.bc_gw_finish(
    p_id text, p_epoch bigint, p_state text, p_result_json text, p_reason text,
    p_signature bytea, p_serial text, p_key bytea
) RETURNS SETOF {schema}.commands
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE v_done {schema}.commands;
BEGIN
    IF p_state NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'a command finishes as succeeded or failed' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE {schema}.commands AS c SET state = p_state, result = CAST(p_result_json AS jsonb),
        result_json = p_result_json, reason = p_reason, signature = p_signature, signer_serial = p_serial,
        signer_key = p_key, finished_at = now(), updated_at = now()
    WHERE c.id = p_id AND c.state = 'dispatched' AND c.session_epoch = p_epoch
    RETURNING c.* INTO v_done;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_done.wake_kind IS NOT NULL THEN
        PERFORM {schema}.bc_gw_enqueue(v_done.wake_kind, v_done.wake_key, v_done.wake_shard);
    END IF;
    RETURN NEXT v_done;
END $$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
"""

# An inventory section is kept as the node signed it, unchecked until the inventory controller checks it (the columns
# are the nodes module's tenth migration); ``content`` is parsed from the signed text.
_V6 = """
SET LOCAL check_function_bodies = off;

DROP FUNCTION {schema}.bc_gw_inventory(text, text, jsonb, boolean, integer);

CREATE FUNCTION {schema}.bc_gw_inventory(
    p_node_id text, p_section text, p_content_json text, p_fake boolean, p_epoch bigint,
    p_signature bytea, p_serial text, p_key bytea, p_shard integer
) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_section !~ '^[a-z][a-z0-9_]{0,31}$' THEN
        RAISE EXCEPTION 'an inventory section has a lower-case name' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO {schema}.node_inventory AS i (node_id, section, content, fake, received_at, content_json, epoch,
        signature, signer_serial, signer_key, checked)
    SELECT id, p_section, CAST(p_content_json AS jsonb), p_fake, now(), p_content_json, p_epoch, p_signature,
        p_serial, p_key, NULL
    FROM {schema}.nodes WHERE id = p_node_id AND state <> 'retired'
    ON CONFLICT (node_id, section) DO UPDATE
        SET content = EXCLUDED.content, fake = EXCLUDED.fake, received_at = EXCLUDED.received_at,
            content_json = EXCLUDED.content_json, epoch = EXCLUDED.epoch, signature = EXCLUDED.signature,
            signer_serial = EXCLUDED.signer_serial, signer_key = EXCLUDED.signer_key, checked = NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM {schema}.bc_gw_publish('node.inventory_reported', p_node_id,
        jsonb_build_object('node_id', p_node_id, 'section', p_section, 'fake', p_fake));
    PERFORM {schema}.bc_gw_enqueue('inventory', p_node_id, p_shard);
    RETURN true;
END $$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
"""

# An acknowledgement is kept as the node signed it, unchecked until the acknowledgement's controller checks it (the
# columns are the nodes module's eleventh migration). One of the generation kept replaces it while that one is not
# known good, so a forged acknowledgement delays the node's own rather than blocking it.
_V7 = """
SET LOCAL check_function_bodies = off;

DROP FUNCTION {schema}.bc_gw_observe(text[], bigint[], integer[]);

CREATE FUNCTION {schema}.bc_gw_observe(
    p_node_ids text[], p_generations bigint[], p_epochs bigint[], p_signatures bytea[], p_serials text[],
    p_keys bytea[], p_shards integer[]
) RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE v_moved record;
BEGIN
    FOR v_moved IN
        UPDATE {schema}.nodes AS n SET observed_generation = a.generation, observed_epoch = a.epoch,
            observed_signature = a.signature, observed_serial = a.serial, observed_key = a.key,
            observed_checked = NULL, updated_at = now()
        FROM unnest(p_node_ids, p_generations, p_epochs, p_signatures, p_serials, p_keys, p_shards)
            AS a (node_id, generation, epoch, signature, serial, key, shard)
        WHERE n.id = a.node_id AND a.generation <= n.desired_generation
          AND (a.generation > n.observed_generation
               -- the same generation again, while the one kept is not known good: a refused (forged) one must not
               -- stand in the way of the node's own
               OR (a.generation = n.observed_generation AND n.observed_checked IS DISTINCT FROM 'ok'))
        RETURNING n.id, a.shard
    LOOP
        PERFORM {schema}.bc_gw_enqueue('desired-acked', v_moved.id, v_moved.shard);
        RETURN NEXT v_moved.id;
    END LOOP;
END $$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
"""


# A command as the control plane signed it (the arguments' exact text, the signature, the signing key's id), the
# desired-state reads giving the same for a desired state, and the certificates of the signing keys not retired (a
# gateway sends one beside each signature; they are public).
_V8 = """
SET LOCAL check_function_bodies = off;

ALTER TABLE {schema}.commands
    ADD COLUMN arguments_json text,
    ADD COLUMN instruction_signature bytea,
    ADD COLUMN instruction_signer text;

DROP FUNCTION {schema}.bc_gw_desired_newer(text[], bigint[], text);
DROP FUNCTION {schema}.bc_gw_desired_since(timestamptz, text);

CREATE FUNCTION {schema}.bc_gw_desired_newer(p_node_ids text[], p_generations bigint[], p_gateway text)
RETURNS TABLE (id text, desired_generation bigint, desired_state jsonb, desired_text text, desired_signature bytea,
    desired_signer text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT n.id, n.desired_generation, n.desired_state, n.desired_text, n.desired_signature, n.desired_signer
FROM unnest(p_node_ids, p_generations) AS k (node_id, generation)
JOIN {schema}.sessions AS s ON s.node_id = k.node_id AND s.gateway = p_gateway AND s.closed_at IS NULL
JOIN {schema}.nodes AS n ON n.id = k.node_id
WHERE n.desired_generation > k.generation
$$;

CREATE FUNCTION {schema}.bc_gw_desired_since(p_since timestamptz, p_gateway text)
RETURNS TABLE (at timestamptz, id text, desired_generation bigint, desired_state jsonb, desired_text text,
    desired_signature bytea, desired_signer text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT t.at, n.id, n.desired_generation, n.desired_state, n.desired_text, n.desired_signature, n.desired_signer
FROM (SELECT clock_timestamp() AS at) AS t
LEFT JOIN ({schema}.nodes AS n JOIN {schema}.sessions AS s
           ON s.node_id = n.id AND s.gateway = p_gateway AND s.closed_at IS NULL)
    ON n.desired_at > p_since
$$;

CREATE FUNCTION {schema}.bc_gw_signers()
RETURNS TABLE (id text, certificate_der bytea)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT id, certificate_der FROM {schema}.signing_keys WHERE state <> 'retired'
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(version=1, name="commands and sessions", sql=_V1),
    Migration(version=2, name="unreachable nodes", sql=_V2),
    Migration(version=3, name="command wake-ups", sql=_V3),
    Migration(version=4, name="the gateway's functions", sql=_V4),
    Migration(version=5, name="signed command results", sql=_V5),
    Migration(version=6, name="signed inventory sections", sql=_V6),
    Migration(version=7, name="signed acknowledgements", sql=_V7),
    Migration(version=8, name="signed instructions", sql=_V8),
)
