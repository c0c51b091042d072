"""The ports: everything the core needs from the outside, as structural protocols.

Sibling packages satisfy these without importing anything but the core. Each protocol's docstring is its contract;
``bettercompute.testing`` holds the conformance suites that check an implementation against it.

Errors: an implementation raises only ``bettercompute.errors`` classes. A lost connection or an unreachable server is
``UnavailableError``; anything else unexpected is ``InternalError``, raised ``from`` the driver's exception so that
the cause stays in the traceback but never in the message.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

import attrs

from ._txscope import in_transaction, transaction_scope

__all__ = [
    "AuditRecord",
    "Booking",
    "Bookings",
    "CaKey",
    "Certificates",
    "Claim",
    "Clock",
    "CommandRecord",
    "Commands",
    "Decision",
    "DeliveryOutcome",
    "DueDelivery",
    "Enrollment",
    "Iam",
    "IdempotencyKeys",
    "IdempotencyOutcome",
    "Identity",
    "IssuedCertificate",
    "JoinKeyRecord",
    "JoinKeys",
    "JoinTokenRecord",
    "JoinTokens",
    "Kms",
    "Lease",
    "Leases",
    "Member",
    "Membership",
    "Migration",
    "NodeRecord",
    "Nodes",
    "Notifier",
    "Outbox",
    "OutboxEvent",
    "PoolRecord",
    "Pools",
    "ReplayGuard",
    "ResourceRef",
    "Revocation",
    "SecretRecord",
    "SecretStore",
    "SessionRecord",
    "Sessions",
    "Store",
    "StoredEvent",
    "TokenConsumption",
    "Transaction",
    "Usage",
    "UsageRecord",
    "WebhookDelivery",
    "WebhookSubscription",
    "Webhooks",
    "WorkItem",
    "WorkQueue",
    "WorkflowLogEntry",
    "WorkflowRecord",
    "WorkflowStore",
    "in_transaction",
    "transaction_scope",
]


# --- values -----------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Migration:
    """One step of a module's schema, applied once, in version order, under the store's migration lock.

    ``sql`` is written for the store whose ``dialect`` the migration is listed under; it may reference the store's
    schema as ``{schema}``.
    """

    version: int
    name: str
    sql: str


@attrs.frozen(kw_only=True)
class Lease:
    """A named, time-limited, exclusive right to do some work.

    ``token`` is the fencing token: it grows every time the lease changes hands, so a write carrying an older token
    can be recognised and refused after the lease has moved on.
    """

    name: str
    holder: str
    token: int
    expires_at: dt.datetime


@attrs.frozen(kw_only=True)
class Member:
    """A live worker process in one role: ``id`` is unique per process (it is the holder of its shard leases)."""

    role: str
    id: str
    instance: str
    started_at: dt.datetime
    heartbeat_at: dt.datetime
    expires_at: dt.datetime


@attrs.frozen(kw_only=True)
class WorkItem:
    """A request that ``key`` of ``kind`` be worked on at or after ``run_at`` (now when ``None``)."""

    kind: str
    key: str
    shard: int = 0
    payload: Mapping[str, Any] = attrs.field(factory=dict)
    run_at: dt.datetime | None = None


@attrs.frozen(kw_only=True)
class Claim:
    """A work item claimed by one holder until ``claimed_until``; ``token`` proves the claim is still its own."""

    id: int
    kind: str
    key: str
    shard: int
    payload: Mapping[str, Any]
    attempts: int
    token: str
    claimed_until: dt.datetime
    last_error: str | None = None


@attrs.frozen(kw_only=True)
class OutboxEvent:
    """An event to publish once the transaction that records it commits. Events of one ``key`` keep their order."""

    type: str
    key: str
    payload: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class StoredEvent:
    """An outbox event as stored: ``seq`` numbers the events of one key in commit order, from 1."""

    id: int
    type: str
    key: str
    seq: int
    payload: Mapping[str, Any]
    created_at: dt.datetime
    token: str


@attrs.frozen(kw_only=True)
class AuditRecord:
    """One audit row: who did what to which resource, under which IAM decision, with what outcome."""

    action: str
    actor: str
    tenant: str | None
    resource_type: str
    resource_id: str | None
    decision_id: str | None
    outcome: str = "ok"
    details: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class IdempotencyOutcome:
    """What ``IdempotencyKeys.begin`` found.

    ``state`` is ``"new"`` (the key is now reserved for this request), ``"replay"`` (the same request finished
    before: ``result`` holds its stored result), ``"in_progress"`` (the same request is running elsewhere) or
    ``"conflict"`` (the key was used for a different request).
    """

    state: str
    result: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class WebhookSubscription:
    """A stored webhook subscription. ``secret`` is the signing secret as the KMS sealed it, never in the clear."""

    id: str
    tenant: str
    url: str
    event_types: tuple[str, ...]
    description: str
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class WebhookDelivery:
    """One event's delivery to one subscription, as its log shows it (``status``: pending, delivered, dead)."""

    id: int
    event_id: str
    event_type: str
    event_key: str
    status: str
    attempts: int
    last_status: int | None
    last_error: str | None
    next_attempt_at: dt.datetime | None
    created_at: dt.datetime
    finished_at: dt.datetime | None


@attrs.frozen(kw_only=True, repr=False)
class DueDelivery:
    """A delivery claimed for one attempt until ``claimed_until``; ``token`` proves the claim is still its own.

    ``sealed_secret`` is the subscription's KMS blob (context ``webhook:<tenant>:<subscription_id>``); ``body`` the
    exact bytes to sign and send; ``attempts`` counts the attempts made before this one.
    """

    id: int
    token: str
    subscription_id: str
    tenant: str
    url: str
    sealed_secret: bytes
    event_id: str
    event_type: str
    body: str
    attempts: int

    def __repr__(self) -> str:
        return f"DueDelivery(id={self.id}, subscription_id={self.subscription_id!r}, event_id={self.event_id!r})"


