"""An example webhook receiver: a Starlette application that accepts Better Compute's deliveries.

What a receiver must do, in order, for every request:

1. read the raw body, before any JSON parsing (the signature covers the exact bytes);
2. verify it against the subscription's secret (``bettercompute.webhooks.verify``, or the Standard Webhooks library:
   ``standardwebhooks.Webhook(secret).verify(body, headers)``), and answer 400 without acting when that fails;
3. drop a delivery whose ``webhook-id`` it has already handled (delivery is at least once: a retry after a lost
   answer repeats it), and answer 2xx quickly, doing slow work after answering.

Run it with ``uvicorn --factory examples.webhook_receiver:app_from_env`` and ``WEBHOOK_SECRET=whsec_...``; create
the subscription with ``webhooks/create`` pointing at ``http://<host>:<port>/hooks/bettercompute``.
"""

from examples.webhook_receiver._app import Inbox as Inbox
from examples.webhook_receiver._app import app_from_env as app_from_env
from examples.webhook_receiver._app import make_app as make_app

__all__ = ["Inbox", "app_from_env", "make_app"]
