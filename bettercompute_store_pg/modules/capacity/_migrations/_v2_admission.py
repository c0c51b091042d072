"""Capacity version 2: reservations and admission's database functions."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATION"]

# Reservations and admission's two database functions (DESIGN §5, §12: transaction 2 is one call).
#
# ``reservations`` rows are drafts between admission's two transactions, then placed, bound, active and ended (or
# cancelled or failed); ``placement`` says where its atoms are and why; ``history`` lists every state entered.
# ``max_reservation_hours`` on a quota row is the longest reservation the row allows (the pool's default row: the
# pool's maximum). The tenant's bookings in a pool are found by a gist index, for the quota sums.
#
# ``bc_place`` picks atoms: candidates come from the partial index on available atoms in (pool, node, ident) order,
# a bounded window of them that grows only when too small; within it, one node by best fit (fewest free atoms that
# suffice), or the fewest nodes (largest first, the last by best fit), or an NVLink clique on one node.
# ``bc_admit_reservation`` is transaction 2: quota (under a per pool and tenant advisory lock, so two admissions cannot
# both pass a nearly full quota), placement (atoms locked SKIP LOCKED in a sub-block, so a competitor's pick is left to
# it; a booking a competitor committed meanwhile is an exclusion violation, and the placement runs again on a fresh
# snapshot), bookings, the state, the audit row with the decision id, the outbox event, the binding work item, the
# idempotency key pointing at the reservation, and the pokes (NOTIFY, sent at commit). A request that does not fit
# undoes its draft in the same transaction and says why: atoms left out per reason, and the earliest start within
# the horizon at which it would fit.
_V2 = r"""
ALTER TABLE {schema}.quotas ADD COLUMN max_reservation_hours integer
    CHECK (max_reservation_hours BETWEEN 1 AND 720);

CREATE TABLE {schema}.reservations (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    pool_id text NOT NULL REFERENCES {schema}.pools (id),
    state text NOT NULL
        CHECK (state IN ('draft', 'pending', 'placed', 'bound', 'active', 'ended', 'cancelled', 'failed')),
    gpus integer NOT NULL CHECK (gpus BETWEEN 1 AND 4096),
    constraints jsonb NOT NULL DEFAULT '{}',
    start_at timestamptz NOT NULL,
    end_at timestamptz NOT NULL,
    labels jsonb NOT NULL DEFAULT '{}',
    placement jsonb NOT NULL DEFAULT '{}',
    generations jsonb NOT NULL DEFAULT '{}',
    node_ids text[] NOT NULL DEFAULT '{}',
    reason text,
    history jsonb NOT NULL DEFAULT '[]',
    created_by text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CHECK (end_at > start_at)
);
CREATE INDEX reservations_tenant_page ON {schema}.reservations (tenant, created_at DESC, id DESC)
    WHERE state <> 'draft';
CREATE INDEX reservations_drafts ON {schema}.reservations (created_at) WHERE state = 'draft';
CREATE INDEX reservations_pending ON {schema}.reservations (pool_id, created_at, id) WHERE state = 'pending';
CREATE INDEX reservations_nodes ON {schema}.reservations USING gin (node_ids)
    WHERE state IN ('placed', 'bound', 'active');
CREATE INDEX bookings_tenant ON {schema}.bookings USING gist (pool_id, tenant, during);

-- The share of a GPU an atom is: a whole GPU 1, a MIG slice its compute slices out of 7.
CREATE FUNCTION {schema}.bc_share(p_profile text) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $f$
    SELECT CASE WHEN p_profile IS NULL THEN 1::numeric
        ELSE round(least(1, coalesce(substring(p_profile FROM '^([0-9]+)g')::numeric, 7) / 7), 6) END
$f$;

-- The first ``p_n`` items of a JSON array, and the items at the (0-based) positions ``p_idx``, in that order.
CREATE FUNCTION {schema}.bc_head(p_items jsonb, p_n integer) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
    SELECT coalesce(jsonb_agg(e ORDER BY o), '[]')
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS t(e, o) WHERE o <= p_n
$f$;

CREATE FUNCTION {schema}.bc_pick(p_items jsonb, p_idx integer[]) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
    SELECT coalesce(jsonb_agg(p_items -> i ORDER BY o), '[]') FROM unnest(p_idx) WITH ORDINALITY AS u(i, o)
