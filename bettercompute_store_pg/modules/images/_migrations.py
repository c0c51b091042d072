"""The ``images`` module's table: the image registry bare metal and VPS share."""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = ["MIGRATIONS"]

# One name per tenant; paged by tenant in (created_at, id) order. Rows are never updated or deleted, so what a
# module read of an image stays true. What only a disk image has is checked here too, and a disk's kernel and
# initrd must be images of this table (their kind and tenant are checked by the method, in the same transaction).
_V1 = """
CREATE TABLE {schema}.images (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    name text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('kernel', 'initrd', 'disk')),
    url text NOT NULL CHECK (url ~ '^(https?://|file:///)'),
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size bigint CHECK (size > 0),
    format text CHECK (format IN ('raw', 'qcow2')),
    min_disk_gib integer CHECK (min_disk_gib > 0),
    kernel_id text REFERENCES {schema}.images (id),
    initrd_id text REFERENCES {schema}.images (id),
    cmdline text CHECK (length(cmdline) BETWEEN 1 AND 1024),
    provider_images jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(provider_images) = 'object'),
    created_by text,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, name),
    CHECK ((kind = 'disk') = (format IS NOT NULL)),
    CHECK (kind = 'disk' OR (min_disk_gib IS NULL AND kernel_id IS NULL AND initrd_id IS NULL
                             AND provider_images = '{}'))
);
CREATE INDEX images_page ON {schema}.images (tenant, created_at, id);
"""

MIGRATIONS: tuple[Migration, ...] = (Migration(version=1, name="images", sql=_V1),)
