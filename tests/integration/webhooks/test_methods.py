"""The ``webhooks`` group's methods: the secret once, listing, deletion, audit, and every bad input refused."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from bettercompute.errors import AccessDeniedError, NotFoundError
from bettercompute.modules.webhooks import (
    CreateWebhookInput,
    DeleteWebhookInput,
    ListDeliveriesInput,
    ListWebhooksInput,
    WebhookTestInput,
)

from .conftest import Hooks

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_create_shows_the_secret_once_and_list_never(hooks: Hooks) -> None:
    created = await hooks.api.create(
        hooks.alice,
        CreateWebhookInput(tenant=hooks.acme, url="https://example.test/h", event_types=("node.*",), description="d"),
    )
    assert created.secret.startswith("whsec_") and len(created.secret) > 40
    assert "whsec_" not in repr(created)
    listed = await hooks.api.list(hooks.alice, ListWebhooksInput(tenant=hooks.acme))
    assert listed.webhooks == (created.webhook,)
    response = await hooks.http.post(
        "/api/compute/webhooks/list", headers={"authorization": f"Bearer {hooks.alice}"}, json={"tenant": hooks.acme}
    )
    assert response.status_code == 200 and "whsec_" not in response.text
    # Another tenant's list does not show it.
    assert (await hooks.api.list(hooks.mallory, ListWebhooksInput(tenant=hooks.globex))).webhooks == ()


async def test_each_mutation_writes_its_audit_row(hooks: Hooks, database_url: str) -> None:
    webhook_id, _ = await hooks.subscribe("http://127.0.0.1:9/h")
    await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=webhook_id))
    await hooks.api.delete(hooks.alice, DeleteWebhookInput(tenant=hooks.acme, id=webhook_id))
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            f'SELECT action, tenant, resource_id, decision_id FROM "{hooks.store.schema}".audit'
            " WHERE resource_type = 'webhook' ORDER BY id"
        ).fetchall()
    assert [r[0] for r in rows] == ["compute:webhooks:create", "compute:webhooks:test", "compute:webhooks:delete"]
    assert all(r[1] == hooks.acme and r[2] == webhook_id and r[3] for r in rows)
    assert (await hooks.api.list(hooks.alice, ListWebhooksInput(tenant=hooks.acme))).webhooks == ()


async def _create_over_http(hooks: Hooks, body: dict[str, Any]) -> dict[str, Any]:
    # Over HTTP: in-process, the attrs validators refuse to even build such an input.
    response = await hooks.http.post(
        "/api/compute/webhooks/create", headers={"authorization": f"Bearer {hooks.alice}"}, json=body
    )
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "INVALID_INPUT"
    return error


@pytest.mark.parametrize(
    "url",
    ["ftp://example.test/h", "file:///etc/passwd", "example.test/h", "https://", "https://u:p@example.test/h", ""],
)
async def test_a_url_that_is_not_http_is_refused(hooks: Hooks, url: str) -> None:
    error = await _create_over_http(hooks, {"tenant": hooks.acme, "url": url})
    assert error["details"]["path"] == "url"
    with pytest.raises(ValueError, match=r"URL|user name"):
        CreateWebhookInput(tenant=hooks.acme, url=url)


@pytest.mark.parametrize("pattern", ["Reservation.created", "reservation.", "*.created", "reservation.*.x", "a b"])
async def test_an_invalid_event_type_pattern_is_refused(hooks: Hooks, pattern: str) -> None:
    body = {"tenant": hooks.acme, "url": "https://example.test/h", "event_types": ["node.*", pattern]}
    error = await _create_over_http(hooks, body)
    assert error["details"]["path"] == "event_types"
    assert (await hooks.api.list(hooks.alice, ListWebhooksInput(tenant=hooks.acme))).webhooks == ()


async def test_an_unknown_subscription_is_not_found(hooks: Hooks) -> None:
    for call in (
        hooks.api.delete(hooks.alice, DeleteWebhookInput(tenant=hooks.acme, id="wh_missing")),
        hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id="wh_missing")),
        hooks.api.deliveries(hooks.alice, ListDeliveriesInput(tenant=hooks.acme, id="wh_missing")),
    ):
        with pytest.raises(NotFoundError):
            await call


async def test_another_tenant_is_refused_before_the_handler(hooks: Hooks) -> None:
    webhook_id, _ = await hooks.subscribe("https://example.test/h")
    # Mallory (globex) names acme: the core's tenant pre-check refuses it.
    with pytest.raises(AccessDeniedError):
        await hooks.api.list(hooks.mallory, ListWebhooksInput(tenant=hooks.acme))
    with pytest.raises(AccessDeniedError):
        await hooks.api.delete(hooks.mallory, DeleteWebhookInput(tenant=hooks.acme, id=webhook_id))
    with pytest.raises(AccessDeniedError):
        await hooks.api.create(hooks.mallory, CreateWebhookInput(tenant=hooks.acme, url="https://evil.test/h"))
    # Naming her own tenant with acme's subscription id finds nothing there.
    with pytest.raises(NotFoundError):
        await hooks.api.delete(hooks.mallory, DeleteWebhookInput(tenant=hooks.globex, id=webhook_id))
    assert len((await hooks.api.list(hooks.alice, ListWebhooksInput(tenant=hooks.acme))).webhooks) == 1