$f$;

-- The largest set of atoms (indexes into the arrays) that are all NVLink peers of each other, greedily, up to need.
CREATE FUNCTION {schema}.bc_clique(p_idents jsonb, p_peers jsonb, p_need integer) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE AS $f$
DECLARE
    n integer := jsonb_array_length(p_idents);
    best integer[] := '{}';
    members integer[];
    ok boolean;
    m integer;
BEGIN
    FOR i IN 0 .. n - 1 LOOP
        members := ARRAY[i];
        FOR j IN 0 .. n - 1 LOOP
            EXIT WHEN cardinality(members) >= p_need;
            CONTINUE WHEN j = i;
            ok := true;
            FOREACH m IN ARRAY members LOOP
                IF NOT ((p_peers -> m) ? (p_idents ->> j) OR (p_peers -> j) ? (p_idents ->> m)) THEN
                    ok := false;
                    EXIT;
                END IF;
            END LOOP;
            IF ok THEN
                members := members || j;
            END IF;
        END LOOP;
        IF cardinality(members) > cardinality(best) THEN
            best := members;
        END IF;
        EXIT WHEN cardinality(best) >= p_need;
    END LOOP;
    RETURN best;
END
$f$;

CREATE FUNCTION {schema}.bc_place(
    p_pool text, p_gpus integer, p_model text, p_min_memory bigint, p_one_node boolean, p_nvlink boolean,
    p_profile text, p_window tstzrange, p_skip text[]
) RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    lim integer := greatest(64, p_gpus * 4);
    per jsonb;
    seen integer;
    node jsonb;
    chosen jsonb := '[]';
    remaining integer;
    k integer;
    take integer;
    idx integer[];
    rule text;
    total integer;
