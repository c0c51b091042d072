"""The ``webhooks`` group's logic, the fan-out of committed events, and the sender.

Events reach webhooks through the core's ``events`` dispatcher: after an event's transaction commits, ``fan_out``
queues one delivery per matching subscription of the event's tenant (database writes only). The sender (the job
``sinks/webhooks``) claims due deliveries and POSTs them outside any transaction, then records each outcome. A pass
takes the tenants in turns, a bounded share each (``WebhookSettings.max_per_tenant``), and whatever one attempt
raises is that delivery's failed attempt, so one tenant's failing or poisoned deliveries cannot hold up another's. The
job ``sinks/webhooks-retention`` deletes finished deliveries past ``WebhookSettings.retention``.
Unless ``WebhookSettings.allow_private_destinations`` is set, internal destinations are refused at ``create`` and
again, after a fresh DNS lookup, before every attempt (``_guard``).

An event is delivered to the webhooks of the tenant named by ``payload["tenant"]``; an event without one (a
system event) goes to no webhook. Publish tenant-scoped events with ``Events.event(type, key, tenant=..., ...)``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import random
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from bettercompute._runtime.registry import CallContext, method
from bettercompute._runtime.workers import SINKS_POKE, notify_work
from bettercompute._version import __version__
from bettercompute.errors import ComputeError, InternalError, InvalidInputError, NotFoundError
from bettercompute.modules._tenants import require_tenant
from bettercompute.modules.webhooks import _guard
from bettercompute.modules.webhooks._port import (
    WEBHOOKS,
    DeliveryOutcome,
    DueDelivery,
    WebhookDelivery,
    WebhookSubscription,
)
from bettercompute.modules.webhooks._schemas import (
    CreatedWebhook,
    CreateWebhookInput,
    DeleteWebhookInput,
    DeleteWebhookOutput,
    Delivery,
    ListDeliveriesInput,
    ListDeliveriesOutput,
    ListWebhooksInput,
    ListWebhooksOutput,
    RotateWebhookSecretInput,
    Webhook,
    WebhookTestInput,
    WebhookTestOutput,
)
from bettercompute.modules.webhooks._signing import (
    EVENT_ID_HEADER,
    EVENT_TYPE_HEADER,
    SIGNATURE_HEADER,
    WebhookSettings,
    sign,
    standard_headers,
)
from bettercompute.paging import Keyset
from bettercompute.ports import Kms, ResourceRef, StoredEvent

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

log = logging.getLogger("bettercompute.webhooks")

SECRET_PREFIX = "whsec_"  # noqa: S105 - the prefix of generated secrets, not a secret
TEST_EVENT = "webhook.test"


def _tenant(input: Any) -> ResourceRef:
    # Every input names its tenant: the core's pre-check refuses another tenant's caller before the database.
    return ResourceRef(type="webhook", id=getattr(input, "id", None), tenant=input.tenant)


def secret_context(tenant: str, subscription_id: str) -> str:
    """The KMS context a subscription's secret is sealed under: a sealed secret moved to another row won't open."""
    return f"webhook:{tenant}:{subscription_id}"


def event_body(
    *, event_id: str, type: str, key: str, seq: int, tenant: str, created_at: dt.datetime, data: Mapping[str, Any]
) -> str:
    """The JSON body a receiver gets: the event's identity, then its payload under ``data``."""
    envelope = {
        "id": event_id,
        "type": type,
        "key": key,
        "seq": seq,
        "tenant": tenant,
        "created_at": created_at.isoformat(),
        "data": dict(data),
    }
    return json.dumps(envelope, separators=(",", ":"), sort_keys=True)


def _kms(options_kms: Kms | None) -> Kms:
    if options_kms is None:  # without one the group answers FAILED_PRECONDITION and no job runs
        raise InternalError("the webhooks module runs without a KMS")
    return options_kms


def _webhook(subscription: WebhookSubscription) -> Webhook:
    return Webhook(
        id=subscription.id,
        tenant=subscription.tenant,
        url=subscription.url,
        event_types=subscription.event_types,
        description=subscription.description,
        created_at=subscription.created_at,
    )


