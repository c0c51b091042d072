"""The ``devices`` group's declaration (actions ``compute:devices:<method>``)."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.inventory import _service

B = TypeVar("B")


class DevicesGroup(GroupSpec[B]):
    """The devices of joined machines and the atoms they make."""

    name = "devices"
    list = _service.list_devices
    get = _service.get_device


ACTIONS = tuple(sorted(m.action for m in DevicesGroup.methods.values()))
