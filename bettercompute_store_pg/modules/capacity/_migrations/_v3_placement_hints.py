"""Capacity version 3: the placer's hints (holds and idle counts per node) and the functions that use them."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATION"]

# Placement hints (issue 13's benchmark: placing on a pool half booked from the front walked every booked atom).
#
# ``placement_holds`` names the atoms a reservation holds: a row per booking the placer writes (``bc_book``), gone
# when the reservation is released (``bc_release``) or its booking leaves the live table (a trigger on ``bookings``).
# ``placement_nodes`` counts, per node and class of atom (kind, MIG profile, model, memory), the available atoms no
# reservation holds; triggers on ``atoms`` (made by ``bc_placement_attach``) and the functions that change holds keep
# it. The placer reads it in (pool, class, idle, node) order, so the best fit is the first row that suffices and the
# largest the last, whatever the pool's size; each node it looks at is then checked atom by atom on the bookings (the
# exclusion constraint's index), so a wrong hint costs a look, never a wrong placement. When the hints find nothing
# within a budget of nodes (a calendar window in a gap between holds, bookings written around the placer), version
# 2's walk over the pool's atoms decides, renamed ``bc_place_walk``.
#
# The hint rows of the nodes looked at are locked ``FOR UPDATE SKIP LOCKED``: a concurrent admission takes the next
# node rather than the same atoms, instead of colliding and placing again.
_V3 = r"""
CREATE TABLE {schema}.placement_holds (
    atom_id text NOT NULL,
    reservation_id text NOT NULL,
    PRIMARY KEY (atom_id, reservation_id)
);
CREATE INDEX placement_holds_reservation ON {schema}.placement_holds (reservation_id);

CREATE TABLE {schema}.placement_nodes (
    pool_id text NOT NULL,
    node_id text NOT NULL,
    kind text NOT NULL,
    profile text NOT NULL,
    model text NOT NULL,
    memory_mib bigint NOT NULL,
    idle integer NOT NULL CHECK (idle >= 0),
    PRIMARY KEY (node_id, kind, profile, model, memory_mib, pool_id)
);
CREATE INDEX placement_nodes_fit ON {schema}.placement_nodes (pool_id, kind, profile, idle, node_id) WHERE idle > 0;

-- Count again the idle atoms of these nodes (rows in key order, so that two refreshes lock them in the same order).
CREATE FUNCTION {schema}.bc_placement_refresh(p_nodes text[]) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    IF cardinality(p_nodes) = 0 THEN
        RETURN;
    END IF;
    DELETE FROM {schema}.placement_nodes AS pn WHERE pn.node_id = ANY (p_nodes) AND NOT EXISTS (
        SELECT 1 FROM {schema}.atoms AS a
        WHERE a.node_id = pn.node_id AND a.pool_id = pn.pool_id AND a.kind = pn.kind
          AND coalesce(a.profile, '') = pn.profile AND coalesce(a.model, '') = pn.model
          AND coalesce(a.memory_mib, -1) = pn.memory_mib);
    INSERT INTO {schema}.placement_nodes AS pn (pool_id, node_id, kind, profile, model, memory_mib, idle)
    SELECT a.pool_id, a.node_id, a.kind, coalesce(a.profile, ''), coalesce(a.model, ''), coalesce(a.memory_mib, -1),
        -- a probe per atom (LIMIT 1 keeps the planner from hashing every hold of the fleet instead)
        count(*) FILTER (WHERE a.state = 'available'
            AND NOT EXISTS (SELECT 1 FROM {schema}.placement_holds AS h WHERE h.atom_id = a.id LIMIT 1))
    FROM {schema}.atoms AS a
    WHERE a.node_id = ANY (p_nodes)
    GROUP BY 1, 2, 3, 4, 5, 6
    ORDER BY 2, 3, 4, 5, 6, 1
    ON CONFLICT (node_id, kind, profile, model, memory_mib, pool_id) DO UPDATE SET idle = EXCLUDED.idle
    WHERE pn.idle <> EXCLUDED.idle;