BEGIN
    LOOP
        SELECT coalesce(jsonb_agg(x ORDER BY x.n DESC, x.node_id DESC), '[]'), coalesce(sum(x.n), 0)::integer
        INTO per, seen
        FROM (
            SELECT c.node_id, count(*)::integer AS n,
                jsonb_agg(c.id ORDER BY c.ident) AS ids, jsonb_agg(c.ident ORDER BY c.ident) AS idents,
                jsonb_agg(c.peers ORDER BY c.ident) AS peers
            FROM (
                SELECT a.id, a.node_id, a.ident,
                    CASE WHEN p_nvlink THEN coalesce(
                        (SELECT d.details -> 'nvlink_peers' FROM {schema}.devices AS d WHERE d.id = a.device_id),
                        '[]') ELSE '[]' END AS peers
                FROM {schema}.atoms AS a
                JOIN {schema}.nodes AS n ON n.id = a.node_id
                WHERE a.pool_id = p_pool AND a.state = 'available'
                  AND n.state = 'adopted' AND NOT n.cordoned AND NOT n.draining
                  AND CASE WHEN p_profile IS NULL THEN a.kind = 'gpu' ELSE a.kind = 'mig' AND a.profile = p_profile END
                  AND (p_model IS NULL OR a.model ILIKE p_model)
                  AND (p_min_memory IS NULL OR a.memory_mib >= p_min_memory)
                  AND NOT (a.id = ANY (p_skip))
                  AND NOT EXISTS (
                      SELECT 1 FROM {schema}.bookings AS b WHERE b.atom_id = a.id AND b.during && p_window
                  )
                ORDER BY a.pool_id, a.node_id, a.ident
                LIMIT lim
            ) AS c
            GROUP BY c.node_id
        ) AS x;

        chosen := '[]';
        IF p_nvlink THEN
            rule := 'nvlink_clique_best_fit';
            FOR k IN REVERSE jsonb_array_length(per) - 1 .. 0 LOOP
                node := per -> k;
                CONTINUE WHEN (node ->> 'n')::integer < p_gpus;
                idx := {schema}.bc_clique(node -> 'idents', node -> 'peers', p_gpus);
                IF cardinality(idx) >= p_gpus THEN
                    chosen := jsonb_build_array(jsonb_build_object(
                        'node_id', node -> 'node_id', 'free', node -> 'n',
                        'atom_ids', {schema}.bc_pick(node -> 'ids', idx[1:p_gpus]),
                        'atoms', {schema}.bc_pick(node -> 'idents', idx[1:p_gpus])));
                    EXIT;
                END IF;
            END LOOP;
        ELSE
            -- the node with the fewest free atoms that still suffice (per is largest first: walk it backwards)
            rule := 'best_fit_one_node';
            FOR k IN REVERSE jsonb_array_length(per) - 1 .. 0 LOOP
                node := per -> k;
                IF (node ->> 'n')::integer >= p_gpus THEN
                    chosen := jsonb_build_array(jsonb_build_object(
                        'node_id', node -> 'node_id', 'free', node -> 'n',
                        'atom_ids', {schema}.bc_head(node -> 'ids', p_gpus),
                        'atoms', {schema}.bc_head(node -> 'idents', p_gpus)));
                    EXIT;
                END IF;
            END LOOP;
            IF jsonb_array_length(chosen) = 0 AND NOT p_one_node AND seen >= p_gpus THEN
                -- the fewest nodes: the largest first while none suffices alone, then the best fit for the rest
                rule := 'fewest_nodes';
                remaining := p_gpus;
                k := 0;
                WHILE remaining > 0 AND k < jsonb_array_length(per) LOOP
                    take := NULL;
                    FOR j IN REVERSE jsonb_array_length(per) - 1 .. k LOOP
                        IF ((per -> j) ->> 'n')::integer >= remaining THEN
                            take := j;
                            EXIT;
                        END IF;
                    END LOOP;
                    IF take IS NULL THEN  -- none suffices alone: take the largest whole
                        take := k;
                        k := k + 1;
                    END IF;
                    node := per -> take;
                    total := least(remaining, (node ->> 'n')::integer);
                    chosen := chosen || jsonb_build_array(jsonb_build_object(
                        'node_id', node -> 'node_id', 'free', node -> 'n',
                        'atom_ids', {schema}.bc_head(node -> 'ids', total),
                        'atoms', {schema}.bc_head(node -> 'idents', total)));
                    remaining := remaining - total;
                END LOOP;
                IF remaining > 0 THEN
                    chosen := '[]';
                END IF;
            END IF;
        END IF;

        IF jsonb_array_length(chosen) > 0 THEN
            RETURN jsonb_build_object(
                'nodes', chosen, 'rule', rule, 'candidates', seen,
                'atom_ids', (SELECT jsonb_agg(e) FROM jsonb_array_elements(chosen) AS c(n),
                    jsonb_array_elements(c.n -> 'atom_ids') AS t(e)));
        END IF;
        -- a window that held fewer candidates than it could: there are no more
        IF seen < lim THEN
            RETURN NULL;
        END IF;
        lim := lim * 8;
    END LOOP;
END
$f$;

