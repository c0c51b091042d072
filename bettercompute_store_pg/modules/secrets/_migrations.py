"""The ``secrets`` module's table (made only where the module is on, with a KMS)."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATIONS"]

# The value only as the KMS sealed it, bound to tenant and name.
_V1 = """
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

MIGRATIONS: tuple[Migration, ...] = (Migration(version=1, name="secrets", sql=_V1),)
