"""For a webhook receiver: ``verify`` a delivery on the Standard Webhooks rules (the same as the specification's
libraries apply), with the names it needs. The sending side is the ``webhooks`` module
(``bettercompute.modules.webhooks``)."""

from __future__ import annotations

from bettercompute.modules.webhooks import DEFAULT_TOLERANCE as DEFAULT_TOLERANCE
from bettercompute.modules.webhooks import STANDARD_ID_HEADER as STANDARD_ID_HEADER
from bettercompute.modules.webhooks import STANDARD_SIGNATURE_HEADER as STANDARD_SIGNATURE_HEADER
from bettercompute.modules.webhooks import STANDARD_TIMESTAMP_HEADER as STANDARD_TIMESTAMP_HEADER
from bettercompute.modules.webhooks import WebhookVerificationError as WebhookVerificationError
from bettercompute.modules.webhooks import verify as verify

__all__ = [
    "DEFAULT_TOLERANCE",
    "STANDARD_ID_HEADER",
    "STANDARD_SIGNATURE_HEADER",
    "STANDARD_TIMESTAMP_HEADER",
    "WebhookVerificationError",
    "verify",
]
