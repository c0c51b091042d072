"""The ``images`` group's declaration (actions ``compute:images:<method>``)."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.images import _service

B = TypeVar("B")


class ImagesGroup(GroupSpec[B]):
    """Images to boot (kernels, initrds, disk images), fetched by URL, checked by SHA-256; for bare metal and VPS."""

    name = "images"
    register = _service.register_image
    list = _service.list_images
    get = _service.get_image


ACTIONS = tuple(sorted(m.action for m in ImagesGroup.methods.values()))
