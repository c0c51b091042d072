"""The ``webhooks`` group: signed HTTP callbacks of a tenant's committed events, and how a receiver verifies them."""

from bettercompute.modules.webhooks._methods import ACTIONS as ACTIONS
from bettercompute.modules.webhooks._methods import WebhooksGroup as WebhooksGroup
from bettercompute.modules.webhooks._module import RETENTION as RETENTION
from bettercompute.modules.webhooks._module import SENDER as SENDER
from bettercompute.modules.webhooks._module import WebhooksModule as WebhooksModule
from bettercompute.modules.webhooks._port import SEALED_PREVIOUS_WEBHOOK_SECRETS as SEALED_PREVIOUS_WEBHOOK_SECRETS
from bettercompute.modules.webhooks._port import SEALED_WEBHOOK_SECRETS as SEALED_WEBHOOK_SECRETS
from bettercompute.modules.webhooks._port import WEBHOOKS as WEBHOOKS
from bettercompute.modules.webhooks._port import DeliveryOutcome as DeliveryOutcome
from bettercompute.modules.webhooks._port import DueDelivery as DueDelivery
from bettercompute.modules.webhooks._port import WebhookDelivery as WebhookDelivery
from bettercompute.modules.webhooks._port import Webhooks as Webhooks
from bettercompute.modules.webhooks._port import WebhookSubscription as WebhookSubscription
from bettercompute.modules.webhooks._schemas import CreatedWebhook as CreatedWebhook
from bettercompute.modules.webhooks._schemas import CreateWebhookInput as CreateWebhookInput
from bettercompute.modules.webhooks._schemas import DeleteWebhookInput as DeleteWebhookInput
from bettercompute.modules.webhooks._schemas import DeleteWebhookOutput as DeleteWebhookOutput
from bettercompute.modules.webhooks._schemas import Delivery as Delivery
from bettercompute.modules.webhooks._schemas import ListDeliveriesInput as ListDeliveriesInput
from bettercompute.modules.webhooks._schemas import ListDeliveriesOutput as ListDeliveriesOutput
from bettercompute.modules.webhooks._schemas import ListWebhooksInput as ListWebhooksInput
from bettercompute.modules.webhooks._schemas import ListWebhooksOutput as ListWebhooksOutput
from bettercompute.modules.webhooks._schemas import RotateWebhookSecretInput as RotateWebhookSecretInput
from bettercompute.modules.webhooks._schemas import Webhook as Webhook
from bettercompute.modules.webhooks._schemas import WebhookTestInput as WebhookTestInput
from bettercompute.modules.webhooks._schemas import WebhookTestOutput as WebhookTestOutput
from bettercompute.modules.webhooks._service import secret_context as secret_context
from bettercompute.modules.webhooks._signing import DEFAULT_TOLERANCE as DEFAULT_TOLERANCE
from bettercompute.modules.webhooks._signing import EVENT_ID_HEADER as EVENT_ID_HEADER
from bettercompute.modules.webhooks._signing import EVENT_TYPE_HEADER as EVENT_TYPE_HEADER
from bettercompute.modules.webhooks._signing import SIGNATURE_HEADER as SIGNATURE_HEADER
from bettercompute.modules.webhooks._signing import STANDARD_ID_HEADER as STANDARD_ID_HEADER
from bettercompute.modules.webhooks._signing import STANDARD_SIGNATURE_HEADER as STANDARD_SIGNATURE_HEADER
from bettercompute.modules.webhooks._signing import STANDARD_TIMESTAMP_HEADER as STANDARD_TIMESTAMP_HEADER
from bettercompute.modules.webhooks._signing import WebhookSettings as WebhookSettings
from bettercompute.modules.webhooks._signing import WebhookVerificationError as WebhookVerificationError
from bettercompute.modules.webhooks._signing import sign as sign
from bettercompute.modules.webhooks._signing import signature_header as signature_header
from bettercompute.modules.webhooks._signing import standard_headers as standard_headers
from bettercompute.modules.webhooks._signing import standard_signature as standard_signature
from bettercompute.modules.webhooks._signing import verify as verify

__all__ = [
    "ACTIONS",
    "DEFAULT_TOLERANCE",
    "EVENT_ID_HEADER",
    "EVENT_TYPE_HEADER",
    "RETENTION",
    "SEALED_PREVIOUS_WEBHOOK_SECRETS",
    "SEALED_WEBHOOK_SECRETS",
    "SENDER",
    "SIGNATURE_HEADER",
    "STANDARD_ID_HEADER",
    "STANDARD_SIGNATURE_HEADER",
    "STANDARD_TIMESTAMP_HEADER",
    "WEBHOOKS",
    "CreateWebhookInput",
    "CreatedWebhook",
    "DeleteWebhookInput",
    "DeleteWebhookOutput",
    "Delivery",
    "DeliveryOutcome",
    "DueDelivery",
    "ListDeliveriesInput",
    "ListDeliveriesOutput",
    "ListWebhooksInput",
    "ListWebhooksOutput",
    "RotateWebhookSecretInput",
    "Webhook",
    "WebhookDelivery",
    "WebhookSettings",
    "WebhookSubscription",
    "WebhookTestInput",
    "WebhookTestOutput",
    "WebhookVerificationError",
    "Webhooks",
    "WebhooksGroup",
    "WebhooksModule",
    "secret_context",
    "sign",
    "signature_header",
    "standard_headers",
    "standard_signature",
    "verify",
]