@attrs.frozen(kw_only=True)
class DeliveryOutcome:
    """What an attempt came to: ``status`` ``delivered``, ``pending`` (retry after ``retry_in``) or ``dead``.

    ``attempted`` is ``False`` when no request was made for a reason that is this worker's, not the receiver's (it
    cannot open the signing secret): the delivery goes back to ``pending`` and its attempts stay as they were.
    """

    delivery: DueDelivery
    status: str
    http_status: int | None = None
    error: str | None = None
    retry_in: dt.timedelta = dt.timedelta(0)
    attempted: bool = True


@attrs.frozen(kw_only=True, repr=False)
class SecretRecord:
    """A secret of the ``secrets`` group as stored: ``sealed_value`` is what the KMS made of the value (context
    ``secret:<tenant>:<name>``), never the value itself. ``scope`` is ``node:<id>``, ``pool:<id>`` or ``site:<id>``.
    Its ``repr`` leaves the sealed value out."""

    id: str
    tenant: str
    name: str
    scope: str
    description: str
    sealed_value: bytes
    created_at: dt.datetime

    def __repr__(self) -> str:
        return f"SecretRecord(id={self.id!r}, tenant={self.tenant!r}, name={self.name!r}, scope={self.scope!r})"


@attrs.frozen(kw_only=True)
class WorkflowRecord:
    """One workflow as stored (``bettercompute.Workflows`` returns it from ``get``).

    ``state`` is ``running``, ``waiting``, ``succeeded``, ``failed``, ``cancelling`` or ``cancelled``. ``step_index``
    and ``step`` name the current step (while cancelling: the step being compensated; once succeeded: the index past
    the last step, ``step`` ``None``); ``attempt`` counts the current step's attempts from 1. ``completed`` is how many
    steps have applied their effect (the ones a cancellation compensates). ``reason`` is a machine-readable code of
    why the workflow failed, was cancelled or is retrying, ``message`` its human text. ``data`` is the state passed
    from step to step. While ``waiting``, ``waiting_for`` is the event awaited and ``wake_at`` when the wait times out
    (``on_timeout``: ``fail`` or ``next``). ``inbox`` holds signals received before their wait (event -> payload).
    """

    id: str
    type: str
    tenant: str
    subject: str
    state: str
    step_index: int
    step: str | None
    attempt: int
    completed: int = 0
    compensating: bool = False
    reason: str | None = None
    message: str = ""
    data: Mapping[str, Any] = attrs.field(factory=dict)
    inbox: Mapping[str, Any] = attrs.field(factory=dict)
    waiting_for: str | None = None
    on_timeout: str | None = None
    wake_at: dt.datetime | None = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None


@attrs.frozen(kw_only=True)
class WorkflowLogEntry:
    """One line of a workflow's step log: what an attempt of a step (or of its compensation) came to."""

    id: int
    workflow_id: str
    step_index: int
    step: str
    attempt: int
    outcome: str
    reason: str | None
    at: dt.datetime


@attrs.frozen(kw_only=True, repr=False)
class CaKey:
    """One signing key of the node CA of ``trust_domain``.

    ``sealed_key`` is the private key (PKCS#8 DER) as the KMS sealed it (context ``ca:<trust_domain>:<id>``), never
    in the clear; ``certificate_pem`` its self-signed CA certificate. ``state`` is ``active`` (signs; exactly one per
    trust domain), ``previous`` (signs no more, still in the trust bundle) or ``retired`` (out of the bundle).
    """

    id: str
    trust_domain: str
    algorithm: str
    sealed_key: bytes
    certificate_pem: str
    state: str
    not_after: dt.datetime
    created_at: dt.datetime
    retired_at: dt.datetime | None = None

    def __repr__(self) -> str:
        return f"CaKey(id={self.id!r}, trust_domain={self.trust_domain!r}, state={self.state!r})"


@attrs.frozen(kw_only=True)
class IssuedCertificate:
    """A certificate the CA issued: ``serial`` is the serial number in lower-case hex (no leading zeros)."""

    serial: str
    node_id: str
    spiffe_id: str
    role: str
    ca_key_id: str
    not_before: dt.datetime
    not_after: dt.datetime
    issued_at: dt.datetime | None = None
    key_sha256: str | None = None
    """SHA-256 (hex) of the certified public key (SubjectPublicKeyInfo, DER)."""


@attrs.frozen(kw_only=True)
class Revocation:
    """The revocation of one issued certificate."""

    serial: str
    spiffe_id: str
    reason: str
    revoked_at: dt.datetime


@attrs.frozen(kw_only=True)
class PoolRecord:
    """A stored pool: ``pool_class`` is ``gpu``, ``vps-host`` or ``provider``."""

    id: str
    tenant: str
    name: str
    pool_class: str
    acceptance_checks: tuple[str, ...]
    labels: Mapping[str, str]
    created_at: dt.datetime
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class JoinTokenRecord:
    """A stored join token, without its secret or its hash. ``expect`` holds only the claims to check."""

    id: str
    pool_id: str
    tenant: str
    uses: int
    uses_left: int
    expires_at: dt.datetime
    expect: Mapping[str, Any]
    reclaim: str
    created_by: str | None
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class TokenConsumption:
    """What ``JoinTokens.consume`` did: ``consumed`` (``token.uses_left`` is what is left), or why not:
    ``unknown`` (no such token or a wrong secret; ``token`` is ``None``), ``revoked``, ``expired``, ``exhausted``."""

    outcome: str
    token: JoinTokenRecord | None


@attrs.frozen(kw_only=True)
class NodeRecord:
    """A machine joined to a pool. ``state`` is ``adopting`` (joined, acceptance checks pending), ``adopted``,
    ``failed`` or ``retired``. ``hardware_key`` is derived from its stable hardware claims; ``claims`` are the
    hardware claims of its latest join and ``attestation`` the facts the attestor chain recorded then.
    ``enrollments`` counts its joins (1 + reclaims)."""

    id: str
    tenant: str
    pool_id: str
    site_id: str | None
    state: str
    hardware_key: str
    claims: Mapping[str, Any]
    attestation: Mapping[str, Any]
    join_token_id: str | None
    enrollments: int
    session_epoch: int
    desired_generation: int
    observed_generation: int
    last_seen_at: dt.datetime | None
    joined_at: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime
    retired_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class Enrollment:
    """What ``Nodes.enroll`` did: ``created`` a node, ``reclaimed`` the pool's live node with the same hardware key,
    or found such a node while reclaiming was not allowed (``conflict``; ``node`` is that node, nothing written)."""

    outcome: str
    node: NodeRecord


