"""The reservation controller: carries each live reservation in its nodes' desired states, marks it ``bound`` once
they acknowledged it, ``active`` from its start, ``ended`` at its end, ``failed`` when a node is lost for good; the
``pool-lease`` placer; and the sweep of drafts an interrupted admission left behind (the module's docstring tells
the states and events)."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from bettercompute._runtime.reconcile import Outcome, ReconcileContext, Reconciler
from bettercompute.modules.nodes import (
    ACKED_KIND,
    NODES,
    NodeRecord,
    Signing,
    ack_refusal,
    audit_refusal,
    poke_gateways,
    prepared_signer,
    set_desired_state,
)
from bettercompute.modules.reservations._port import RESERVATIONS, ReservationRecord
from bettercompute.modules.reservations._schemas import (
    MAX_HORIZON,
)
from bettercompute.ports import OutboxEvent, Transaction

__all__ = ["ACKED", "CONTROLLER", "LIVE", "PLACEMENT_KIND", "PLACER", "RESERVATION_KIND", "sweep_drafts"]

log = logging.getLogger("bettercompute.reservations")

RESERVATION_KIND = "reservation"
"""The controller's work items (key: a reservation id)."""
LIVE = frozenset({"pending", "placed", "bound", "active"})
"""States in which a reservation holds (or waits for) atoms."""
RECHECK = dt.timedelta(seconds=5)
"""How often a reservation waiting on its nodes is looked at again without being woken."""


def event_type(state: str) -> str:
    """The event a transition into ``state`` publishes."""
    return f"reservation.{state}"


def transition_event(record: ReservationRecord, state: str, **extra: Any) -> OutboxEvent:
    payload: dict[str, Any] = {
        "reservation_id": record.id,
        "tenant": record.tenant,
        "pool_id": record.pool_id,
        "state": state,
        "gpus": record.gpus,
        "node_ids": record.node_ids,
        "start_at": record.start_at.isoformat(),
        "end_at": record.end_at.isoformat(),
    }
    payload.update(extra)
    return OutboxEvent(type=event_type(state), key=record.id, payload=payload)


def controller_item(reservation_id: str, run_at: dt.datetime | None = None) -> Any:
    return CONTROLLER.item(reservation_id, run_at=run_at)


def _allocation(record: ReservationRecord, node_id: str) -> dict[str, Any]:
    atoms: list[str] = []
    for node in record.placement.get("nodes") or ():
        if node.get("node_id") == node_id:
            atoms = [str(a) for a in node.get("atoms") or ()]
    mig = bool(record.constraints.get("mig_profile"))
    return {
        "id": record.id,
        "gpus": [] if mig else atoms,
        "mig": atoms if mig else [],
        "tenant": record.tenant,
        "start_at": record.start_at.isoformat(),
        "end_at": record.end_at.isoformat(),
    }


async def _sync_node(tx: Transaction, node_id: str, now: dt.datetime, signer: Signing | None) -> tuple[str, int | None]:
    """Make the node's desired state carry exactly its live reservations; ``(node state, generation written)``. A
    reservation newly carried records the generation (its binding waits for the node's acknowledgement of it)."""
    node = await tx.repository(NODES).get_for_update(node_id)
    if node is None:
        return "retired", None
    if node.state in ("failed", "retired"):
        return node.state, None
    live = await tx.repository(RESERVATIONS).on_node(node_id, at=now)
    wanted = [_allocation(r, node_id) for r in live]
    current = await tx.repository(NODES).desired_newer([(node_id, -1)])
    content = dict(current[0].content) if current else {}
    if content.get("allocations") == wanted:
        return node.state, None
    desired = await set_desired_state(tx, node, {**content, "allocations": wanted}, signer=signer)
    for record in live:
        if node_id not in record.generations:
            generations = {**record.generations, node_id: desired.generation}
            await tx.repository(RESERVATIONS).transition(record, state=record.state, at=now, generations=generations)
    return node.state, desired.generation


async def reconcile_reservation(ctx: ReconcileContext, reservation_id: str) -> Outcome:
    """Carry a reservation in its nodes' desired states and move it along its states."""
    store = ctx.store
    now = ctx.clock.now()
    record = await store.repository(RESERVATIONS).get(reservation_id)
    if record is None:
        return Outcome.done()
    wrote = False
    lost: list[str] = []
    signer = await prepared_signer(ctx.context)  # the desired states are signed in the transactions below
    for node_id in record.node_ids:
        async with ctx.transaction() as tx:
            node_state, generation = await _sync_node(tx, node_id, now, signer)
        wrote = wrote or generation is not None
        if node_state in ("failed", "retired"):
            lost.append(node_id)
    if wrote:
        await poke_gateways(ctx.context.notifier)
    async with ctx.transaction() as tx:
        repository = tx.repository(RESERVATIONS)
        record = await repository.get_for_update(reservation_id)
        if record is None or record.state not in LIVE:
            return Outcome.done()
        events: list[OutboxEvent] = []
        changed = record
        if record.end_at <= now:
            # Its time is up: it ended, even when a node of it is gone by now (a node lost while it ran wakes this
            # pass at once, so one found lost after the end was most likely lost after it).
            await repository.release(record.id, at=now)  # its bookings ended: only its holds go
            changed = await repository.transition(changed, state="ended", at=now, reason="end_reached")
            events.append(transition_event(changed, "ended"))
        elif lost:
            await repository.release(record.id, at=now)
            changed = await repository.transition(changed, state="failed", at=now, reason="node_failed")
            events.append(transition_event(changed, "failed", reason="node_failed", nodes=lost))
        else:
            if changed.state == "placed" and await _acknowledged(tx, changed):
                changed = await repository.transition(changed, state="bound", at=now)
                events.append(transition_event(changed, "bound"))
            if changed.state == "bound" and changed.start_at <= now:
                changed = await repository.transition(changed, state="active", at=now)
                events.append(transition_event(changed, "active"))
        if events:
            await tx.publish(events)
            if changed.state not in LIVE:
                # The next pass takes it out of its nodes' desired states.
                await tx.enqueue([controller_item(changed.id)])
    if changed.state not in LIVE:
        return Outcome.done()
    wake = changed.end_at
    if changed.state == "bound":
        wake = min(wake, changed.start_at)
    if changed.state == "placed":
        wake = min(wake, now + RECHECK)
    return Outcome.requeue(max(dt.timedelta(0), wake - now))