def _delivery(delivery: WebhookDelivery) -> Delivery:
    status: Any = delivery.status
    return Delivery(
        id=delivery.id,
        event_id=delivery.event_id,
        event_type=delivery.event_type,
        event_key=delivery.event_key,
        status=status,
        attempts=delivery.attempts,
        last_status=delivery.last_status,
        last_error=delivery.last_error,
        next_attempt_at=delivery.next_attempt_at,
        created_at=delivery.created_at,
        finished_at=delivery.finished_at,
    )


# --- methods ----------------------------------------------------------------------------------------------------


def _url_refused(problem: str) -> InvalidInputError:
    # The problem never quotes the URL: its query string may be a secret of the tenant's.
    return InvalidInputError(f"url: {problem}", details={"path": "url", "reason": problem})


async def _new_secret(context: Any, tenant: str, subscription_id: str) -> tuple[str, bytes]:
    """A signing secret in the Standard Webhooks form (``whsec_`` and the base64 of 32 random bytes), and its KMS
    blob sealed under the subscription's context."""
    secret = SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
    sealed = await _kms(context.kms).encrypt(secret.encode(), context=secret_context(tenant, subscription_id))
    return secret, sealed


@method(mutates=True, resource=_tenant, replayable=False)
async def create(call: CallContext, input: CreateWebhookInput) -> CreatedWebhook:
    """Subscribe a URL to the tenant's events; the signing secret is in this answer only.

    The URL is stored as the sender's HTTP client reads it (``_guard.parse``): IDNA-encoded, host in lower case.

    Raises:
        InvalidInputError: the sender's HTTP client cannot parse the URL, its host is neither a DNS name nor an IP
            address, or it points at localhost or an internal address literal, unless
            ``WebhookSettings.allow_private_destinations`` is set (``details["path"]`` is ``url``).
        NotFoundError: there is no such tenant.
    """
    context = call.context
    settings = context.settings.require(WebhookSettings)
    try:
        destination = _guard.parse(input.url)
    except ValueError as exc:
        raise _url_refused(str(exc)) from None
    if not settings.allow_private_destinations:
        problem = _guard.url_problem(destination, loopback=settings.allow_loopback_destinations)
        if problem is not None:
            raise _url_refused(problem)
    url = str(destination)
    subscription_id = f"wh_{secrets.token_hex(8)}"
    secret, sealed = await _new_secret(context, input.tenant, subscription_id)
    event_types = tuple(dict.fromkeys(input.event_types))
    async with call.transaction() as tx:
        await require_tenant(tx, input.tenant)
        subscription = await tx.repository(WEBHOOKS).create(
            id=subscription_id,
            tenant=input.tenant,
            url=url,
            event_types=event_types,
            description=input.description,
            sealed_secret=sealed,
        )
        call.describe(
            resource_type="webhook",
            resource_id=subscription_id,
            tenant=input.tenant,
            details={"url": url, "event_types": list(event_types)},
        )
    return CreatedWebhook(webhook=_webhook(subscription), secret=secret)


_WEBHOOK_PAGES: Keyset[Webhook] = Keyset(dt.datetime, str, key=lambda w: (w.created_at, w.id))
_DELIVERY_PAGES: Keyset[Delivery] = Keyset(int, key=lambda d: (d.id,))


