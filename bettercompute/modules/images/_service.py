"""The ``images`` group's logic.

An image is projected (``ResourceRef(type="image", id=..., tenant=...)``) in the transaction that registers it, so
``images.get``, which names only the image, is decided on its tenant.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from bettercompute._runtime.registry import CallContext, method
from bettercompute.errors import ConflictError, InvalidInputError, NotFoundError
from bettercompute.modules._tenants import require_tenant
from bettercompute.modules.images._port import IMAGES, ImageRecord, Images
from bettercompute.modules.images._schemas import (
    GetImageInput,
    Image,
    ListImagesInput,
    ListImagesOutput,
    RegisterImageInput,
)
from bettercompute.paging import Keyset
from bettercompute.ports import ResourceRef

__all__ = ["IMAGE", "get_image", "image_view", "list_images", "register_image"]

IMAGE = "image"
"""The resource type of an image (in the authz projection and in audit rows)."""


def image_view(record: ImageRecord) -> Image:
    """The ``Image`` shown for a stored image."""
    kind: Any = record.kind
    disk_format: Any = record.format
    return Image(
        id=record.id,
        tenant=record.tenant,
        name=record.name,
        kind=kind,
        url=record.url,
        sha256=record.sha256,
        size=record.size,
        format=disk_format,
        min_disk_gib=record.min_disk_gib,
        kernel_id=record.kernel_id,
        initrd_id=record.initrd_id,
        cmdline=record.cmdline,
        provider_images=dict(record.provider_images),
        created_by=record.created_by,
        created_at=record.created_at,
    )


def _in_tenant(input: Any) -> ResourceRef:
    return ResourceRef(type=IMAGE, tenant=input.tenant)


def _on_image(input: Any) -> ResourceRef:
    return ResourceRef(type=IMAGE, id=input.id)


async def _boot_part(images: Images, image_id: str | None, kind: str, tenant: str, field: str) -> None:
    """Refuse a ``kernel`` or ``initrd`` reference that is not a registered image of that kind in the tenant."""
    if image_id is None:
        return
    found = await images.get(image_id)
    if found is None or found.tenant != tenant:
        # Another tenant's image is not told apart from none at all.
        raise NotFoundError(f"{field}: no such image in this tenant", details={"path": field, "id": image_id})
    if found.kind != kind:
        raise InvalidInputError(
            f"{field}: the image is a {found.kind}, not a {kind}", details={"path": field, "reason": "wrong kind"}
        )


@method(mutates=True, resource=_in_tenant)
async def register_image(call: CallContext, input: RegisterImageInput) -> Image:
    """Register an image by URL and SHA-256: whoever boots it downloads it and refuses it if the checksum differs.

    Raises:
        InvalidInputError: ``kernel`` or ``initrd`` names an image of another kind.
        NotFoundError: there is no such tenant, or ``kernel`` or ``initrd`` names no image of the tenant.
        ConflictError: the tenant has an image of that name.
    """
    image_id = f"img_{secrets.token_hex(8)}"
    disk_format = input.format or ("raw" if input.kind == "disk" else None)
    async with call.transaction() as tx:
        await require_tenant(tx, input.tenant)
        images = tx.repository(IMAGES)
        # Checked in the inserting transaction; images are never deleted, so what is found stays there.
        await _boot_part(images, input.kernel, "kernel", input.tenant, "kernel")
        await _boot_part(images, input.initrd, "initrd", input.tenant, "initrd")
        record = await images.insert(
            id=image_id,
            tenant=input.tenant,
            name=input.name,
            kind=input.kind,
            url=input.url,
            sha256=input.sha256,
            size=input.size,
            format=disk_format,
            min_disk_gib=input.min_disk_gib,
            kernel_id=input.kernel,
            initrd_id=input.initrd,
            cmdline=input.cmdline,
            provider_images=input.provider_images,
            created_by=call.identity.principal_id if call.identity else None,
        )
        if record is None:
            raise ConflictError("the tenant has an image of that name", details={"path": "name"})
        await tx.project(ResourceRef(type=IMAGE, id=image_id, tenant=input.tenant))
        call.describe(resource_type=IMAGE, resource_id=image_id, tenant=input.tenant, details={"kind": input.kind})
    return image_view(record)


_PAGES: Keyset[Image] = Keyset(dt.datetime, str, key=lambda i: (i.created_at, i.id))


@method(mutates=False, resource=_in_tenant)
async def list_images(call: CallContext, input: ListImagesInput) -> ListImagesOutput:
    """A page of a tenant's images, oldest first.

    Raises:
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _PAGES.after(scope, input.cursor)
    records = await call.context.store.repository(IMAGES).list(input.tenant, after=after, limit=input.limit + 1)
    images, next_cursor = _PAGES.page(scope, [image_view(r) for r in records], input.limit)
    return ListImagesOutput(images=images, next_cursor=next_cursor)


@method(mutates=False, resource=_on_image)
async def get_image(call: CallContext, input: GetImageInput) -> Image:
    """An image by id.

    Raises:
        NotFoundError: there is no such image.
    """
    record = await call.context.store.repository(IMAGES).get(input.id)
    if record is None:
        raise NotFoundError("no such image", details={"id": input.id})
    return image_view(record)