-- Whether the tenant may hold ``p_share`` more GPUs over ``p_window`` in the pool: NULL when it may, else which limit
-- and the numbers. Concurrent GPUs are the most the tenant holds at any moment of the window (the peak is at the
-- window's start or at a booking's start); GPU-hours are counted per calendar month (UTC) the window touches, over the
-- live bookings and those moved to history (the usage module's ``bookings_history``; its migrations run first).
CREATE FUNCTION {schema}.bc_quota_check(
    p_pool text, p_tenant text, p_window tstzrange, p_share numeric, p_max_gpus integer, p_max_hours double precision,
    p_exclude text
) RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    used numeric;
    month timestamptz;
    month_end timestamptz;
    asked numeric;
BEGIN
    IF p_max_gpus IS NOT NULL THEN
        SELECT coalesce(max((
            SELECT sum(b2.gpus) FROM {schema}.bookings AS b2
            WHERE b2.pool_id = p_pool AND b2.tenant = p_tenant AND b2.during @> pt.at
              AND b2.reservation_id <> p_exclude
        )), 0)
        INTO used
        FROM (
            SELECT lower(p_window) AS at
            UNION
            SELECT lower(b.during) FROM {schema}.bookings AS b
            WHERE b.pool_id = p_pool AND b.tenant = p_tenant AND b.during && p_window
              AND lower(b.during) > lower(p_window) AND b.reservation_id <> p_exclude
        ) AS pt;
        IF used + p_share > p_max_gpus THEN
            RETURN jsonb_build_object('limit', 'max_gpus', 'max_gpus', p_max_gpus, 'used', used, 'asked', p_share);
        END IF;
    END IF;
    IF p_max_hours IS NOT NULL THEN
        month := date_trunc('month', lower(p_window) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
        WHILE month < upper(p_window) LOOP
            month_end := ((month AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC';
            SELECT coalesce(sum(b.gpus * extract(epoch FROM
                least(upper(b.during), month_end) - greatest(lower(b.during), month))), 0) / 3600
            INTO used
            FROM (
                SELECT l.gpus, l.during FROM {schema}.bookings AS l
                WHERE l.pool_id = p_pool AND l.tenant = p_tenant AND l.during && tstzrange(month, month_end, '[)')
                  AND l.reservation_id <> p_exclude
                UNION ALL
                SELECT h.gpus, h.during FROM {schema}.bookings_history AS h
                WHERE h.pool_id = p_pool AND h.tenant = p_tenant AND upper(h.during) >= month
                  AND h.during && tstzrange(month, month_end, '[)') AND h.reservation_id <> p_exclude
            ) AS b;
            asked := p_share * extract(epoch FROM
                least(upper(p_window), month_end) - greatest(lower(p_window), month)) / 3600;
            IF used + asked > p_max_hours THEN
                RETURN jsonb_build_object('limit', 'max_gpu_hours_per_month', 'max_gpu_hours_per_month', p_max_hours,
                    'month', month, 'used', round(used, 3), 'asked', round(asked, 3));
            END IF;
            month := month_end;
        END LOOP;
    END IF;
    RETURN NULL;
END
$f$;

-- Why nothing fits: the pool's atoms by the first reason each is left out for, and the earliest start (within the
-- horizon) at which the same request would fit, trying the ends of the bookings in the way.
CREATE FUNCTION {schema}.bc_explain_no_capacity(p_pool text, p jsonb, p_window tstzrange, p_horizon interval)
RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    excluded jsonb;
    t_at timestamptz;
    span interval := upper(p_window) - lower(p_window);
    earliest timestamptz;
    tries integer := 0;
BEGIN
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'profile', nullif(count(*) FILTER (WHERE r = 'profile'), 0),
        'model', nullif(count(*) FILTER (WHERE r = 'model'), 0),
        'memory', nullif(count(*) FILTER (WHERE r = 'memory'), 0),
        'cordoned', nullif(count(*) FILTER (WHERE r = 'cordoned'), 0),
        'unhealthy', nullif(count(*) FILTER (WHERE r = 'unhealthy'), 0),
        'booked', nullif(count(*) FILTER (WHERE r = 'booked'), 0),
        'free', nullif(count(*) FILTER (WHERE r = 'free'), 0)))
    INTO excluded
    FROM (
        SELECT CASE
            WHEN CASE WHEN p ->> 'mig_profile' IS NULL THEN a.kind <> 'gpu'
                 ELSE a.kind <> 'mig' OR a.profile IS DISTINCT FROM p ->> 'mig_profile' END THEN 'profile'
            WHEN p ->> 'model' IS NOT NULL AND NOT coalesce(a.model ILIKE p ->> 'model', false) THEN 'model'
            WHEN p ->> 'min_memory_mib' IS NOT NULL
                 AND NOT coalesce(a.memory_mib >= (p ->> 'min_memory_mib')::bigint, false) THEN 'memory'
            WHEN n.cordoned OR n.draining THEN 'cordoned'
            WHEN a.state <> 'available' OR n.state <> 'adopted' THEN 'unhealthy'
            WHEN EXISTS (SELECT 1 FROM {schema}.bookings AS b WHERE b.atom_id = a.id AND b.during && p_window)
                THEN 'booked'
            ELSE 'free' END AS r
        FROM {schema}.atoms AS a JOIN {schema}.nodes AS n ON n.id = a.node_id
        WHERE a.pool_id = p_pool AND n.state <> 'retired'
    ) AS why;

    IF coalesce((excluded ->> 'booked')::integer, 0) > 0 THEN
        FOR t_at IN
            SELECT DISTINCT upper(b.during) FROM {schema}.bookings AS b
            WHERE b.pool_id = p_pool AND b.during && tstzrange(lower(p_window), lower(p_window) + p_horizon, '[)')
              AND upper(b.during) > lower(p_window) AND upper(b.during) <= lower(p_window) + p_horizon
            ORDER BY 1 LIMIT 64
        LOOP
            tries := tries + 1;
            IF {schema}.bc_place(p_pool, (p ->> 'gpus')::integer, p ->> 'model', (p ->> 'min_memory_mib')::bigint,
                    (p ->> 'one_node')::boolean, (p ->> 'nvlink')::boolean, p ->> 'mig_profile',
                    tstzrange(t_at, t_at + span, '[)'), '{}') IS NOT NULL THEN
                earliest := t_at;
                EXIT;
            END IF;
        END LOOP;
    END IF;
    RETURN jsonb_build_object('excluded', coalesce(excluded, '{}'), 'earliest_start', earliest);
END
$f$;

-- Undo a draft: its row, its projection row, and its unfinished idempotency key.
CREATE FUNCTION {schema}.bc_undo_draft(p_id text, p_identity text, p_key text) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    DELETE FROM {schema}.reservations WHERE id = p_id AND state = 'draft';
    DELETE FROM {schema}.authz_resources WHERE resource_type = 'reservation' AND resource_id = p_id;
    IF p_key IS NOT NULL THEN
        DELETE FROM {schema}.idempotency_keys
        WHERE identity = p_identity AND key = p_key AND state = 'in_progress';
    END IF;
END
$f$;

-- Book atoms for a reservation (the draft or pending row ``r``, with the constraints in ``p``): place, lock the
-- picked atoms SKIP LOCKED in a sub-block (a competitor's pick is left to it, and our locks go when the sub-block
-- is undone), insert the bookings; a booking a competitor committed meanwhile is an exclusion violation, and the
-- placement runs again on a fresh snapshot. The placement, or NULL when nothing fits.
CREATE FUNCTION {schema}.bc_book(r {schema}.reservations, p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    w tstzrange := tstzrange(r.start_at, r.end_at, '[)');
    placed jsonb;
    skip text[] := '{}';
    picked text[];
    locked text[];
    attempt integer := 0;
BEGIN
    LOOP
        attempt := attempt + 1;
        placed := {schema}.bc_place(r.pool_id, r.gpus, p ->> 'model', (p ->> 'min_memory_mib')::bigint,
            (p ->> 'one_node')::boolean, (p ->> 'nvlink')::boolean, p ->> 'mig_profile', w, skip);
        IF placed IS NULL THEN
            RETURN NULL;
        END IF;
        picked := ARRAY(SELECT jsonb_array_elements_text(placed -> 'atom_ids'));
        BEGIN
            locked := ARRAY(SELECT a.id FROM {schema}.atoms AS a WHERE a.id = ANY (picked) FOR UPDATE SKIP LOCKED);
            IF cardinality(locked) < cardinality(picked) THEN
                skip := skip || ARRAY(SELECT unnest(picked) EXCEPT SELECT unnest(locked));
                RAISE EXCEPTION USING ERRCODE = 'BC001';
            END IF;
            INSERT INTO {schema}.bookings (atom_id, reservation_id, tenant, pool_id, gpus, during)
            SELECT a.id, r.id, r.tenant, r.pool_id, {schema}.bc_share(a.profile), w
            FROM {schema}.atoms AS a WHERE a.id = ANY (picked);
            RETURN placed;
        EXCEPTION
            WHEN exclusion_violation THEN NULL;  -- a competitor committed a booking: a new snapshot sees it
            WHEN SQLSTATE 'BC001' THEN NULL;
        END;
        IF attempt >= 32 THEN
            RAISE EXCEPTION 'placement kept colliding' USING ERRCODE = '40001';
        END IF;
    END LOOP;
END
$f$;

-- Publish an event about reservation ``r`` (numbered per reservation, as the outbox numbers every key's events).
CREATE FUNCTION {schema}.bc_reservation_event(r {schema}.reservations, p_type text, p_extra jsonb) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE
    seq bigint;
BEGIN
    INSERT INTO {schema}.outbox_keys AS k (key, last_seq) VALUES (r.id, 1)
    ON CONFLICT (key) DO UPDATE SET last_seq = k.last_seq + 1
    RETURNING k.last_seq INTO seq;
    INSERT INTO {schema}.outbox (type, key, seq, payload)
    VALUES (p_type, r.id, seq, jsonb_build_object(
        'reservation_id', r.id, 'tenant', r.tenant, 'pool_id', r.pool_id, 'state', r.state, 'gpus', r.gpus,
        'node_ids', r.node_ids, 'start_at', r.start_at, 'end_at', r.end_at) || coalesce(p_extra, '{}'));
END
$f$;

-- Record where a reservation was placed, by which placer.
CREATE FUNCTION {schema}.bc_mark_placed(r {schema}.reservations, placed jsonb, p_placer text, p_now timestamptz)
RETURNS {schema}.reservations
LANGUAGE plpgsql AS $f$
BEGIN
    UPDATE {schema}.reservations SET
        state = 'placed',
        placement = jsonb_build_object('nodes', placed -> 'nodes', 'why', jsonb_build_object(
            'placer', p_placer, 'rule', placed -> 'rule', 'candidates', placed -> 'candidates')),
        node_ids = ARRAY(SELECT jsonb_array_elements(placed -> 'nodes') ->> 'node_id'),
        history = history || jsonb_build_array(jsonb_build_object('state', 'placed', 'at', p_now)),
        updated_at = p_now
    WHERE id = r.id
    RETURNING * INTO r;
    PERFORM {schema}.bc_reservation_event(r, 'reservation.placed', NULL);
    RETURN r;
END
$f$;

CREATE FUNCTION {schema}.bc_admit_reservation(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    r {schema}.reservations;
    q record;
    w tstzrange;
    v_now timestamptz := (p ->> 'now')::timestamptz;
    placed jsonb;
    refused jsonb;
    why jsonb;
    share numeric := (p ->> 'share')::numeric;
    deferred boolean := coalesce((p ->> 'defer')::boolean, false);
BEGIN
    SELECT * INTO r FROM {schema}.reservations WHERE id = p ->> 'id' AND state = 'draft' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('state', 'gone');
    END IF;
    w := tstzrange(r.start_at, r.end_at, '[)');

    SELECT qq.max_gpus, qq.max_gpu_hours_per_month, qq.max_reservation_hours INTO q
    FROM {schema}.quotas AS qq WHERE qq.pool_id = r.pool_id AND qq.tenant IN (r.tenant, '')
    ORDER BY qq.tenant = '' LIMIT 1;
    IF FOUND THEN
        IF q.max_reservation_hours IS NOT NULL
           AND extract(epoch FROM r.end_at - r.start_at) > q.max_reservation_hours * 3600 THEN
            PERFORM {schema}.bc_undo_draft(r.id, p ->> 'idempotency_identity', p ->> 'idempotency_key');
            RETURN jsonb_build_object('state', 'too_long',
                'detail', jsonb_build_object('max_reservation_hours', q.max_reservation_hours));
        END IF;
        IF q.max_gpus IS NOT NULL OR q.max_gpu_hours_per_month IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(hashtextextended('bettercompute.quota/' || r.pool_id || '/' || r.tenant, 0));
            refused := {schema}.bc_quota_check(
                r.pool_id, r.tenant, w, share, q.max_gpus, q.max_gpu_hours_per_month, r.id);
            IF refused IS NOT NULL THEN
                PERFORM {schema}.bc_undo_draft(r.id, p ->> 'idempotency_identity', p ->> 'idempotency_key');
                RETURN jsonb_build_object('state', 'quota', 'detail', refused);
            END IF;
        END IF;
    END IF;

    IF deferred THEN
        -- the pool-lease placer places it: pending now, a work item for the pool's placer
        UPDATE {schema}.reservations SET
            state = 'pending',
            history = history || jsonb_build_array(jsonb_build_object('state', 'pending', 'at', v_now)),
            updated_at = v_now
        WHERE id = r.id
        RETURNING * INTO r;
        PERFORM {schema}.bc_reservation_event(r, 'reservation.pending', NULL);
    ELSE
        placed := {schema}.bc_book(r, p);
        IF placed IS NULL THEN
            why := {schema}.bc_explain_no_capacity(r.pool_id, p || jsonb_build_object('gpus', r.gpus), w,
                (p ->> 'horizon')::interval);
            PERFORM {schema}.bc_undo_draft(r.id, p ->> 'idempotency_identity', p ->> 'idempotency_key');
            RETURN jsonb_build_object('state', 'no_capacity') || why;
        END IF;
        r := {schema}.bc_mark_placed(r, placed, 'inline', v_now);
    END IF;

    INSERT INTO {schema}.audit (action, actor, tenant, resource_type, resource_id, decision_id, outcome, details)
    VALUES (p ->> 'action', p ->> 'actor', r.tenant, 'reservation', r.id, p ->> 'decision_id', 'ok',
        jsonb_build_object('pool_id', r.pool_id, 'gpus', r.gpus, 'state', r.state, 'nodes', r.node_ids));

    INSERT INTO {schema}.work_queue AS wq (kind, key, shard, payload, run_at)
    VALUES (p ->> 'work_kind', coalesce(p ->> 'work_key', r.id), (p ->> 'work_shard')::smallint, '{}', v_now)
    ON CONFLICT (kind, key) DO UPDATE SET
        run_at = CASE WHEN wq.state = 'ready' THEN least(wq.run_at, EXCLUDED.run_at) ELSE wq.run_at END,
        rerun_at = CASE WHEN wq.state = 'claimed' THEN least(wq.rerun_at, EXCLUDED.run_at) END;

    IF p ->> 'idempotency_key' IS NOT NULL THEN
        UPDATE {schema}.idempotency_keys SET state = 'done', result = jsonb_build_object('reservation_id', r.id)
        WHERE identity = p ->> 'idempotency_identity' AND key = p ->> 'idempotency_key';
    END IF;

    IF p ->> 'work_channel' IS NOT NULL THEN
        PERFORM pg_notify(p ->> 'work_channel', p ->> 'work_kind');
        PERFORM pg_notify(p ->> 'work_channel', p ->> 'sinks_poke');
    END IF;

    RETURN jsonb_build_object('state', r.state, 'record', to_jsonb(r));
END
$f$;

-- The pool-lease placer's pass over one pool: its pending reservations, oldest first (at most ``p_limit``), each
-- placed or, when nothing fits, failed with the reasons. One call; the caller holds the pool's shard lease, so
-- passes over one pool never overlap. What it decided: ``{"placed": [ids], "failed": [ids], "left": n}``.
CREATE FUNCTION {schema}.bc_place_pending(p_pool text, p_now timestamptz, p_horizon interval, p_limit integer)
RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    r {schema}.reservations;
    c jsonb;
    p jsonb;
    placed jsonb;
    why jsonb;
    done_placed text[] := '{}';
    done_failed text[] := '{}';
    left_over integer;
BEGIN
    FOR r IN
        SELECT * FROM {schema}.reservations
        WHERE pool_id = p_pool AND state = 'pending' ORDER BY created_at, id LIMIT p_limit FOR UPDATE
    LOOP
        c := r.constraints;
        p := jsonb_build_object(
            'model', CASE WHEN c ->> 'model' IS NULL THEN NULL ELSE '%' || replace(replace(replace(c ->> 'model',
                '\', '\\'), '%', '\%'), '_', '\_') || '%' END,
            'min_memory_mib', c -> 'min_memory_mib',
            'one_node', coalesce((c ->> 'one_node')::boolean, false) OR coalesce((c ->> 'nvlink')::boolean, false),
            'nvlink', coalesce((c ->> 'nvlink')::boolean, false),
            'mig_profile', c ->> 'mig_profile',
            'gpus', r.gpus);
        IF r.end_at <= p_now THEN
            placed := NULL;
        ELSE
            IF r.start_at < p_now THEN  -- it waited: what is left of its time is booked
                UPDATE {schema}.reservations SET start_at = p_now WHERE id = r.id RETURNING * INTO r;
            END IF;
            placed := {schema}.bc_book(r, p);
        END IF;
        IF placed IS NOT NULL THEN
            r := {schema}.bc_mark_placed(r, placed, 'pool-lease', p_now);
            done_placed := done_placed || r.id;
        ELSE
            why := {schema}.bc_explain_no_capacity(r.pool_id, p, tstzrange(r.start_at, greatest(r.end_at,
                r.start_at + interval '1 second'), '[)'), p_horizon);
            UPDATE {schema}.reservations SET
                state = 'failed', reason = 'no_capacity',
                placement = jsonb_build_object('why', jsonb_build_object('placer', 'pool-lease') || why),
                history = history || jsonb_build_array(jsonb_build_object(
                    'state', 'failed', 'at', p_now, 'reason', 'no_capacity')),
                updated_at = p_now
            WHERE id = r.id
            RETURNING * INTO r;
            PERFORM {schema}.bc_reservation_event(
                r, 'reservation.failed', jsonb_build_object('reason', 'no_capacity') || why);
            done_failed := done_failed || r.id;
        END IF;
    END LOOP;
    SELECT count(*) INTO left_over FROM {schema}.reservations WHERE pool_id = p_pool AND state = 'pending';
    RETURN jsonb_build_object('placed', to_jsonb(done_placed), 'failed', to_jsonb(done_failed), 'left', left_over);
END
$f$;
-- Move a live reservation's end later: quota (the added time, under the same lock as admission), then its bookings'
-- end; an atom booked in between is an exclusion violation, answered as no capacity with nothing changed.
CREATE FUNCTION {schema}.bc_extend_reservation(p_id text, p_end timestamptz, p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    r {schema}.reservations;
    q record;
    refused jsonb;
    share numeric;
BEGIN
    SELECT * INTO r FROM {schema}.reservations WHERE id = p_id AND state <> 'draft' FOR UPDATE;
    IF NOT FOUND OR r.state NOT IN ('placed', 'bound', 'active') OR p_end <= r.end_at OR r.end_at <= p_now THEN
        RETURN jsonb_build_object('state', 'gone', 'detail', jsonb_build_object('state', r.state, 'end_at', r.end_at));
    END IF;
    SELECT coalesce(sum(b.gpus), 0) INTO share FROM {schema}.bookings AS b
    WHERE b.reservation_id = r.id AND upper(b.during) = r.end_at;
    SELECT qq.max_gpus, qq.max_gpu_hours_per_month, qq.max_reservation_hours INTO q
    FROM {schema}.quotas AS qq WHERE qq.pool_id = r.pool_id AND qq.tenant IN (r.tenant, '')
    ORDER BY qq.tenant = '' LIMIT 1;
    IF FOUND THEN
        IF q.max_reservation_hours IS NOT NULL
           AND extract(epoch FROM p_end - r.start_at) > q.max_reservation_hours * 3600 THEN
            RETURN jsonb_build_object('state', 'too_long',
                'detail', jsonb_build_object('max_reservation_hours', q.max_reservation_hours));
        END IF;
        IF q.max_gpus IS NOT NULL OR q.max_gpu_hours_per_month IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(hashtextextended('bettercompute.quota/' || r.pool_id || '/' || r.tenant, 0));
            refused := {schema}.bc_quota_check(r.pool_id, r.tenant, tstzrange(r.end_at, p_end, '[)'), share,
                q.max_gpus, q.max_gpu_hours_per_month, '');
            IF refused IS NOT NULL THEN
                RETURN jsonb_build_object('state', 'quota', 'detail', refused);
            END IF;
        END IF;
    END IF;
    BEGIN
        UPDATE {schema}.bookings SET during = tstzrange(lower(during), p_end, '[)')
        WHERE reservation_id = r.id AND upper(during) = r.end_at;
    EXCEPTION WHEN exclusion_violation THEN
        RETURN jsonb_build_object('state', 'no_capacity', 'excluded', jsonb_build_object('booked', 1));
    END;
    UPDATE {schema}.reservations SET end_at = p_end, updated_at = p_now,
        history = history || jsonb_build_array(jsonb_build_object('state', r.state, 'at', p_now, 'reason', 'extended'))
    WHERE id = r.id
    RETURNING * INTO r;
    RETURN jsonb_build_object('state', 'placed', 'record', to_jsonb(r));
END
$f$;
"""

MIGRATION = Migration(version=2, name="reservations and admission", sql=_V2)