@method(mutates=False, resource=_tenant)
async def list_webhooks(call: CallContext, input: ListWebhooksInput) -> ListWebhooksOutput:
    """A page of the tenant's subscriptions, oldest first (never a secret).

    Raises:
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _WEBHOOK_PAGES.after(scope, input.cursor)
    subscriptions = await call.context.store.repository(WEBHOOKS).for_tenant(
        input.tenant, after=after, limit=input.limit + 1
    )
    webhooks, next_cursor = _WEBHOOK_PAGES.page(scope, [_webhook(s) for s in subscriptions], input.limit)
    return ListWebhooksOutput(webhooks=webhooks, next_cursor=next_cursor)


@method(mutates=True, resource=_tenant, replayable=False)
async def rotate_secret(call: CallContext, input: RotateWebhookSecretInput) -> CreatedWebhook:
    """Replace a subscription's signing secret; the new one is in this answer only. Deliveries are signed with both
    secrets (two ``v1`` signatures in ``webhook-signature``) for ``overlap_seconds``, so receivers can move to the
    new one without refusing a delivery; rotating again within the overlap ends the older secret's at once.

    Raises:
        NotFoundError: the tenant has no such subscription.
    """
    context = call.context
    secret, sealed = await _new_secret(context, input.tenant, input.id)
    until = context.clock.now() + dt.timedelta(seconds=input.overlap_seconds) if input.overlap_seconds else None
    async with call.transaction() as tx:
        rotated = await tx.repository(WEBHOOKS).rotate(
            tenant=input.tenant, id=input.id, sealed_secret=sealed, previous_until=until
        )
        if rotated is None:
            raise NotFoundError("no such webhook in this tenant", details={"id": input.id})
        call.describe(
            resource_type="webhook",
            resource_id=input.id,
            tenant=input.tenant,
            details={"overlap_seconds": input.overlap_seconds},
        )
    return CreatedWebhook(webhook=_webhook(rotated), secret=secret)


@method(mutates=True, resource=_tenant)
async def delete(call: CallContext, input: DeleteWebhookInput) -> DeleteWebhookOutput:
    """Delete a subscription and its deliveries (pending ones are not sent).

    Raises:
        NotFoundError: the tenant has no such subscription.
    """
    async with call.transaction() as tx:
        deleted = await tx.repository(WEBHOOKS).delete(tenant=input.tenant, id=input.id)
        if deleted is None:
            raise NotFoundError("no such webhook in this tenant", details={"id": input.id})
        call.describe(resource_type="webhook", resource_id=input.id, tenant=input.tenant, details={"url": deleted.url})
    return DeleteWebhookOutput(deleted=True)


@method(mutates=True, resource=_tenant)
async def test(call: CallContext, input: WebhookTestInput) -> WebhookTestOutput:
    """Queue a ``webhook.test`` event for this subscription only.

    Raises:
        NotFoundError: the tenant has no such subscription.
    """
    event_id = f"evt_test_{secrets.token_hex(8)}"
    key = f"{TEST_EVENT}:{event_id}"  # its own key: a test never waits for, or holds back, real events
    body = event_body(
        event_id=event_id,
        type=TEST_EVENT,
        key=key,
        seq=1,
        tenant=input.tenant,
        created_at=call.context.clock.now(),
        data={"webhook_id": input.id},
    )
    async with call.transaction() as tx:
        added = await tx.repository(WEBHOOKS).add_delivery(
            tenant=input.tenant, id=input.id, event_id=event_id, event_type=TEST_EVENT, event_key=key, body=body
        )
        if not added:
            raise NotFoundError("no such webhook in this tenant", details={"id": input.id})
        call.describe(
            resource_type="webhook", resource_id=input.id, tenant=input.tenant, details={"event_id": event_id}
        )
    await notify_work(call.context, SINKS_POKE)  # wake the sender now rather than at its next poll
    return WebhookTestOutput(event_id=event_id)


@method(mutates=False, resource=_tenant)
async def deliveries(call: CallContext, input: ListDeliveriesInput) -> ListDeliveriesOutput:
    """A page of a subscription's delivery log, newest first: status, attempts, the last HTTP status and error.

    Raises:
        NotFoundError: the tenant has no such subscription.
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _DELIVERY_PAGES.after(scope, input.cursor)
    found = await call.context.store.repository(WEBHOOKS).deliveries(
        tenant=input.tenant, id=input.id, after=after, limit=input.limit + 1
    )
    if found is None:
        raise NotFoundError("no such webhook in this tenant", details={"id": input.id})
    deliveries, next_cursor = _DELIVERY_PAGES.page(scope, [_delivery(d) for d in found], input.limit)
    return ListDeliveriesOutput(deliveries=deliveries, next_cursor=next_cursor)


# --- fan-out and sending ----------------------------------------------------------------------------------------


async def fan_out(context: ModuleContext, event: StoredEvent) -> None:
    """Queue a committed event for its tenant's matching subscriptions (an ``events`` subscriber)."""
    tenant = event.payload.get("tenant")
    if not isinstance(tenant, str) or not tenant:
        return
    event_id = f"evt_{event.id}"
    body = event_body(
        event_id=event_id,
        type=event.type,
        key=event.key,
        seq=event.seq,
        tenant=tenant,
        created_at=event.created_at,
        data=event.payload,
    )
    await context.store.repository(WEBHOOKS).fan_out(
        tenant=tenant, event_id=event_id, event_type=event.type, event_key=event.key, body=body
    )


