"""The SSRF guard: internal destinations refused at ``create``, and again at send time after a fresh DNS lookup."""

from __future__ import annotations

import ipaddress
from typing import Any

import httpx
import pytest

from bettercompute import BetterCompute
from bettercompute.errors import InvalidInputError
from bettercompute.modules.webhooks import (
    CreateWebhookInput,
    ListDeliveriesInput,
    ListWebhooksInput,
    WebhooksGroup,
    WebhookTestInput,
    _guard,
)

from .conftest import Hooks, Receiver

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

INTERNAL = [
    "http://127.0.0.1/",
    "http://10.0.0.1/",
    "http://169.254.169.254/latest",
    "http://[::1]/",
    "http://localhost:8080/",
    "http://api.localhost/h",
    "http://LOCALHOST./h",
    "http://192.168.1.10:8080/h",
    "http://0.0.0.0/",
    "http://[::ffff:127.0.0.1]/",
    "http://[fe80::1]/",
    "http://224.0.0.1/",
    "http://100.64.0.1/",
    "http://2130706433/",  # 127.0.0.1 in the decimal form resolvers accept
    "http://127.1/",
    "http://0x7f.0.0.1/",
]


def _api(compute: BetterCompute) -> WebhooksGroup[Any]:
    group: WebhooksGroup[Any] = compute.api.group(WebhooksGroup)
    return group


@pytest.mark.parametrize("url", INTERNAL)
async def test_create_refuses_an_internal_destination_by_default(
    hooks: Hooks, guarded: BetterCompute, url: str
) -> None:
    with pytest.raises(InvalidInputError) as info:
        await _api(guarded).create(hooks.alice, CreateWebhookInput(tenant=hooks.acme, url=url))
    assert info.value.details["path"] == "url"
    # Allowed explicitly (the hooks fixture's settings), the same URL is accepted.
    await hooks.subscribe(url)


async def test_the_refusal_over_http_is_invalid_input_at_url(hooks: Hooks, guarded: BetterCompute) -> None:
    transport = httpx.ASGITransport(app=guarded.asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        response = await http.post(
            "/api/compute/webhooks/create",
            headers={"authorization": f"Bearer {hooks.alice}"},
            json={"tenant": hooks.acme, "url": "http://169.254.169.254/latest/meta-data/"},
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == "url"
    assert "169.254" not in error["message"]


@pytest.mark.parametrize(
    "url", ["https://hooks.example.com/h", "http://93.184.216.34:8080/h", "https://[2606:4700::1]/"]
)
async def test_create_accepts_a_public_destination(hooks: Hooks, guarded: BetterCompute, url: str) -> None:
    created = await _api(guarded).create(hooks.alice, CreateWebhookInput(tenant=hooks.acme, url=url))
    assert created.webhook.url == url


async def _send_once(hooks: Hooks, guarded: BetterCompute, webhook_id: str) -> Any:
    await _api(guarded).test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=webhook_id))
    await guarded.jobs.tick({"sinks"})
    log = await _api(guarded).deliveries(hooks.alice, ListDeliveriesInput(tenant=hooks.acme, id=webhook_id))
    (delivery,) = log.deliveries
    return delivery


async def test_a_subscription_made_while_allowed_is_refused_at_send_time(
    hooks: Hooks, guarded: BetterCompute, receiver: Receiver
) -> None:
    webhook_id, _ = await hooks.subscribe(receiver.url)  # created with allow_private_destinations=True
    delivery = await _send_once(hooks, guarded, webhook_id)
    assert delivery.status == "pending" and delivery.attempts == 1
    assert delivery.last_error == "destination address not allowed"
    assert delivery.last_status is None
    assert receiver.connections == 0 and receiver.received == []


async def test_a_name_that_now_resolves_to_loopback_is_refused_without_a_connection(
    hooks: Hooks, guarded: BetterCompute, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A public-looking name passes create; then its DNS answer turns to loopback (rebinding).
    url = f"http://rebind.example.com:{receiver.port}/hook"
    created = await _api(guarded).create(hooks.alice, CreateWebhookInput(tenant=hooks.acme, url=url))
    looked_up: list[str] = []

    async def rebound(host: str, port: int) -> list[_guard.Address]:
        looked_up.append(host)
        return [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("127.0.0.1")]

    monkeypatch.setattr(_guard, "resolve", rebound)
    delivery = await _send_once(hooks, guarded, created.webhook.id)
    assert looked_up == ["rebind.example.com"]
    assert delivery.last_error == "destination address not allowed"
    assert receiver.connections == 0 and receiver.received == []


async def test_a_name_that_does_not_resolve_is_a_failed_attempt(hooks: Hooks, guarded: BetterCompute) -> None:
    created = await _api(guarded).create(
        hooks.alice, CreateWebhookInput(tenant=hooks.acme, url="https://no-such-host.invalid/h")
    )
    delivery = await _send_once(hooks, guarded, created.webhook.id)
    assert delivery.status == "pending" and delivery.attempts == 1
    assert delivery.last_error == "the destination host name does not resolve"


# Spellings that an earlier parser let through: read as httpx reads them, each is internal or unreadable.
DISGUISED = [
    "http://127\u30020\u30020\u30021/",  # ideographic full stops: httpx reads 127.0.0.1
    "http://127\uff0e0\uff0e0\uff0e1/",  # full-width full stops
    "http://\uff11\uff12\uff17.0.0.1/",  # full-width digits: no client can read it
    "http://\u0661\u0662\u0667.0.0.1/",  # Arabic-Indic digits
    "http://\u0967\u0968\u096d.0.0.1/",  # Devanagari digits: IDNA takes them as letters
    "http://127.0.0.1./",
    "http://2130706433./",
    "http://[::ffff:7f00:1]/",
    "http://[2002:a9fe:a9fe::]/",  # 6to4 of 169.254.169.254
    "http://[64:ff9b::a00:1]/",  # NAT64 of 10.0.0.1
    "http://[2606:4700::1%25eth0]/",  # a zone id
    "http://127.0.0.1\u200e/",  # a left-to-right mark
    "http://1.2.3.4.5/",
]


@pytest.mark.parametrize("url", DISGUISED)
async def test_create_reads_the_url_as_the_sender_does(hooks: Hooks, guarded: BetterCompute, url: str) -> None:
    transport = httpx.ASGITransport(app=guarded.asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        response = await http.post(
            "/api/compute/webhooks/create",
            headers={"authorization": f"Bearer {hooks.alice}"},
            json={"tenant": hooks.acme, "url": url},
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == "url"
    assert url not in response.text
    listed = await _api(guarded).list(hooks.alice, ListWebhooksInput(tenant=hooks.acme))
    assert listed.webhooks == ()  # nothing half-written


@pytest.mark.parametrize("url", ["http://\uff11\uff12\uff17.0.0.1/", "http://a..b/", "http://hooks\u202e.example.com/"])
async def test_a_url_the_sender_cannot_read_is_refused_even_where_private_is_allowed(hooks: Hooks, url: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        await hooks.subscribe(url)
    assert info.value.details["path"] == "url"


async def test_the_stored_url_is_the_one_the_sender_uses(hooks: Hooks, guarded: BetterCompute) -> None:
    created = await _api(guarded).create(
        hooks.alice, CreateWebhookInput(tenant=hooks.acme, url="https://Hooks\u3002B\u00fccher.DE/In?x=1")
    )
    assert created.webhook.url == "https://hooks.xn--bcher-kva.de/In?x=1"
