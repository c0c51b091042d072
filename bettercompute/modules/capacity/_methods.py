"""The ``quotas`` and ``capacity`` groups' declarations (actions ``compute:<group>:<method>``)."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.capacity import _service

B = TypeVar("B")


class QuotasGroup(GroupSpec[B]):
    """Per pool and tenant: GPUs held at once, GPU-hours per calendar month and the longest reservation, enforced
    when reservations are admitted."""

    name = "quotas"
    set = _service.set_quota
    get = _service.get_quota
    list = _service.list_quotas


class CapacityGroup(GroupSpec[B]):
    """A pool's atoms now and what is booked over a window, for a calendar view."""

    name = "capacity"
    get = _service.get_capacity


ACTIONS = tuple(sorted(m.action for g in (QuotasGroup, CapacityGroup) for m in g.methods.values()))