def backoff(settings: WebhookSettings, failures: int) -> dt.timedelta:
    """The wait after ``failures`` failed attempts: doubling from ``backoff``, capped, jittered to 50-100%."""
    base = settings.backoff.total_seconds() * 2 ** min(failures - 1, 30)
    capped = min(base, settings.max_backoff.total_seconds())
    return dt.timedelta(seconds=capped * random.uniform(0.5, 1.0))  # noqa: S311 - jitter, not security


async def _attempt(
    context: ModuleContext, client: httpx.AsyncClient, settings: WebhookSettings, delivery: DueDelivery
) -> DeliveryOutcome:
    http_status: int | None = None
    error: str | None = None
    try:
        secret = await _kms(context.kms).decrypt(
            delivery.sealed_secret, context=secret_context(delivery.tenant, delivery.subscription_id)
        )
    except ComputeError as exc:
        # A worker without the deployment's key: nothing was sent, so it is not an attempt. The delivery waits as
        # after a failure and is never dead for this, so fixing the key (or another worker) recovers the backlog.
        log.error("cannot open the secret of webhook %s: %s", delivery.subscription_id, type(exc).__name__)
        return DeliveryOutcome(
            delivery=delivery,
            status="pending",
            error="the signing secret cannot be decrypted by this worker",
            retry_in=backoff(settings, delivery.attempts + 1),
            attempted=False,
        )
    signing = [secret.decode()]
    if delivery.previous_sealed_secret is not None:  # a rotation's overlap: the replaced secret signs too
        try:
            previous = await _kms(context.kms).decrypt(
                delivery.previous_sealed_secret, context=secret_context(delivery.tenant, delivery.subscription_id)
            )
            signing.append(previous.decode())
        except ComputeError as exc:
            log.error("cannot open the previous secret of webhook %s: %s", delivery.subscription_id, type(exc).__name__)
    body = delivery.body.encode()
    timestamp = int(context.clock.now().timestamp())
    headers = {
        "content-type": "application/json",
        "user-agent": f"bettercompute-webhooks/{__version__}",
        **standard_headers(signing, delivery.event_id, timestamp, body),
        # the headers of earlier versions, for receivers written against them
        SIGNATURE_HEADER: ",".join([f"t={timestamp}", *(f"v1={sign(s, timestamp, body)}" for s in signing)]),
        EVENT_ID_HEADER: delivery.event_id,
        EVENT_TYPE_HEADER: delivery.event_type,
    }
    try:
        with anyio.fail_after(settings.timeout.total_seconds() + 1):
            extensions: dict[str, Any] = {}
            if settings.allow_private_destinations:
                url = _guard.readable(delivery.url)
            else:
                # Resolved now, not at create: the name may point elsewhere since (DNS rebinding).
                target = await _guard.pinned(delivery.url, loopback=settings.allow_loopback_destinations)
                url, extensions = target.url, dict(target.extensions)
                headers.update(target.headers)
            # Streamed and never read: a receiver's answer body cannot fill this process's memory.
            async with client.stream("POST", url, content=body, headers=headers, extensions=extensions) as response:
                http_status = response.status_code
    except _guard.DestinationRefusedError as exc:
        error = str(exc)
    except TimeoutError:
        error = "timed out"
    except httpx.HTTPError as exc:
        # The class name only: the text may quote the URL, whose query string a tenant may treat as secret.
        error = f"request failed: {type(exc).__name__}"
    except Exception as exc:
        # Anything else the client or its transport raised (httpx.InvalidURL, UnicodeError, a transport's bug) is
        # this delivery's failed attempt, never the pass's failure. Its class name only, as above.
        log.warning("webhook %s: the attempt raised %s", delivery.subscription_id, type(exc).__name__)
        error = f"request failed: {type(exc).__name__}"
    else:
        if not 200 <= http_status < 300:
            error = f"the receiver answered HTTP {http_status}"
    if error is None:
        return DeliveryOutcome(delivery=delivery, status="delivered", http_status=http_status)
    return _failed(settings, delivery, error, http_status)


