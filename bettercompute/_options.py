"""``Options``: everything one control plane is made of."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from bettercompute._runtime.declarations import Module, Plugin
from bettercompute.modules.capacity import CapacitySettings
from bettercompute.modules.nodes import JoinSettings
from bettercompute.modules.webhooks import WebhookSettings
from bettercompute.ports import Clock, Iam, Kms, Notifier, Store

if TYPE_CHECKING:
    from bettercompute.modules.nodes import Attestor

__all__ = ["Options"]


@attrs.frozen(kw_only=True)
class Options:
    """Everything a control plane is made of. Checked by ``better_compute()``, which lists every problem at once.

    Args:
        store: Where state lives (``bettercompute_store_pg.PgStore``).
        iam: Authentication and authorization (``bettercompute_iam.EmbeddedIam`` or a remote one).
        modules: Optional modules (metal, VPS, your own), registered after the built-in ones.
        plugins: Call interceptors, registered last, outermost first.
        endpoint: Where the HTTP methods are mounted.
        notifier: Optional pokes that wake background loops sooner.
        clock: The wall clock; by default the process clock anchored to the database's at ``initialize()``.
        max_body_bytes: Larger request bodies are refused with 413.
        max_in_flight: Requests handled at once by this process's HTTP handler; more wait their turn. Each holds
            at most one pooled connection, and one connection stays for the worker roles, so it may not exceed the
            store's pool (``PgStore(pool_size=...)``) less one; ``None`` (the default) means 16, or the pool's size
            less one when that is smaller.
        max_queued: Requests that may wait for one of the ``max_in_flight`` slots; one more is answered at once with
            503 ``UNAVAILABLE`` and ``Retry-After`` (load shedding) instead of queueing without bound. ``None`` (the
            default) means as many as ``max_in_flight``: a full queue then drains in about one service time, so an
            admitted request takes at most about twice what it takes at full load. ``0`` sheds as soon as every slot
            is busy; at most 100,000.
        instance: This process's name in leases and worker rows (host and pid by default).
        lease_ttl: How long a worker's leases and membership rows live unrenewed; renewed every third of it.
            Between one second and one day, like ``session_timeout``; ``poll_interval`` between a millisecond and
            a day.
        poll_interval: How often an idle loop looks for due work when no notifier poke wakes it: the reconcile
            loops, the events dispatcher and the webhook sender (``sinks/events``, ``sinks/webhooks``). A poke
            announces new work, not retries coming due, so those wait for the next poll even with a notifier.
        session_timeout: How long a daemon session may go unreported by its gateway before it counts as dead (the
            CommandSweeper then re-dispatches or fails what was sent on it).
        kms: Envelope encryption of secrets at rest (``bettercompute.LocalKeyKms(path)``, or a Vault adapter). The
            built-in ``webhooks`` group keeps its signing secrets with it and is registered only when one is given;
            there is no implicit key file, because every process of one deployment must share the key. A module
            that keeps secrets declares ``requires = ("kms",)``; ``better_compute()`` refuses it without one.
        webhooks: How the ``sinks`` role sends webhooks (attempts, backoff, timeout).
        capacity: How reservations are placed (``placer``: ``inline`` or ``pool-lease``).
        join: The node identity settings (gateway address, SPIFFE trust domain). With ``kms`` it turns on JoinService,
            the node CA and ``compute.gateway_services``; ``join-tokens.create`` renders it into the join command.
        attestors: JoinService's attestor chain after the built-in ``claims`` attestor
            (``bettercompute.modules.nodes.Attestor``), run in order.
    """

    store: Store | None = None
    iam: Iam | None = None
    modules: Sequence[Module] = ()
    plugins: Sequence[Plugin] = ()
    endpoint: str = "/api/compute"
    notifier: Notifier | None = None
    clock: Clock | None = None
    max_body_bytes: int = 1024 * 1024
    max_in_flight: int | None = None
    max_queued: int | None = None
    instance: str | None = None
    lease_ttl: dt.timedelta = dt.timedelta(seconds=15)
    poll_interval: dt.timedelta = dt.timedelta(seconds=1)
    session_timeout: dt.timedelta = dt.timedelta(seconds=45)
    kms: Kms | None = None
    webhooks: WebhookSettings = attrs.field(factory=WebhookSettings)
    capacity: CapacitySettings = attrs.field(factory=CapacitySettings)
    join: JoinSettings | None = None
    attestors: Sequence[Attestor] = ()