@attrs.frozen(kw_only=True, repr=False)
class JoinKeyRecord:
    """JoinService's X25519 key: ``sealed_key`` is the 32-byte private key as the KMS sealed it (context
    ``join-key:<id>``); ``public_key`` its base64url text. ``state`` is ``active`` (one) or ``previous``."""

    id: str
    public_key: str
    sealed_key: bytes
    state: str
    created_at: dt.datetime

    def __repr__(self) -> str:
        return f"JoinKeyRecord(id={self.id!r}, state={self.state!r})"


@attrs.frozen(kw_only=True)
class CommandRecord:
    """A command for a node's daemon (``diag.nvml``, ``reboot``, ...).

    ``state``: ``pending`` (waiting for the node's session), ``dispatched`` (sent on session ``session_epoch``, which
    a finished command keeps as the session it was last sent on),
    then ``succeeded``, ``failed``, ``expired`` (its ``deadline`` passed first) or ``cancelled``. ``on_session_loss``
    says what happens when the session it was dispatched on dies: ``redispatch`` (back to ``pending``, at most
    ``max_attempts`` dispatches in all) or ``fail``. ``reason`` is machine-readable (``deadline_exceeded``,
    ``session_lost``, ``attempts_exhausted``, or the daemon's).
    """

    id: str
    node_id: str
    tenant: str
    kind: str
    payload: Mapping[str, Any]
    state: str
    on_session_loss: str
    deadline: dt.datetime
    attempts: int
    max_attempts: int
    session_epoch: int | None
    dispatched_at: dt.datetime | None
    result: Mapping[str, Any] | None
    reason: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class SessionRecord:
    """A node's daemon session on a gateway: ``epoch`` grows with every session the node opens; the session is
    live while it is not closed and was seen recently."""

    node_id: str
    epoch: int
    gateway: str
    opened_at: dt.datetime
    last_seen_at: dt.datetime
    closed_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class Booking:
    """A unit of capacity (an atom: a GPU, a MIG slice, a vCPU/GiB unit) held by a reservation for ``[start, end)``
    (``end`` ``None``: until released). ``gpus`` is the atom's share of a GPU (1 for a GPU, a fraction for a MIG
    slice, 0 for vCPU and memory units): usage counts ``gpus`` times seconds."""

    id: int
    atom_id: str
    reservation_id: str
    tenant: str
    pool_id: str
    gpus: float
    start: dt.datetime
    end: dt.datetime | None


@attrs.frozen(kw_only=True)
class UsageRecord:
    """GPU-seconds a tenant used in a pool during ``[period_start, period_end)``."""

    tenant: str
    pool_id: str
    period_start: dt.datetime
    period_end: dt.datetime
    gpu_seconds: float


# --- repositories -----------------------------------------------------------------------------------------------


class Leases(Protocol):
    """Exclusive, expiring leases with fencing tokens."""

    async def acquire(self, name: str, holder: str, ttl: dt.timedelta) -> Lease | None:
        """Take the lease if it is free, expired, or already ``holder``'s (then it is extended, same token).

        Returns ``None`` when another holder has it. Taking it from a different (or expired) holder increases the
        token. Safe to retry.
        """
        ...

    async def renew(self, lease: Lease, ttl: dt.timedelta) -> Lease | None:
        """Extend a lease still held with this token; ``None`` when it was lost (expired and taken, or released)."""
        ...

    async def release(self, lease: Lease) -> bool:
        """Give the lease back so another holder can take it at once. ``False`` when it was no longer held."""
        ...

    async def get(self, name: str) -> Lease | None:
        """The lease's current, unexpired state, or ``None``."""
        ...

    async def acquire_many(self, names: Collection[str], holder: str, ttl: dt.timedelta) -> list[Lease]:
        """``acquire`` for many leases in one call: the leases obtained (or extended), by name; safe to retry."""
        ...

    async def renew_many(self, leases: Collection[Lease], ttl: dt.timedelta) -> list[Lease]:
        """``renew`` for many leases in one call: those still held, extended; the others were lost."""
        ...

    async def release_many(self, leases: Collection[Lease]) -> int:
        """``release`` for many leases in one call; returns how many were still held."""
        ...


class Membership(Protocol):
    """Worker membership: one row per ``(role, id)``, live until it expires, refreshed by heartbeats."""

    async def heartbeat(self, *, roles: Collection[str], id: str, instance: str, ttl: dt.timedelta) -> list[Member]:
        """Register (or refresh) ``id`` in each role, live for ``ttl``; returns the live members of those roles,
        this one included, ordered by role and id. Idempotent; also forgets members long expired."""
        ...

    async def leave(self, *, roles: Collection[str], id: str) -> None:
        """Remove ``id``'s rows, so the others rebalance at once. Idempotent."""
        ...

    async def live(self, role: str) -> list[Member]:
        """The unexpired members of ``role``, ordered by id."""
        ...


