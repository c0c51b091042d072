"""The image registry (``Images``) on the ``images`` table: one statement per call."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bettercompute.modules.images import ImageRecord
from bettercompute_store_pg._db import Database, dumps, utc
from bettercompute_store_pg._repository import PgRepository

__all__ = ["REPOSITORIES", "PgImages"]

_COLUMNS = (
    "id, tenant, name, kind, url, sha256, size, format, min_disk_gib, kernel_id, initrd_id, cmdline, provider_images,"
    " created_by, created_at"
)

_INSERT = f"""
INSERT INTO {{s}}.images (id, tenant, name, kind, url, sha256, size, format, min_disk_gib, kernel_id, initrd_id,
    cmdline, provider_images, created_by)
VALUES (:id, :tenant, :name, :kind, :url, :sha256, :size, :format, :min_disk_gib, :kernel_id, :initrd_id, :cmdline,
    CAST(:provider_images AS jsonb), :created_by)
ON CONFLICT (tenant, name) DO NOTHING
RETURNING {_COLUMNS}
"""

_GET = f"SELECT {_COLUMNS} FROM {{s}}.images WHERE id = :id"

# Keyset paging on (created_at, id): unique and never changed.
_LIST = f"""
SELECT {_COLUMNS} FROM {{s}}.images
WHERE tenant = :tenant AND (CAST(:after_at AS timestamptz) IS NULL OR (created_at, id) > (:after_at, :after_id))
ORDER BY created_at, id LIMIT :limit
"""


def _image(row: Any) -> ImageRecord:
    return ImageRecord(
        id=row.id,
        tenant=row.tenant,
        name=row.name,
        kind=row.kind,
        url=row.url,
        sha256=row.sha256,
        size=row.size,
        format=row.format,
        min_disk_gib=row.min_disk_gib,
        kernel_id=row.kernel_id,
        initrd_id=row.initrd_id,
        cmdline=row.cmdline,
        provider_images=dict(row.provider_images),
        created_by=row.created_by,
        created_at=utc(row.created_at),
    )


class PgImages(PgRepository):
    """``Images`` on the ``images`` table."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._insert = db.sql(_INSERT)
        self._get = db.sql(_GET)
        self._list = db.sql(_LIST)

    async def get(self, image_id: str) -> ImageRecord | None:
        rows = await self._fetch(self._get, {"id": image_id})
        return _image(rows[0]) if rows else None

    async def list(self, tenant: str, after: Sequence[Any] | None = None, limit: int = 100) -> list[ImageRecord]:
        after_at, after_id = after if after is not None else (None, None)
        params = {"tenant": tenant, "after_at": after_at, "after_id": after_id, "limit": limit}
        return [_image(r) for r in await self._fetch(self._list, params)]

    async def insert(
        self,
        *,
        id: str,
        tenant: str,
        name: str,
        kind: str,
        url: str,
        sha256: str,
        size: int | None,
        format: str | None = None,
        min_disk_gib: int | None = None,
        kernel_id: str | None = None,
        initrd_id: str | None = None,
        cmdline: str | None = None,
        provider_images: Mapping[str, str] | None = None,
        created_by: str | None = None,
    ) -> ImageRecord | None:
        params = {
            "id": id,
            "tenant": tenant,
            "name": name,
            "kind": kind,
            "url": url,
            "sha256": sha256,
            "size": size,
            "format": format,
            "min_disk_gib": min_disk_gib,
            "kernel_id": kernel_id,
            "initrd_id": initrd_id,
            "cmdline": cmdline,
            "provider_images": dumps(dict(provider_images or {})),
            "created_by": created_by,
        }
        rows = await self._fetch_in_transaction("insert", self._insert, params)
        return _image(rows[0]) if rows else None


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"images": PgImages}
"""The adapters of this module's repositories, by ``Repository.name``."""