def _failed(
    settings: WebhookSettings, delivery: DueDelivery, error: str, http_status: int | None = None
) -> DeliveryOutcome:
    """A failed attempt: retried after a backoff, or ``dead`` once it was the last one allowed."""
    failures = delivery.attempts + 1
    if failures >= settings.max_attempts:
        return DeliveryOutcome(delivery=delivery, status="dead", http_status=http_status, error=error)
    return DeliveryOutcome(
        delivery=delivery,
        status="pending",
        http_status=http_status,
        error=error,
        retry_in=backoff(settings, failures),
    )


def committed_at(body: str) -> dt.datetime | None:
    """The event's commit time, read back from a delivery's body (``created_at``, the outbox's database time), or
    ``None`` when the body does not carry a readable one."""
    try:
        value = json.loads(body).get("created_at")
        at = dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except (ValueError, AttributeError):
        return None
    return at if at is not None and at.tzinfo is not None else None


def _count(context: ModuleContext, outcome: DeliveryOutcome) -> None:
    """The sender's metrics: the lag of a delivered event (commit to now), a delivery given up."""
    if outcome.status == "delivered":
        at = committed_at(outcome.delivery.body)
        if at is not None:
            lag = (context.clock.now() - at).total_seconds()
            context.metrics.webhook_delivery_lag.observe(max(0.0, lag))
    elif outcome.status == "dead":
        context.metrics.webhook_dead_letters.inc()


class _Borrowed(httpx.AsyncBaseTransport):
    """``WebhookSettings.transport`` lent to one pass's client: closing the client must not close it, since the
    next pass uses it again (its owner closes it)."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        pass


async def send_due(context: ModuleContext) -> int:
    """One pass of the sender: claim due deliveries, POST them (no transaction open), record the outcomes."""
    settings = context.settings.require(WebhookSettings)
    store = context.store
    claim_for = settings.timeout * 2 + dt.timedelta(seconds=30)
    claimed = await store.repository(WEBHOOKS).claim(
        limit=settings.batch_size,
        claim_for=claim_for,
        per_tenant=settings.max_per_tenant,
        per_webhook=settings.max_per_webhook,
    )
    if not claimed:
        return 0
    outcomes: list[DeliveryOutcome] = []
    limiter = anyio.CapacityLimiter(settings.concurrency)
    timeout = httpx.Timeout(settings.timeout.total_seconds())

    async def one(delivery: DueDelivery) -> None:
        async with limiter:
            try:
                outcome = await _attempt(context, client, settings, delivery)
            except Exception as exc:
                # Nothing one delivery does may fail the pass: its task group would cancel the other attempts, and
                # the same delivery would be claimed first again on every pass. It counts as this one's attempt.
                log.error("webhook %s: the attempt failed with %s", delivery.subscription_id, type(exc).__name__)
                outcome = _failed(settings, delivery, f"request failed: {type(exc).__name__}")
            outcomes.append(outcome)
            _count(context, outcome)

    # A request pinned to a checked address must not reuse a connection made for another host name on that address.
    keepalive = 20 if settings.allow_private_destinations else 0
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=keepalive)
    transport = _Borrowed(settings.transport) if settings.transport is not None else None
    client = httpx.AsyncClient(
        timeout=timeout, follow_redirects=False, trust_env=False, limits=limits, transport=transport
    )
    try:
        async with client, anyio.create_task_group() as tg:
            for delivery in claimed:
                tg.start_soon(one, delivery)
    finally:
        # Recorded even when the pass is cancelled (its lease lost, stop()): attempts that were made count, and
        # deliveries that succeeded are not sent again.
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            await store.repository(WEBHOOKS).record(outcomes)
    return sum(1 for o in outcomes if o.status == "delivered")


PURGE_BATCH = 1000
"""Rows read (and at most deleted) by one statement of the retention job."""


async def purge_finished(context: ModuleContext) -> int:
    """One pass of ``sinks/webhooks-retention``: delete finished deliveries past their retention."""
    settings = context.settings.require(WebhookSettings)
    return await context.store.repository(WEBHOOKS).purge(
        retention=settings.retention, dead_retention=settings.dead_retention, batch=PURGE_BATCH
    )