END
$f$;

-- Atoms written by the inventory: the nodes whose hints may change (an update of nothing they count refreshes none).
-- ``bc_placement_attach`` makes the triggers that call it and counts the hints, once ``atoms`` exists: called here and
-- by the identity module's migrations, which make ``atoms`` (whichever of the two modules comes second attaches).
CREATE FUNCTION {schema}.bc_atoms_changed() RETURNS trigger
LANGUAGE plpgsql AS $f$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM {schema}.bc_placement_refresh(ARRAY(SELECT DISTINCT node_id FROM atoms_new ORDER BY 1));
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM {schema}.bc_placement_refresh(ARRAY(SELECT DISTINCT node_id FROM atoms_old ORDER BY 1));
    ELSE
        PERFORM {schema}.bc_placement_refresh(ARRAY(
            SELECT x.node_id FROM atoms_new AS n JOIN atoms_old AS o ON o.id = n.id,
                LATERAL (VALUES (n.node_id), (o.node_id)) AS x(node_id)
            WHERE (o.node_id, o.pool_id, o.kind, o.profile, o.model, o.memory_mib, o.state)
                IS DISTINCT FROM (n.node_id, n.pool_id, n.kind, n.profile, n.model, n.memory_mib, n.state)
            GROUP BY 1 ORDER BY 1));
    END IF;
    RETURN NULL;
END
$f$;
CREATE FUNCTION {schema}.bc_placement_attach() RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    IF to_regclass('{schema}.atoms') IS NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('{schema}.atoms')
               AND tgname = 'placement_atoms_inserted') THEN
        RETURN;
    END IF;
    CREATE TRIGGER placement_atoms_inserted AFTER INSERT ON {schema}.atoms
        REFERENCING NEW TABLE AS atoms_new FOR EACH STATEMENT EXECUTE FUNCTION {schema}.bc_atoms_changed();
    CREATE TRIGGER placement_atoms_updated AFTER UPDATE ON {schema}.atoms
        REFERENCING OLD TABLE AS atoms_old NEW TABLE AS atoms_new
        FOR EACH STATEMENT EXECUTE FUNCTION {schema}.bc_atoms_changed();
    CREATE TRIGGER placement_atoms_deleted AFTER DELETE ON {schema}.atoms
        REFERENCING OLD TABLE AS atoms_old FOR EACH STATEMENT EXECUTE FUNCTION {schema}.bc_atoms_changed();
    PERFORM {schema}.bc_placement_refresh(ARRAY(SELECT DISTINCT node_id FROM {schema}.atoms ORDER BY 1));
END
$f$;

-- The hints of the nodes of these atoms, counted again (where node identity is off there are no atoms, and so no
-- holds: the atoms are looked up only when some were held).
CREATE FUNCTION {schema}.bc_placement_refresh_atoms(p_atoms text[]) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
    IF cardinality(p_atoms) > 0 THEN
        PERFORM {schema}.bc_placement_refresh(ARRAY(
            SELECT DISTINCT a.node_id FROM {schema}.atoms AS a WHERE a.id = ANY (p_atoms) ORDER BY 1));
    END IF;
END
$f$;

-- Bookings leaving the live table (taken back, or moved to history) hold their atoms no more.
CREATE FUNCTION {schema}.bc_bookings_gone() RETURNS trigger
LANGUAGE plpgsql AS $f$
DECLARE
    held text[];
BEGIN
    WITH gone AS (
        DELETE FROM {schema}.placement_holds AS h USING bookings_old AS b
        WHERE h.atom_id = b.atom_id AND h.reservation_id = b.reservation_id
        RETURNING h.atom_id
    )
    SELECT array_agg(DISTINCT atom_id) INTO held FROM gone;
    PERFORM {schema}.bc_placement_refresh_atoms(coalesce(held, '{}'));
    RETURN NULL;
END
$f$;
CREATE TRIGGER placement_bookings_deleted AFTER DELETE ON {schema}.bookings
    REFERENCING OLD TABLE AS bookings_old FOR EACH STATEMENT EXECUTE FUNCTION {schema}.bc_bookings_gone();