class WorkQueue(Protocol):
    """The work queue: claims with ``FOR UPDATE SKIP LOCKED`` semantics, so concurrent claimers never share work.

    At most one ready item exists per ``(kind, key)``: enqueuing a key that is already waiting keeps one item and
    the earlier ``run_at``. A key that is claimed is not handed to a second claimer until its claim ends or expires.
    """

    async def enqueue(self, items: Sequence[WorkItem]) -> None:
        """Add work in its own transaction (use ``Transaction.enqueue`` to add it with a state change)."""
        ...

    async def claim(
        self,
        *,
        holder: str,
        kinds: Sequence[str],
        limit: int,
        claim_for: dt.timedelta,
        shards: Sequence[int] | None = None,
        fence: Lease | None = None,
        now: dt.datetime | None = None,
        owner_prefix: str | None = None,
    ) -> list[Claim]:
        """Claim up to ``limit`` due items, oldest ``run_at`` first.

        Expired claims are due again. With ``fence``, nothing is claimed (empty list) unless the lease is still held
        with that token. With ``owner_prefix``, only items on shards whose lease ``<owner_prefix><shard>`` is held
        (unexpired) by ``holder``. ``now`` replaces the store's clock in deciding what is due and when the claim expires
        (``jobs.tick()`` passes an injected clock's time).
        """
        ...

    async def complete(
        self,
        claim: Claim,
        *,
        fence: Lease | None = None,
        again_after: dt.timedelta | None = None,
        now: dt.datetime | None = None,
    ) -> bool:
        """Remove finished work. ``False`` (and no change) if the claim was lost, e.g. it expired and was re-claimed,
        or if ``fence`` is no longer held with its token.

        With ``again_after``, the item stays, ready again after that delay (counted from ``now`` when given), with
        its attempts and error cleared; work enqueued meanwhile merges in at the earlier time.
        """
        ...

    async def retry(
        self,
        claim: Claim,
        *,
        delay: dt.timedelta,
        error: str,
        fence: Lease | None = None,
        now: dt.datetime | None = None,
    ) -> bool:
        """Hand the item back, due after ``delay`` (from ``now`` when given), recording ``error``. ``False`` if the
        claim was lost or ``fence`` is stale."""
        ...

    async def extend(self, claim: Claim, claim_for: dt.timedelta) -> Claim | None:
        """Keep a long-running claim alive; ``None`` if it was lost."""
        ...

    async def pending(self, kinds: Sequence[str] | None = None) -> int:
        """How many items wait or run (for health checks and tests)."""
        ...


class Outbox(Protocol):
    """Committed events, handed out in per-key order.

    An event is visible only after its transaction commits. For one key, events are numbered in commit order; an
    event is not handed out while an earlier event of its key is undelivered.
    """

    async def claim(self, *, holder: str, limit: int, claim_for: dt.timedelta) -> list[StoredEvent]:
        """Claim up to ``limit`` deliverable events, at most one per key, oldest first."""
        ...

    async def ack(self, events: Sequence[StoredEvent]) -> int:
        """Mark claimed events delivered; returns how many were still held by these claims."""
        ...

    async def release(self, events: Sequence[StoredEvent], *, delay: dt.timedelta) -> int:
        """Hand claimed events back undelivered, deliverable again after ``delay``."""
        ...


class Webhooks(Protocol):
    """Webhook subscriptions of tenants, and their deliveries (the ``webhooks`` module's state).

    Deliveries of one subscription and one event key are handed out one at a time in the order they were added: a
    delivery is not claimed while an earlier one of its key is still pending (delivered and dead ones no longer
    hold it back). A subscription's deletion deletes its deliveries. Writes given a ``tx`` commit with it.
    """

    async def create(
        self,
        tx: Transaction,
        *,
        id: str,
        tenant: str,
        url: str,
        event_types: Sequence[str],
        description: str,
        sealed_secret: bytes,
    ) -> WebhookSubscription:
        """Add a subscription."""
        ...

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[WebhookSubscription]:
        """The tenant's subscriptions in ``(created_at, id)`` order: at most ``limit``, after the key ``after``."""
        ...

    async def delete(self, tx: Transaction, *, tenant: str, id: str) -> WebhookSubscription | None:
        """Delete a subscription of ``tenant`` and its deliveries; ``None`` when the tenant has no such one."""
        ...

    async def add_delivery(
        self, tx: Transaction, *, tenant: str, id: str, event_id: str, event_type: str, event_key: str, body: str
    ) -> bool:
        """Queue one event for one subscription of ``tenant``; ``False`` when the tenant has no such one."""
        ...

    async def fan_out(self, *, tenant: str, event_id: str, event_type: str, event_key: str, body: str) -> int:
        """Queue an event for every subscription of ``tenant`` whose filters match ``event_type``; returns how many.

        Idempotent per ``(subscription, event_id)``: an event handed out twice is queued once.
        """
        ...

    async def claim(
        self, *, limit: int, claim_for: dt.timedelta, per_tenant: int, per_webhook: int
    ) -> list[DueDelivery]:
        """Claim up to ``limit`` due deliveries (expired claims are due again), at most ``per_tenant`` of one tenant
        and ``per_webhook`` of one subscription, taken in turns: each tenant's oldest due first, then each one's
        second, and so on (within a tenant, its subscriptions likewise). Returned in that order, so a tenant with a
        large or failing backlog neither fills a pass nor goes first in it."""
        ...

    async def record(self, outcomes: Sequence[DeliveryOutcome]) -> int:
        """Record outcomes (attempts + 1 for each one ``attempted``); returns how many claims were still held (others
        are ignored)."""
        ...

    async def deliveries(
        self, *, tenant: str, id: str, after: Sequence[Any] | None, limit: int
    ) -> list[WebhookDelivery] | None:
        """A subscription of ``tenant``'s deliveries, newest first (``id`` descending): at most ``limit``, with ids
        below ``after``'s one part; ``None`` when the tenant has no such subscription."""
        ...

    async def purge(self, *, retention: dt.timedelta, dead_retention: dt.timedelta, batch: int) -> int:
        """Delete ``delivered`` deliveries that finished more than ``retention`` ago and ``dead`` ones more than
        ``dead_retention`` ago, by the store's clock; never a ``pending`` one. Each statement touches at most
        ``batch`` rows and commits on its own (an interrupted purge keeps what it deleted; safe to run again).
        Returns how many were deleted."""
        ...


class SecretStore(Protocol):
    """Secrets of the ``secrets`` group, sealed by the KMS; a name is unique within its tenant. Writes given a ``tx``
    commit with it."""

    async def create(self, tx: Transaction, record: SecretRecord) -> SecretRecord:
        """Add a secret (``created_at`` is the store's now). ``ConflictError`` if the tenant has one of that name."""
        ...

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[SecretRecord]:
        """The tenant's secrets by name (unique in a tenant): at most ``limit``, after the key ``after`` (a name)."""
        ...

    async def delete(self, tx: Transaction, *, tenant: str, name: str) -> SecretRecord | None:
        """Delete a secret of ``tenant``; ``None`` when it has no such one."""
        ...

    async def named(self, name: str, *, scopes: Sequence[str], tenant: str | None = None) -> list[SecretRecord]:
        """The secrets called ``name`` whose scope is one of ``scopes`` (of ``tenant`` only, when given)."""
        ...


