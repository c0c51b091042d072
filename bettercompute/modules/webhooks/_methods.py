"""The ``webhooks`` group's declaration (actions ``compute:webhooks:<method>``)."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.webhooks import _service

B = TypeVar("B")


class WebhooksGroup(GroupSpec[B]):
    """Signed HTTP callbacks of a tenant's events."""

    name = "webhooks"
    create = _service.create
    list = _service.list_webhooks
    rotate_secret = _service.rotate_secret
    delete = _service.delete
    test = _service.test
    deliveries = _service.deliveries


ACTIONS = tuple(sorted(m.action for m in WebhooksGroup.methods.values()))
