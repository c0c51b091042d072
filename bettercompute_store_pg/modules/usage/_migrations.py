"""The ``usage`` module's tables: bookings of atoms, their history, usage records and the accounting watermark."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATIONS"]

# Bookings, which PostgreSQL itself keeps from overlapping (an exclusion constraint; the btree_gist extension,
# shipped with the server, gives gist the text equality), and usage records per tenant, pool and period with the
# watermark of the periods accounted so far.
_V1 = """
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

# Bookings that ended before the accounting watermark, moved out of ``bookings`` by the usage module's history job:
# the exclusion constraint's gist index degrades under churn (DESIGN §12), and a booking that ended is no longer in
# the way of any placement. The columns are ``bookings``' in the same order (the job moves rows with ``SELECT *``);
# no exclusion constraint and no gist index: rows arrive in roughly increasing end order and are only read by ranges
# of their end, hence btree indexes on it, for the readers that still need ended bookings: usage accounting (all
# pools), GPU-hours of a pool (capacity), month sums of a tenant's GPU-hours in a pool (quota checks), and a
# reservation's bookings.
_V2 = """
CREATE TABLE {schema}.bookings_history (
    id bigint PRIMARY KEY,
    atom_id text NOT NULL,
    reservation_id text NOT NULL,
    tenant text NOT NULL,
    pool_id text NOT NULL,
    gpus numeric(9, 6) NOT NULL,
    during tstzrange NOT NULL CHECK (NOT isempty(during) AND NOT lower_inf(during) AND NOT upper_inf(during))
);
CREATE INDEX bookings_history_ended ON {schema}.bookings_history (upper(during));
CREATE INDEX bookings_history_pool ON {schema}.bookings_history (pool_id, upper(during));
CREATE INDEX bookings_history_tenant ON {schema}.bookings_history (pool_id, tenant, upper(during));
CREATE INDEX bookings_history_reservation ON {schema}.bookings_history (reservation_id);
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(version=1, name="bookings and usage", sql=_V1),
    Migration(version=2, name="bookings history", sql=_V2),
)