class ReplayGuard(Protocol):
    """Remembers nonces so that a sealed message is accepted once (``Unsealer``). Implementations: the PostgreSQL
    store's ``nonces`` (shared by every process) and ``bettercompute.testing.InMemoryReplayGuard`` (tests only)."""

    async def first_use(self, scope: str, nonce: bytes, *, expires_at: dt.datetime, now: dt.datetime) -> bool:
        """Record ``nonce`` in ``scope`` until ``expires_at``; ``True`` the first time, ``False`` while it is still
        remembered (a nonce whose record expired by ``now`` counts as new). Atomic across concurrent callers."""
        ...

    async def purge(self, *, now: dt.datetime, limit: int = 10_000) -> int:
        """Forget up to ``limit`` nonces expired by ``now``; returns how many."""
        ...


class WorkflowStore(Protocol):
    """Workflows and their step logs (the state of ``bettercompute.Workflows``). Writes given a ``tx`` commit with
    it, so a step's own writes and the workflow's progress commit together."""

    async def insert(self, tx: Transaction, record: WorkflowRecord) -> None:
        """Add a workflow (its timestamps are the store's now). ``ConflictError`` if the id exists."""
        ...

    async def get(self, id: str) -> WorkflowRecord | None:
        """The workflow, or ``None``."""
        ...

    async def lock(self, tx: Transaction, id: str) -> WorkflowRecord | None:
        """The workflow, locked against other writers until ``tx`` ends (``None`` when there is none)."""
        ...

    async def update(self, tx: Transaction, record: WorkflowRecord) -> None:
        """Write the mutable fields of ``record`` (all but id, type, tenant, subject, created_at); updated_at is now."""
        ...

    async def log(
        self,
        tx: Transaction,
        *,
        workflow_id: str,
        step_index: int,
        step: str,
        attempt: int,
        outcome: str,
        reason: str | None,
    ) -> None:
        """Append a line to the workflow's step log."""
        ...

    async def history(self, id: str, *, limit: int = 1000) -> list[WorkflowLogEntry]:
        """The workflow's step log, oldest first (the newest ``limit`` lines)."""
        ...


class Certificates(Protocol):
    """The node CA's state: its signing keys (sealed), the certificates it issued, and their revocations.

    Writes given a ``tx`` commit with it. ``lock`` serializes the key changes of one trust domain.
    """

    async def lock(self, tx: Transaction, trust_domain: str) -> None:
        """Hold the trust domain's key lock until ``tx`` ends (creating, rotating and retiring keys take it)."""
        ...

    async def keys(self, trust_domain: str, *, tx: Transaction | None = None) -> list[CaKey]:
        """The trust domain's keys, retired ones included, oldest first (read in ``tx`` when given)."""
        ...

    async def add_key(self, tx: Transaction, key: CaKey) -> None:
        """Add a key (its ``created_at`` is the store's now). ``ConflictError`` for a second active key."""
        ...

    async def set_key_state(self, tx: Transaction, *, trust_domain: str, id: str, state: str) -> bool:
        """Move a key to ``state`` (``retired`` stamps ``retired_at``); ``False`` when there is no such key."""
        ...

    async def record(self, tx: Transaction, certificate: IssuedCertificate) -> None:
        """Record an issued certificate. ``ConflictError`` if its serial is recorded already."""
        ...

    async def get(self, serial: str, *, tx: Transaction | None = None) -> IssuedCertificate | None:
        """The issued certificate with this serial, or ``None``."""
        ...

    async def live_count(self, ca_key_id: str, *, now: dt.datetime, tx: Transaction | None = None) -> int:
        """How many certificates issued under ``ca_key_id`` are unexpired at ``now`` and not revoked."""
        ...

    async def live_count_for(self, spiffe_id: str, *, now: dt.datetime, tx: Transaction | None = None) -> int:
        """How many certificates of ``spiffe_id`` are unexpired at ``now`` and not revoked."""
        ...

    async def newest(self, spiffe_id: str, *, tx: Transaction | None = None) -> IssuedCertificate | None:
        """The most recently issued certificate of ``spiffe_id`` that is not revoked, or ``None``."""
        ...

    async def lock_identity(self, tx: Transaction, spiffe_id: str, *, shared: bool) -> None:
        """Hold the identity lock of ``spiffe_id`` until ``tx`` ends: shared while a renewal checks and issues,
        exclusive while a revocation writes, so neither misses the other."""
        ...

    async def revoke(
        self, tx: Transaction, *, serial: str | None = None, spiffe_id: str | None = None, reason: str
    ) -> list[Revocation]:
        """Revoke the certificate ``serial``, or every certificate of ``spiffe_id`` (exactly one of them given).

        Returns the revocations this call added (a certificate revoked before is left as it was).
        """
        ...

    async def is_revoked(self, serial: str, *, tx: Transaction | None = None) -> bool:
        """Whether the certificate ``serial`` is revoked."""
        ...

    async def revocations(self, spiffe_id: str) -> list[Revocation]:
        """The revocations of ``spiffe_id``'s certificates, oldest first."""
        ...


