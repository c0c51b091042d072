"""The ``webhooks`` group: signed HTTP callbacks of a tenant's committed events (see ``bettercompute.webhooks``)."""

from ._methods import ACTIONS as ACTIONS
from ._methods import WebhooksGroup as WebhooksGroup
from ._module import RETENTION as RETENTION
from ._module import SENDER as SENDER
from ._module import WebhooksModule as WebhooksModule
from ._schemas import CreatedWebhook as CreatedWebhook
from ._schemas import CreateWebhookInput as CreateWebhookInput
from ._schemas import DeleteWebhookInput as DeleteWebhookInput
from ._schemas import DeleteWebhookOutput as DeleteWebhookOutput
from ._schemas import Delivery as Delivery
from ._schemas import ListDeliveriesInput as ListDeliveriesInput
from ._schemas import ListDeliveriesOutput as ListDeliveriesOutput
from ._schemas import ListWebhooksInput as ListWebhooksInput
from ._schemas import ListWebhooksOutput as ListWebhooksOutput
from ._schemas import Webhook as Webhook
from ._schemas import WebhookTestInput as WebhookTestInput
from ._schemas import WebhookTestOutput as WebhookTestOutput

__all__ = [
    "ACTIONS",
    "RETENTION",
    "SENDER",
    "CreateWebhookInput",
    "CreatedWebhook",
    "DeleteWebhookInput",
    "DeleteWebhookOutput",
    "Delivery",
    "ListDeliveriesInput",
    "ListDeliveriesOutput",
    "ListWebhooksInput",
    "ListWebhooksOutput",
    "Webhook",
    "WebhookTestInput",
    "WebhookTestOutput",
    "WebhooksGroup",
    "WebhooksModule",
]
