"""Capacity version 1: the quota rows."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATION"]

# One row per pool and tenant; the empty tenant is the pool's default (a primary key cannot hold null, and no
# tenant id is empty). A null limit is unlimited.
_V1 = """
CREATE TABLE {schema}.quotas (
    pool_id text NOT NULL REFERENCES {schema}.pools (id),
    tenant text NOT NULL,
    max_gpus integer CHECK (max_gpus BETWEEN 0 AND 1000000),
    max_gpu_hours_per_month double precision
        CHECK (max_gpu_hours_per_month BETWEEN 0 AND 744000000),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool_id, tenant)
);
"""

MIGRATION = Migration(version=1, name="quotas", sql=_V1)