class Pools(Protocol):
    """Pools of machines (the ``pools`` group's state). Writes given a ``tx`` commit with it."""

    async def create(
        self,
        tx: Transaction,
        *,
        id: str,
        tenant: str,
        name: str,
        pool_class: str,
        acceptance_checks: Sequence[str],
        labels: Mapping[str, str],
    ) -> PoolRecord:
        """Add a pool. ``ConflictError`` when the tenant has a pool of that name."""
        ...

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[PoolRecord]:
        """The tenant's pools in ``(created_at, id)`` order (a name can change): at most ``limit``, after the key
        ``after``."""
        ...

    async def get(self, id: str) -> PoolRecord | None:
        """A pool by id."""
        ...

    async def update(
        self,
        tx: Transaction,
        *,
        id: str,
        name: str | None = None,
        acceptance_checks: Sequence[str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> PoolRecord | None:
        """Change the given fields; ``None`` for no such pool, ``ConflictError`` when the new name is taken."""
        ...


class JoinTokens(Protocol):
    """Join tokens of pools: only the SHA-256 of a token's secret is ever given to the store."""

    async def create(
        self,
        tx: Transaction,
        *,
        id: str,
        pool_id: str,
        tenant: str,
        secret_hash: bytes,
        uses: int,
        expires_at: dt.datetime,
        expect: Mapping[str, Any],
        reclaim: str,
        created_by: str | None,
    ) -> JoinTokenRecord:
        """Add a token with ``uses`` uses left."""
        ...

    async def for_pool(self, pool_id: str, *, after: Sequence[Any] | None, limit: int) -> list[JoinTokenRecord]:
        """The pool's tokens, newest first (``(created_at, id)`` descending): at most ``limit``, before the key
        ``after``."""
        ...

    async def get(self, id: str) -> JoinTokenRecord | None:
        """A token by id."""
        ...

    async def matching(self, id: str, *, secret_hash: bytes) -> JoinTokenRecord | None:
        """The token ``id`` if its secret hashes to ``secret_hash`` (whatever its state), else ``None``."""
        ...

    async def revoke(self, tx: Transaction, id: str) -> JoinTokenRecord | None:
        """End a token (idempotent); ``None`` for no such token."""
        ...

    async def consume(self, tx: Transaction, *, id: str, secret_hash: bytes, now: dt.datetime) -> TokenConsumption:
        """Spend one use atomically if the hash matches and the token is live at ``now``: of concurrent consumers
        of the last use, exactly one gets ``consumed``."""
        ...


class Nodes(Protocol):
    """Nodes (machines joined to pools). Writes given a ``tx`` commit with it."""

    async def enroll(
        self,
        tx: Transaction,
        *,
        new_id: str,
        pool_id: str,
        tenant: str,
        hardware_key: str,
        claims: Mapping[str, Any],
        attestation: Mapping[str, Any],
        join_token_id: str,
        reclaim: bool,
    ) -> Enrollment:
        """Insert node ``new_id`` as ``adopting``, unless the pool has a live (not retired) node with this hardware
        key: with ``reclaim`` that node is taken back (``adopting`` again, new claims, ``enrollments`` + 1), without
        it the answer is ``conflict`` and nothing is written. Of two concurrent enrollments of one new hardware key,
        one creates the node and the other gets ``ConflictError``."""
        ...

    async def get(self, id: str, *, tx: Transaction | None = None, lock: bool = False) -> NodeRecord | None:
        """A node by id; with ``lock`` (and ``tx``) its row is share-locked until ``tx`` ends, so a reclaim or a
        retirement of it waits (or is waited for)."""
        ...

    async def for_pool(self, pool_id: str) -> list[NodeRecord]:
        """The pool's nodes, oldest first."""
        ...

    async def for_tenant(
        self, tenant: str, *, pool_id: str | None = None, after: Sequence[Any] | None, limit: int
    ) -> list[NodeRecord]:
        """The tenant's nodes (of one pool when ``pool_id`` is given) in ``(created_at, id)`` order: at most
        ``limit``, after the key ``after``."""
        ...

    async def retire(self, tx: Transaction, id: str) -> NodeRecord | None:
        """Retire a node for good (idempotent): it can no longer renew, fetch secrets or be reclaimed; ``None`` for
        no such node."""
        ...


class JoinKeys(Protocol):
    """JoinService's key pairs (sealed by the KMS)."""

    async def active(self) -> JoinKeyRecord | None:
        """The active key, if one was made."""
        ...

    async def create_if_none(self, *, id: str, public_key: str, sealed_key: bytes) -> JoinKeyRecord:
        """Add this key as the active one unless there is an active key already; returns the active key (so of
        several processes starting at once, all end up with the one that was stored first)."""
        ...


class Commands(Protocol):
    """Commands for daemons. Writes given a ``tx`` commit with it; state changes are guarded by the state they
    leave, so a repeated or concurrent call changes nothing twice."""

    async def create(
        self,
        tx: Transaction,
        *,
        id: str,
        node_id: str,
        tenant: str,
        kind: str,
        payload: Mapping[str, Any],
        deadline: dt.datetime,
        on_session_loss: str,
        max_attempts: int,
    ) -> CommandRecord:
        """Add a ``pending`` command."""
        ...

    async def get(self, id: str) -> CommandRecord | None:
        """A command by id."""
        ...

    async def dispatch(self, *, node_id: str, epoch: int, now: dt.datetime, limit: int) -> list[CommandRecord]:
        """Mark up to ``limit`` of the node's ``pending`` commands, oldest first, ``dispatched`` on session ``epoch``
        (counting an attempt) and return them; commands past their deadline are left to the sweeper."""
        ...

    async def finish(
        self, *, id: str, epoch: int, state: str, result: Mapping[str, Any], reason: str | None
    ) -> CommandRecord | None:
        """Record the outcome (``succeeded`` or ``failed``) of a command dispatched on session ``epoch``; ``None``
        when it is not dispatched on that epoch any more (expired, re-dispatched, finished already)."""
        ...

    async def expire(self, tx: Transaction, *, now: dt.datetime, limit: int) -> list[CommandRecord]:
        """Turn up to ``limit`` open (``pending`` or ``dispatched``) commands whose deadline passed by ``now`` into
        ``expired`` (reason ``deadline_exceeded``); returns them as they are now."""
        ...

    async def orphaned(
        self, tx: Transaction, *, stale_before: dt.datetime, now: dt.datetime, limit: int
    ) -> list[CommandRecord]:
        """Settle up to ``limit`` ``dispatched`` commands whose session died (closed, replaced by a newer epoch,
        gone, or not seen since ``stale_before``): back to ``pending`` when they declare ``redispatch`` and have
        attempts left, else ``failed`` (``session_lost`` or ``attempts_exhausted``). Returns them as they are now."""
        ...


class Sessions(Protocol):
    """Daemon sessions, as gateways report them."""

    async def open(self, *, node_id: str, gateway: str) -> SessionRecord:
        """Start a session of the node on ``gateway`` with the node's next epoch (``nodes.session_epoch`` + 1);
        any earlier session of the node is over from then on."""
        ...

    async def seen(self, alive: Sequence[tuple[str, int]], *, gateway: str) -> int:
        """Record that these sessions (node id, epoch) held by ``gateway`` are alive, in one statement whatever their
        number; returns how many were still current (not closed, not replaced)."""
        ...

    async def close(self, *, node_id: str, epoch: int) -> bool:
        """End the session ``epoch`` of the node (a no-op once a newer one opened)."""
        ...

    async def get(self, node_id: str) -> SessionRecord | None:
        """The node's latest session."""
        ...


class Bookings(Protocol):
    """Bookings of atoms by reservations. The store refuses two bookings of one atom whose times overlap, whatever
    the timing (PostgreSQL: an exclusion constraint)."""

    async def book(
        self,
        tx: Transaction,
        *,
        atom_id: str,
        reservation_id: str,
        tenant: str,
        pool_id: str,
        gpus: float,
        start: dt.datetime,
        end: dt.datetime | None,
    ) -> Booking:
        """Book ``atom_id`` for ``[start, end)``; ``ConflictError`` when it is booked for an overlapping time."""
        ...

    async def release(self, tx: Transaction, *, reservation_id: str, at: dt.datetime) -> int:
        """End the reservation's bookings at ``at`` (those ending later or never); returns how many changed."""
        ...

    async def for_reservation(self, reservation_id: str) -> list[Booking]:
        """The reservation's bookings."""
        ...


class Usage(Protocol):
    """Usage records, computed from bookings per closed period. Recomputing a period replaces its records, so an
    accounting pass may run again over the same periods without counting anything twice. Bookings that end after
    ``accounted_until`` must be kept until a pass has accounted them."""

    async def accounted_until(self, tx: Transaction) -> dt.datetime | None:
        """The end of the last period accounted (locked until ``tx`` ends), ``None`` before the first pass."""
        ...

    async def earliest_booking(self, tx: Transaction) -> dt.datetime | None:
        """The start of the earliest booking, ``None`` when there is none."""
        ...

    async def account(self, tx: Transaction, *, start: dt.datetime, end: dt.datetime, period: dt.timedelta) -> int:
        """(Re)compute the records of every period of length ``period`` in ``[start, end)`` (``start`` aligned) and
        set ``accounted_until`` to ``end``; returns how many records were written."""
        ...

    async def records(
        self, *, tenant: str, since: dt.datetime, until: dt.datetime, pool_id: str | None = None
    ) -> list[UsageRecord]:
        """The tenant's records of periods starting in ``[since, until)``, by period then pool."""
        ...


class IdempotencyKeys(Protocol):
    """Idempotency keys: per identity, a key is bound to the hash of the first request made with it."""

    async def begin(self, *, identity: str, key: str, request_hash: str, ttl: dt.timedelta) -> IdempotencyOutcome:
        """Reserve ``key`` for this request, or report what an earlier use of it left (see ``IdempotencyOutcome``)."""
        ...

    async def finish(self, *, identity: str, key: str, result: Mapping[str, Any]) -> None:
        """Store the result that later uses of the key replay."""
        ...

    async def abandon(self, *, identity: str, key: str) -> None:
        """Forget a reservation whose request failed, so the key may be used again."""
        ...


@runtime_checkable
class Transaction(Protocol):
    """One database transaction; what is written through it commits or rolls back together."""

    async def enqueue(self, items: Sequence[WorkItem]) -> None:
        """Add work that becomes visible when the transaction commits."""
        ...

    async def publish(self, events: Sequence[OutboxEvent]) -> None:
        """Add outbox events that become visible when the transaction commits."""
        ...

    async def audit(self, record: AuditRecord) -> None:
        """Add an audit row."""
        ...

    async def project(self, resource: ResourceRef, *, owner: str | None = None) -> None:
        """Record in the authorization projection which tenant (and pool, and owner) a resource belongs to.

        ``resource.id`` and ``resource.tenant`` are required. Write it in the transaction that creates the resource
        (tx 1 of admission), so that decisions on the resource by id see its tenant.
        """
        ...

    async def unproject(self, resource_type: str, resource_id: str) -> None:
        """Remove a resource from the authorization projection."""
        ...

    async def tenant_exists(self, tenant: str) -> bool:
        """Whether ``tenant`` is a tenant the IAM knows, read in this transaction.

        A handler that creates a resource in a tenant asks this in the transaction that inserts it and raises
        ``NotFoundError`` when it is ``False``, so no row is written for a tenant that does not exist. A tenant found
        stays locked against deletion until the transaction ends.
        """
        ...


class Store(Protocol):
    """The authoritative state. The only implementation shipped is ``bettercompute_store_pg.PgStore``.

    ``open`` may be called before ``migrate``; nothing opens a connection before ``open``. Every method may raise
    ``UnavailableError`` when the database cannot be reached.

    Optional member, not part of this protocol so that stores without a pool still conform: ``pool_capacity``, an
    ``int``, the most connections the store hands out at once (read with ``getattr(store, "pool_capacity",
    None)``). ``better_compute()`` checks ``Options.max_in_flight`` and the worker loops' needs against it.
    """

    @property
    def dialect(self) -> str:
        """Which migrations this store runs: modules list theirs under this name (``"postgresql"``)."""
        ...

    @property
    def leases(self) -> Leases:
        """Leases with fencing tokens."""
        ...

    @property
    def queue(self) -> WorkQueue:
        """The work queue."""
        ...

    @property
    def outbox(self) -> Outbox:
        """Committed events."""
        ...

    @property
    def idempotency(self) -> IdempotencyKeys:
        """Idempotency keys."""
        ...

    @property
    def webhooks(self) -> Webhooks:
        """Webhook subscriptions and deliveries."""
        ...

    @property
    def secrets(self) -> SecretStore:
        """Secrets of the ``secrets`` group (sealed by the KMS)."""
        ...

    @property
    def nonces(self) -> ReplayGuard:
        """Nonces seen by ``Unsealer`` (replay protection of sealed join payloads)."""
        ...

    @property
    def membership(self) -> Membership:
        """Worker membership rows."""
        ...

    @property
    def workflows(self) -> WorkflowStore:
        """Workflows and their step logs."""
        ...

    @property
    def pools(self) -> Pools:
        """Pools of machines."""
        ...

    @property
    def join_tokens(self) -> JoinTokens:
        """Join tokens of pools (hashes only)."""
        ...

    @property
    def certificates(self) -> Certificates:
        """The node CA's keys, issued certificates and revocations."""
        ...

    @property
    def nodes(self) -> Nodes:
        """Nodes joined to pools."""
        ...

    @property
    def join_keys(self) -> JoinKeys:
        """JoinService's key pairs (sealed)."""
        ...

    @property
    def commands(self) -> Commands:
        """Commands for daemons."""
        ...

    @property
    def sessions(self) -> Sessions:
        """Daemon sessions."""
        ...

    @property
    def bookings(self) -> Bookings:
        """Bookings of atoms."""
        ...

    @property
    def usage(self) -> Usage:
        """Usage records."""
        ...

    def on_enqueued(self, listener: Callable[[frozenset[str]], Awaitable[None]]) -> Callable[[], None]:
        """Call ``listener(kinds)`` after each commit that enqueued work of ``kinds`` (``Transaction.enqueue`` or
        ``queue.enqueue``); a listener's failure is logged, never raised to the writer. Returns an unsubscribe."""
        ...

    async def open(self) -> None:
        """Prepare connections. Idempotent."""
        ...

    async def close(self) -> None:
        """Close every connection. Idempotent."""
        ...

    async def ping(self) -> None:
        """Raise ``UnavailableError`` unless the database answers now."""
        ...

    async def now(self) -> dt.datetime:
        """The database's clock (UTC), used to anchor the process's clock."""
        ...

    async def install(self) -> list[int]:
        """Apply the store's own migrations (its tables for leases, work, outbox, idempotency keys and audit).

        Returns the versions applied by this call; idempotent and safe from several processes at once.
        """
        ...

    async def migrate(self, module: str, migrations: Sequence[Migration]) -> list[int]:
        """Apply the module's migrations not applied yet, in version order, under a lock shared by all processes.

        Returns the versions applied by this call. Idempotent; safe to run from several processes at once.
        Raises ``InvalidConfigError`` for duplicate versions or a recorded version whose name changed.
        """
        ...

    def transaction(self, *, fence: Lease | None = None) -> AbstractAsyncContextManager[Transaction]:
        """A transaction. With ``fence``, it fails with ``FailedPreconditionError`` (and writes nothing) unless the
        lease is still held with that token when it commits. While it is open, ``in_transaction()`` is true in the
        task that opened it (run its body inside ``transaction_scope()``)."""
        ...


# --- the rest ---------------------------------------------------------------------------------------------------


class Notifier(Protocol):
    """Optional pokes that wake loops sooner. Loops must converge without them; a poke may be lost or repeated."""

    async def notify(self, channel: str, payload: str = "") -> None:
        """Send a poke; never raises for a missing listener."""
        ...

    def listen(self, channel: str) -> AbstractAsyncContextManager[AsyncIterator[str]]:
        """Receive pokes on ``channel`` while the context is open."""
        ...


class Kms(Protocol):
    """Envelope encryption of secrets at rest (webhook signing secrets, later BMC credentials).

    ``encrypt`` returns one self-contained blob (the data key, wrapped by the KMS's key, travels with the
    ciphertext); ``decrypt`` reverses it. ``context`` is bound to the ciphertext as associated data: a blob only
    decrypts under the context it was made with (say ``webhook:<tenant>:<id>``), so a ciphertext copied onto another
    row is refused. Both are safe to retry; ``encrypt`` never returns the same blob twice.

    Raises (both): ``UnavailableError`` when a remote KMS cannot be reached; ``InvalidConfigError`` when the key
    itself is missing or unusable. ``decrypt`` raises ``InternalError`` for a blob that is malformed, tampered with,
    made under another key or bound to another context (stored state is wrong; no caller input can cause it).
    """

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        """Seal ``plaintext`` for storage, bound to ``context``."""
        ...

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        """Open a blob made by ``encrypt`` with the same ``context``."""
        ...


class Clock(Protocol):
    """Wall-clock time for the control plane (anchored to the database's clock by ``initialize()``)."""

    def now(self) -> dt.datetime:
        """Timezone-aware UTC now."""
        ...


@attrs.frozen(kw_only=True)
class ResourceRef:
    """What an action is checked on: a resource type, optionally one resource, and where it lives."""

    type: str
    id: str | None = None
    tenant: str | None = None
    pool: str | None = None


@attrs.frozen(kw_only=True)
class Identity:
    """Who is calling, as established by ``Iam.authenticate``."""

    principal_id: str
    principal_name: str
    kind: str
    tenant_id: str
    is_root: bool
    credential_id: str


@attrs.frozen(kw_only=True)
class Decision:
    """One allowing authorization decision; its ``id`` goes into the audit row of the mutation it allowed."""

    id: str
    action: str
    resource: ResourceRef
    principal_id: str


class Iam(Protocol):
    """Authentication and authorization, embedded or remote.

    The dispatcher calls ``authenticate`` once per request and ``require`` once per call, after the tenant pre-check.
    An IAM that also declares methods (the embedded one) is a ``Module`` as well and is registered as one.
    """

    async def authenticate(self, credential: str) -> Identity:
        """The identity behind a credential.

        Raises ``UnauthenticatedError`` for a garbled, unknown, expired or revoked credential (a garbled one without
        any database lookup) and ``UnavailableError`` when it cannot tell.
        """
        ...

    async def require(self, identity: Identity, action: str, resource: ResourceRef) -> Decision:
        """Allow (returning the decision) or raise ``AccessDeniedError``.

        For a ``resource.id`` the identity may not see (another tenant's, or unknown) it may raise
        ``NotFoundError("no such <type>", details={"id": ...})`` instead (``<type>`` with ``-`` read as a space),
        the same answer a handler gives for a missing id, so the two cases cannot be told apart.
        """
        ...