async def _acknowledged(tx: Transaction, record: ReservationRecord) -> bool:
    """Whether every node of the reservation acknowledged a desired state that carries it."""
    for node_id in record.node_ids:
        generation = record.generations.get(node_id)
        if generation is None:
            return False
        node = await tx.repository(NODES).get(node_id)
        # Only an acknowledgement whose signature the acknowledgement's controller found good (``reconcile_acked``).
        if node is None or node.observed_generation < generation or node.observed_checked != "ok":
            return False
    return True


async def reconcile_acked(ctx: ReconcileContext, node_id: str) -> Outcome:
    """A node acknowledged a newer desired state, or was retired: the acknowledgement's signature is checked (and
    the verdict noted on the node; a refusal is audited once and counted), then its live reservations are looked at
    now (they bind, or fail with it)."""
    node = await ctx.store.repository(NODES).get(node_id)
    if node is not None and node.observed_checked is None and node.observed_generation > 0:
        await _check_acknowledgement(ctx, node)
    records = await ctx.store.repository(RESERVATIONS).on_node(node_id, at=ctx.clock.now())
    waiting = [r.id for r in records]
    if waiting:
        async with ctx.transaction() as tx:
            await tx.enqueue([controller_item(r) for r in waiting])
    return Outcome.done()


async def _check_acknowledgement(ctx: ReconcileContext, node: NodeRecord) -> None:
    why = await ack_refusal(ctx.store, node)
    async with ctx.transaction() as tx:
        noted = await tx.repository(NODES).check_observed(
            node.id, generation=node.observed_generation, verdict=why or "ok"
        )
        if not noted or why is None:
            return
        ctx.context.metrics.facts_refused.labels("desired_ack", why).inc()
        log.warning(
            "node %s: the acknowledgement of generation %d is refused: %s", node.id, node.observed_generation, why
        )
        await audit_refusal(
            tx,
            node_id=node.id,
            tenant=node.tenant,
            fact="desired_ack",
            reason=why,
            signed=node.observed_signed,
            generation=node.observed_generation,
        )


DRAFT_AGE = dt.timedelta(minutes=1)
"""How old a draft must be before the sweeper takes it back. Admission's two transactions are milliseconds apart: a
draft this old was left by a process that stopped, or lost the database, between them. Taking back a draft whose
transaction 2 is still coming is safe (that transaction finds no draft, and admits nothing)."""


async def sweep_drafts(context: Any) -> int:
    """One pass of the drafts sweeper: undo drafts older than ``DRAFT_AGE``, giving their idempotency key back (the
    change never committed), so the caller's retry with that key is admitted instead of refused until it expires."""
    repository = context.store.repository(RESERVATIONS)
    stale = await repository.drafts_before(context.clock.now() - DRAFT_AGE, limit=500)
    for reservation_id in stale:
        await repository.abandon(reservation_id, identity=None, key=None)
    return len(stale)


PLACEMENT_KIND = "placement"
"""The pool-lease placer's work items (key: a pool id)."""
PLACER_BATCH = 100
"""How many pending reservations one pass of the pool-lease placer takes."""


async def reconcile_pool(ctx: ReconcileContext, pool_id: str) -> Outcome:
    """The pool-lease placer: place the pool's pending reservations, oldest first, then have the controller bind
    those placed."""
    placed, _, left = await ctx.store.repository(RESERVATIONS).place_pending(
        pool_id, now=ctx.clock.now(), horizon=MAX_HORIZON, limit=PLACER_BATCH
    )
    if placed:
        async with ctx.transaction() as tx:
            await tx.enqueue([controller_item(r) for r in placed])
    return Outcome.requeue() if left else Outcome.done()


PLACER = Reconciler(kind=PLACEMENT_KIND, reconcile=reconcile_pool, role="scheduler")
"""The pool-lease placer (``scheduler`` role; used when ``Options.capacity.placer`` is ``pool-lease``)."""
CONTROLLER = Reconciler(kind=RESERVATION_KIND, reconcile=reconcile_reservation)
"""The reservation controller (``controllers`` role)."""
ACKED = Reconciler(kind=ACKED_KIND, reconcile=reconcile_acked)
"""Wakes the reservations waiting on a node's acknowledgement."""