-- Release a reservation's atoms at ``p_at``: a booking not started by then goes (an empty range is not a booking),
-- one running is cut there, and its holds go. The number of bookings changed.
CREATE FUNCTION {schema}.bc_release(p_id text, p_at timestamptz) RETURNS integer
LANGUAGE plpgsql AS $f$
DECLARE
    n_gone integer;
    n_cut integer;
    held text[];
BEGIN
    DELETE FROM {schema}.bookings WHERE reservation_id = p_id AND lower(during) >= p_at;
    GET DIAGNOSTICS n_gone = ROW_COUNT;
    UPDATE {schema}.bookings SET during = tstzrange(lower(during), p_at, '[)')
    WHERE reservation_id = p_id AND lower(during) < p_at AND (upper_inf(during) OR upper(during) > p_at);
    GET DIAGNOSTICS n_cut = ROW_COUNT;
    WITH gone AS (
        DELETE FROM {schema}.placement_holds WHERE reservation_id = p_id RETURNING atom_id
    )
    SELECT array_agg(DISTINCT atom_id) INTO held FROM gone;
    PERFORM {schema}.bc_placement_refresh_atoms(coalesce(held, '{}'));
    RETURN n_gone + n_cut;
END
$f$;

-- The free atoms of one node for the request, in ident order (the walk's tests, on one node).
CREATE FUNCTION {schema}.bc_node_free(
    p_node text, p_pool text, p_model text, p_min_memory bigint, p_nvlink boolean, p_profile text,
    p_window tstzrange, p_skip text[]
) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $f$
DECLARE
    free jsonb;
BEGIN
    SELECT jsonb_build_object('node_id', p_node, 'n', count(*),
        'ids', coalesce(jsonb_agg(c.id ORDER BY c.ident), '[]'),
        'idents', coalesce(jsonb_agg(c.ident ORDER BY c.ident), '[]'),
        'peers', coalesce(jsonb_agg(c.peers ORDER BY c.ident), '[]'))
    INTO free
    FROM (
        SELECT a.id, a.ident,
            CASE WHEN p_nvlink THEN coalesce(
                (SELECT d.details -> 'nvlink_peers' FROM {schema}.devices AS d WHERE d.id = a.device_id),
                '[]') ELSE '[]' END AS peers
        FROM {schema}.atoms AS a
        WHERE a.node_id = p_node AND a.pool_id = p_pool AND a.state = 'available'
          AND CASE WHEN p_profile IS NULL THEN a.kind = 'gpu' ELSE a.kind = 'mig' AND a.profile = p_profile END
          AND (p_model IS NULL OR a.model ILIKE p_model)
          AND (p_min_memory IS NULL OR a.memory_mib >= p_min_memory)
          AND NOT (a.id = ANY (p_skip))
          AND NOT EXISTS (SELECT 1 FROM {schema}.bookings AS b WHERE b.atom_id = a.id AND b.during && p_window)
    ) AS c;
    RETURN free;
END
$f$;

-- One entry of a placement: the first ``take`` of a node's free atoms (from bc_node_free), or those at ``idx``.
CREATE FUNCTION {schema}.bc_take(free jsonb, take integer, idx integer[]) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $f$
    SELECT jsonb_build_object('node_id', free -> 'node_id', 'free', free -> 'n',
        'atom_ids', CASE WHEN idx IS NULL THEN {schema}.bc_head(free -> 'ids', take)
            ELSE {schema}.bc_pick(free -> 'ids', idx[1:take]) END,
        'atoms', CASE WHEN idx IS NULL THEN {schema}.bc_head(free -> 'idents', take)
            ELSE {schema}.bc_pick(free -> 'idents', idx[1:take]) END)
$f$;

-- The next node by the hints for ``p_need`` atoms, among those not looked at yet: the best fit (fewest idle that
-- suffice), else (``p_largest``) the one with the most. Its hint row is locked, skipping rows another admission holds.
CREATE FUNCTION {schema}.bc_hint(
    p_pool text, p_kind text, p_profile text, p_model text, p_min_memory bigint, p_need integer, p_largest boolean,
    p_looked text[]
) RETURNS text
LANGUAGE plpgsql AS $f$
DECLARE
    found text;
BEGIN
    SELECT pn.node_id INTO found
    FROM {schema}.placement_nodes AS pn JOIN {schema}.nodes AS n ON n.id = pn.node_id
    WHERE pn.pool_id = p_pool AND pn.kind = p_kind AND pn.profile = p_profile AND pn.idle > 0 AND pn.idle >= p_need
      AND (p_model IS NULL OR pn.model ILIKE p_model) AND (p_min_memory IS NULL OR pn.memory_mib >= p_min_memory)
      AND NOT (pn.node_id = ANY (p_looked))
      AND n.state = 'adopted' AND NOT n.cordoned AND NOT n.draining
    ORDER BY pn.idle, pn.node_id
    LIMIT 1
    FOR UPDATE OF pn SKIP LOCKED;
    IF found IS NULL AND p_largest THEN
        SELECT pn.node_id INTO found
        FROM {schema}.placement_nodes AS pn JOIN {schema}.nodes AS n ON n.id = pn.node_id
        WHERE pn.pool_id = p_pool AND pn.kind = p_kind AND pn.profile = p_profile AND pn.idle > 0
          AND (p_model IS NULL OR pn.model ILIKE p_model) AND (p_min_memory IS NULL OR pn.memory_mib >= p_min_memory)
          AND NOT (pn.node_id = ANY (p_looked))
          AND n.state = 'adopted' AND NOT n.cordoned AND NOT n.draining
        ORDER BY pn.idle DESC, pn.node_id DESC
        LIMIT 1
        FOR UPDATE OF pn SKIP LOCKED;
    END IF;
    RETURN found;
END
$f$;

-- Placement from the hints: the best fit on one node (an NVLink clique on it), else the fewest nodes (the largest
-- first while none suffices alone, the last by best fit), looking at no more than ``p_budget`` nodes, each checked by
-- bc_node_free. NULL when that found nothing.
CREATE FUNCTION {schema}.bc_place_hinted(
    p_pool text, p_gpus integer, p_model text, p_min_memory bigint, p_one_node boolean, p_nvlink boolean,
    p_profile text, p_window tstzrange, p_skip text[], p_budget integer
) RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    v_kind text := CASE WHEN p_profile IS NULL THEN 'gpu' ELSE 'mig' END;
    v_profile text := coalesce(p_profile, '');
    looked text[] := '{}';
    node text;
    free jsonb;
    n integer;
    idx integer[];
    chosen jsonb := '[]';
    remaining integer := p_gpus;
    seen integer := 0;
BEGIN
    -- one node, best fit
    WHILE cardinality(looked) < p_budget LOOP
        node := {schema}.bc_hint(p_pool, v_kind, v_profile, p_model, p_min_memory, p_gpus, false, looked);
        EXIT WHEN node IS NULL;
        looked := looked || node;
        free := {schema}.bc_node_free(node, p_pool, p_model, p_min_memory, p_nvlink, p_profile, p_window, p_skip);
        n := (free ->> 'n')::integer;
        seen := seen + n;
        CONTINUE WHEN n < p_gpus;
        IF p_nvlink THEN
            idx := {schema}.bc_clique(free -> 'idents', free -> 'peers', p_gpus);
            CONTINUE WHEN cardinality(idx) < p_gpus;
            RETURN jsonb_build_object('nodes', jsonb_build_array({schema}.bc_take(free, p_gpus, idx)),
                'rule', 'nvlink_clique_best_fit', 'candidates', seen);
        END IF;
        RETURN jsonb_build_object('nodes', jsonb_build_array({schema}.bc_take(free, p_gpus, NULL)),
            'rule', 'best_fit_one_node', 'candidates', seen);
    END LOOP;
    IF p_one_node OR p_nvlink THEN
        RETURN NULL;
    END IF;
    -- the fewest nodes: the best fit for what is left when one suffices, else the largest
    WHILE remaining > 0 AND cardinality(looked) < p_budget + p_gpus LOOP
        node := {schema}.bc_hint(p_pool, v_kind, v_profile, p_model, p_min_memory, remaining, true, looked);
        EXIT WHEN node IS NULL;
        looked := looked || node;
        free := {schema}.bc_node_free(node, p_pool, p_model, p_min_memory, false, p_profile, p_window, p_skip);
        n := least((free ->> 'n')::integer, remaining);
        seen := seen + (free ->> 'n')::integer;
        IF n > 0 THEN
            chosen := chosen || jsonb_build_array({schema}.bc_take(free, n, NULL));
            remaining := remaining - n;
        END IF;
    END LOOP;
    IF remaining > 0 THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_object('nodes', chosen, 'rule', 'fewest_nodes', 'candidates', seen);
END
$f$;

ALTER FUNCTION {schema}.bc_place(text, integer, text, bigint, boolean, boolean, text, tstzrange, text[])
    RENAME TO bc_place_walk;

-- How many atoms of the request's kind could serve ``p_window``: the pool's usable ones less those booked over it,
-- counted from the bookings of the window (an index scan, a key lookup each) rather than probed atom by atom.
CREATE FUNCTION {schema}.bc_free_count(
    p_pool text, p_model text, p_min_memory bigint, p_profile text, p_window tstzrange
) RETURNS integer
LANGUAGE plpgsql STABLE AS $f$
DECLARE
    usable integer;
    booked integer;
BEGIN
    SELECT count(*) INTO usable
    FROM {schema}.atoms AS a JOIN {schema}.nodes AS n ON n.id = a.node_id
    WHERE a.pool_id = p_pool AND a.state = 'available'
      AND n.state = 'adopted' AND NOT n.cordoned AND NOT n.draining
      AND CASE WHEN p_profile IS NULL THEN a.kind = 'gpu' ELSE a.kind = 'mig' AND a.profile = p_profile END
      AND (p_model IS NULL OR a.model ILIKE p_model)
      AND (p_min_memory IS NULL OR a.memory_mib >= p_min_memory);
    SELECT count(DISTINCT a.id) INTO booked
    FROM {schema}.bookings AS b
    JOIN {schema}.atoms AS a ON a.id = b.atom_id
    JOIN {schema}.nodes AS n ON n.id = a.node_id
    WHERE b.pool_id = p_pool AND b.during && p_window
      AND a.pool_id = p_pool AND a.state = 'available'
      AND n.state = 'adopted' AND NOT n.cordoned AND NOT n.draining
      AND CASE WHEN p_profile IS NULL THEN a.kind = 'gpu' ELSE a.kind = 'mig' AND a.profile = p_profile END
      AND (p_model IS NULL OR a.model ILIKE p_model)
      AND (p_min_memory IS NULL OR a.memory_mib >= p_min_memory);
    RETURN usable - booked;
END
$f$;

-- Place: from the hints, else by the walk, which runs only when enough atoms are free over the window to be worth
-- it (on a full pool a refusal then costs a count, not a probe of every atom). The answer's ``atom_ids`` lists every
-- atom picked.
CREATE FUNCTION {schema}.bc_place(
    p_pool text, p_gpus integer, p_model text, p_min_memory bigint, p_one_node boolean, p_nvlink boolean,
    p_profile text, p_window tstzrange, p_skip text[]
) RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    placed jsonb;
BEGIN
    placed := {schema}.bc_place_hinted(p_pool, p_gpus, p_model, p_min_memory, p_one_node, p_nvlink, p_profile,
        p_window, p_skip, 8);
    IF placed IS NULL THEN
        IF {schema}.bc_free_count(p_pool, p_model, p_min_memory, p_profile, p_window) - cardinality(p_skip)
           < p_gpus THEN
            RETURN NULL;
        END IF;
        RETURN {schema}.bc_place_walk(p_pool, p_gpus, p_model, p_min_memory, p_one_node, p_nvlink, p_profile,
            p_window, p_skip);
    END IF;
    RETURN placed || jsonb_build_object('hinted', true, 'atom_ids', (SELECT jsonb_agg(e)
        FROM jsonb_array_elements(placed -> 'nodes') AS c(n), jsonb_array_elements(c.n -> 'atom_ids') AS t(e)));
END
$f$;

-- Why nothing fits (version 2's answer): the atoms booked over the window are one set read from the bookings (an
-- index scan), not a probe per atom; the search for the earliest start stops after ``bc_search_budget`` (a time
-- budget: on a very large full pool it answers without ``earliest_start`` rather than keep the caller waiting).
CREATE FUNCTION {schema}.bc_search_budget() RETURNS interval
LANGUAGE sql IMMUTABLE AS $f$ SELECT interval '250 milliseconds' $f$;

CREATE OR REPLACE FUNCTION {schema}.bc_explain_no_capacity(
    p_pool text, p jsonb, p_window tstzrange, p_horizon interval
) RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    excluded jsonb;
    t_at timestamptz;
    span interval := upper(p_window) - lower(p_window);
    earliest timestamptz;
    stop_at timestamptz := clock_timestamp() + {schema}.bc_search_budget();
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
            WHEN bk.atom_id IS NOT NULL THEN 'booked'
            ELSE 'free' END AS r
        FROM {schema}.atoms AS a
        JOIN {schema}.nodes AS n ON n.id = a.node_id
        LEFT JOIN (
            SELECT DISTINCT b.atom_id FROM {schema}.bookings AS b WHERE b.pool_id = p_pool AND b.during && p_window
        ) AS bk ON bk.atom_id = a.id
        WHERE a.pool_id = p_pool AND n.state <> 'retired'
    ) AS why;

    IF coalesce((excluded ->> 'booked')::integer, 0) > 0 THEN
        FOR t_at IN
            SELECT DISTINCT upper(b.during) FROM {schema}.bookings AS b
            WHERE b.pool_id = p_pool AND b.during && tstzrange(lower(p_window), lower(p_window) + p_horizon, '[)')
              AND upper(b.during) > lower(p_window) AND upper(b.during) <= lower(p_window) + p_horizon
            ORDER BY 1 LIMIT 64
        LOOP
            EXIT WHEN clock_timestamp() > stop_at;
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

