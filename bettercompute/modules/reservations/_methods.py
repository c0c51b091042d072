"""The ``reservations`` group's declaration (actions ``compute:reservations:<method>``)."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.reservations import _service

B = TypeVar("B")


class ReservationsGroup(GroupSpec[B]):
    """GPUs of a pool for a time: admitted (quota, placement, bookings) at create, bound through the nodes' desired
    state, active from their start, ended at their end."""

    name = "reservations"
    create = _service.create_reservation
    get = _service.get_reservation
    list = _service.list_reservations
    cancel = _service.cancel_reservation
    extend = _service.extend_reservation
    explain = _service.explain_reservation


ACTIONS = tuple(sorted(m.action for m in ReservationsGroup.methods.values()))
