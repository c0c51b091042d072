"""What the ``images`` module needs of a store: one repository, ``IMAGES``, and its record."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository

__all__ = ["IMAGES", "ImageRecord", "Images"]


@attrs.frozen(kw_only=True)
class ImageRecord:
    """A stored image.

    ``kind`` is ``kernel``, ``initrd`` or ``disk``. Only a disk image has a ``format`` (``raw`` or ``qcow2``),
    ``min_disk_gib``, ``kernel_id`` and ``initrd_id`` (registered images of the same tenant it boots with, by direct
    kernel boot) and ``provider_images`` (provider name to the provider's own image id). ``created_by`` is the
    principal that registered it, ``None`` when unknown (images carried over from before it was recorded).
    """

    id: str
    tenant: str
    name: str
    kind: str
    url: str
    sha256: str
    size: int | None
    format: str | None
    min_disk_gib: int | None
    kernel_id: str | None
    initrd_id: str | None
    cmdline: str | None
    provider_images: Mapping[str, str] = attrs.field(factory=dict)
    created_by: str | None
    created_at: dt.datetime


class Images(Protocol):
    """The image registry. Images are never changed or deleted once registered, so a read outside a transaction
    stays true. ``insert`` needs a transaction (it rolls back with the call's audit row); the reads do not."""

    async def get(self, image_id: str) -> ImageRecord | None:
        """The image with this id, in any tenant; ``None`` when there is none."""
        ...

    async def list(self, tenant: str, after: Sequence[Any] | None = None, limit: int = 100) -> list[ImageRecord]:
        """Up to ``limit`` of the tenant's images in ``(created_at, id)`` order, after the key ``after`` (a
        ``(created_at, id)`` pair) when given."""
        ...

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
        """Add an image; ``None`` (and nothing written) when the tenant has an image of that name. The caller has
        checked ``kernel_id`` and ``initrd_id``; the store refuses an id that names no image."""
        ...


IMAGES: Repository[Images] = Repository(module="images", name="images")
