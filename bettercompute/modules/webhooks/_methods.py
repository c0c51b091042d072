"""The ``webhooks`` group's declaration (actions ``compute:webhooks:<method>``)."""

from __future__ import annotations

from typing import Any, TypeVar

from bettercompute._runtime.registry import GroupSpec, MethodDef
from bettercompute.modules.webhooks import _service
from bettercompute.modules.webhooks._schemas import (
    CreatedWebhook,
    CreateWebhookInput,
    DeleteWebhookInput,
    DeleteWebhookOutput,
    ListDeliveriesInput,
    ListDeliveriesOutput,
    ListWebhooksInput,
    ListWebhooksOutput,
    WebhookTestInput,
    WebhookTestOutput,
)
from bettercompute.ports import ResourceRef

B = TypeVar("B")


def _tenant(input: Any) -> ResourceRef:
    # Every input names its tenant: the core's pre-check refuses another tenant's caller before the database.
    return ResourceRef(type="webhook", id=getattr(input, "id", None), tenant=input.tenant)


class WebhooksGroup(GroupSpec[B]):
    """Signed HTTP callbacks of a tenant's events."""

    name = "webhooks"
    create = MethodDef(
        input=CreateWebhookInput, output=CreatedWebhook, handler=_service.create, mutates=True, resource=_tenant
    )
    list = MethodDef(
        input=ListWebhooksInput,
        output=ListWebhooksOutput,
        handler=_service.list_webhooks,
        mutates=False,
        resource=_tenant,
    )
    delete = MethodDef(
        input=DeleteWebhookInput, output=DeleteWebhookOutput, handler=_service.delete, mutates=True, resource=_tenant
    )
    test = MethodDef(
        input=WebhookTestInput, output=WebhookTestOutput, handler=_service.test, mutates=True, resource=_tenant
    )
    deliveries = MethodDef(
        input=ListDeliveriesInput,
        output=ListDeliveriesOutput,
        handler=_service.deliveries,
        mutates=False,
        resource=_tenant,
    )


ACTIONS = tuple(sorted(m.action for m in WebhooksGroup.methods.values()))
