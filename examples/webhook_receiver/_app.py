"""The receiver's application: one route, verification first, duplicates dropped by event id."""

from __future__ import annotations

import json
import os
from typing import Any

import attrs
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bettercompute.webhooks import STANDARD_ID_HEADER, WebhookVerificationError, verify

__all__ = ["Inbox", "app_from_env", "make_app"]

PATH = "/hooks/bettercompute"


@attrs.define
class Inbox:
    """What the receiver accepted, once per event (a real one would queue the work and keep the ids in a table)."""

    events: list[dict[str, Any]] = attrs.Factory(list)
    seen: set[str] = attrs.Factory(set)
    duplicates: int = 0
    refused: int = 0


def make_app(secret: str, inbox: Inbox | None = None) -> Starlette:
    """The receiver for one subscription's ``secret``; what it accepts goes to ``inbox``."""
    kept = inbox if inbox is not None else Inbox()

    async def receive(request: Request) -> Response:
        body = await request.body()
        try:
            verify(secret, request.headers, body)
        except WebhookVerificationError as exc:
            kept.refused += 1
            return JSONResponse({"error": exc.details.get("reason", "refused")}, status_code=400)
        event_id = request.headers[STANDARD_ID_HEADER]
        if event_id in kept.seen:
            kept.duplicates += 1
            return Response(status_code=204)
        kept.seen.add(event_id)
        kept.events.append(json.loads(body))
        return Response(status_code=204)

    app = Starlette(routes=[Route(PATH, receive, methods=["POST"])])
    app.state.inbox = kept
    return app


def app_from_env() -> Starlette:
    """``make_app`` with the secret from ``WEBHOOK_SECRET`` (for ``uvicorn --factory``)."""
    return make_app(os.environ["WEBHOOK_SECRET"])