-- Book atoms for a reservation: version 2's ``bc_book`` (renamed ``bc_book_atoms``), then the reservation holds the
-- atoms booked.
ALTER FUNCTION {schema}.bc_book({schema}.reservations, jsonb) RENAME TO bc_book_atoms;
CREATE FUNCTION {schema}.bc_book(r {schema}.reservations, p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $f$
DECLARE
    placed jsonb := {schema}.bc_book_atoms(r, p);
BEGIN
    IF placed IS NOT NULL THEN
        INSERT INTO {schema}.placement_holds (atom_id, reservation_id)
        SELECT jsonb_array_elements_text(placed -> 'atom_ids'), r.id ON CONFLICT DO NOTHING;
        PERFORM {schema}.bc_placement_refresh(ARRAY(
            SELECT DISTINCT n ->> 'node_id' FROM jsonb_array_elements(placed -> 'nodes') AS t(n) ORDER BY 1));
    END IF;
    RETURN placed;
END
$f$;

-- What holds atoms now (the live reservations' bookings), and the hints counted from it.
INSERT INTO {schema}.placement_holds (atom_id, reservation_id)
SELECT DISTINCT b.atom_id, b.reservation_id
FROM {schema}.bookings AS b JOIN {schema}.reservations AS r ON r.id = b.reservation_id
WHERE r.state IN ('placed', 'bound', 'active')
ON CONFLICT DO NOTHING;
SELECT {schema}.bc_placement_attach();
"""

MIGRATION = Migration(version=3, name="placement hints", sql=_V3)
