"""The ``reservations`` group's handlers: ``create`` (admission, see the module's docstring), ``get``, ``list``,
``explain``, ``cancel`` and ``extend``."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections.abc import Mapping
from typing import Any

import attrs

from bettercompute._runtime import codec, idempotency
from bettercompute._runtime.context import ModuleContext
from bettercompute._runtime.registry import CallContext, Drafted, method
from bettercompute.errors import (
    ConflictError,
    FailedPreconditionError,
    InvalidInputError,
    NoCapacityError,
    NotFoundError,
    QuotaExceededError,
    UnavailableError,
)
from bettercompute.modules.capacity import CapacitySettings
from bettercompute.modules.reservations._controller import (
    CONTROLLER,
    LIVE,
    PLACER,
    controller_item,
    event_type,
    transition_event,
)
from bettercompute.modules.reservations._port import RESERVATIONS, AdmitOutcome, AdmitRequest, Draft, ReservationRecord
from bettercompute.modules.reservations._schemas import (
    MAX_HORIZON,
    CancelReservationInput,
    Constraints,
    CreateReservationInput,
    ExplainReservationInput,
    Explanation,
    ExtendReservationInput,
    GetReservationInput,
    ListReservationsInput,
    ListReservationsOutput,
    PlacedNode,
    Reservation,
    Transition,
    parse_duration,
)
from bettercompute.paging import Keyset
from bettercompute.ports import ResourceRef

__all__ = [
    "RESERVATION",
    "cancel_reservation",
    "create_reservation",
    "draft_reservation",
    "explain_reservation",
    "extend_reservation",
    "get_reservation",
    "list_reservations",
]

log = logging.getLogger("bettercompute.reservations")

RESERVATION = "reservation"
"""The resource type of reservations (projection rows, audit rows)."""
MAX_START_AHEAD = dt.timedelta(days=365)
"""How far ahead a reservation may start."""
START_SLACK = dt.timedelta(minutes=1)
"""How far in the past ``start_at`` may be (clocks differ): it then starts now."""


def _in_tenant(input: Any) -> ResourceRef:
    return ResourceRef(type=RESERVATION, tenant=input.tenant)


def _on_reservation(input: Any) -> ResourceRef:
    # Projected with its tenant and pool at create (transaction 1): decided on them.
    return ResourceRef(type=RESERVATION, id=input.id)


def _utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC)


def share_of(profile: str | None) -> float:
    """The share of a GPU one atom is: 1 for a whole GPU, a MIG slice's compute slices out of 7 (as the store
    counts it)."""
    if profile is None:
        return 1.0
    head = profile.split("g", 1)[0]
    return round(min(1.0, (int(head) if head.isdigit() else 7) / 7), 6)


def _like(model: str) -> str:
    escaped = model.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def reservation_of(record: ReservationRecord) -> Reservation:
    """The answer for a stored reservation."""
    placement = tuple(
        PlacedNode(node_id=str(n["node_id"]), atoms=tuple(str(a) for a in n.get("atoms") or ()))
        for n in record.placement.get("nodes") or ()
    )
    history = tuple(
        Transition(state=str(h["state"]), at=_utc(dt.datetime.fromisoformat(str(h["at"]))), reason=h.get("reason"))
        for h in record.history
    )
    state: Any = record.state
    return Reservation(
        id=record.id,
        tenant=record.tenant,
        pool_id=record.pool_id,
        state=state,
        gpus=record.gpus,
        constraints=Constraints(**{k: v for k, v in record.constraints.items() if v is not None}),
        start_at=record.start_at,
        end_at=record.end_at,
        labels=dict(record.labels),
        placement=placement,
        reason=record.reason,
        history=history,
        created_by=record.created_by,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


def _window(input: CreateReservationInput, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """``[start, end)`` of a create, or ``INVALID_INPUT`` naming the field at fault."""
    start = _utc(input.start_at) if input.start_at is not None else now
    if start < now - START_SLACK:
        raise InvalidInputError(
            "start_at: is in the past", details={"path": "start_at", "reason": "must not be in the past"}
        )
    start = max(start, now)
    if start > now + MAX_START_AHEAD:
        raise InvalidInputError(
            "start_at: is more than a year ahead", details={"path": "start_at", "reason": "at most a year ahead"}
        )
    if (input.end_at is None) == (input.duration is None):
        raise InvalidInputError(
            "give end_at or duration (one of them)", details={"path": "duration", "reason": "one of end_at, duration"}
        )
    if input.duration is not None:
        length = parse_duration(input.duration)
        path = "duration"
    else:
        assert input.end_at is not None
        length = _utc(input.end_at) - start
        path = "end_at"
    if length <= dt.timedelta(0):
        reason = "must be after start_at" if path == "end_at" else "must be longer than zero"
        raise InvalidInputError(f"{path}: {reason}", details={"path": path, "reason": reason})
    if length > MAX_HORIZON:
        reason = f"a reservation lasts at most {MAX_HORIZON.days} days"
        raise InvalidInputError(f"{path}: {reason}", details={"path": path, "reason": reason})
    return start, start + length


def _check_constraints(constraints: Constraints) -> None:
    if constraints.nvlink and constraints.mig_profile is not None:
        reason = "MIG slices are not NVLink-connected: ask for one or the other"
        raise InvalidInputError(f"constraints: {reason}", details={"path": "constraints.nvlink", "reason": reason})


NO_CAPACITY_REASONS = ("booked", "free", "cordoned", "unhealthy", "profile", "model", "memory")
"""The reasons a ``NO_CAPACITY`` outcome counts atoms under (``details["excluded"]``), in the order that breaks ties
for the metrics' ``reason`` label."""


def no_capacity_reason(excluded: Mapping[str, int]) -> str:
    """The ``reason`` label of a ``NO_CAPACITY`` admission: the reason that left out the most atoms (ties go to the
    earlier one in ``NO_CAPACITY_REASONS``), or ``no_atoms`` when the pool had none to leave out. Only those values,
    whatever the store reported, so the label stays bounded."""
    best, most = "no_atoms", 0
    for reason in NO_CAPACITY_REASONS:
        count = excluded.get(reason) or 0
        if isinstance(count, int) and count > most:
            best, most = reason, count
    return best


def _count_admission(context: ModuleContext, resource: str, outcome: AdmitOutcome) -> None:
    """``bettercompute_admissions_total``: placed (or pending, with the pool-lease placer), no_capacity with its
    reason, quota_exceeded. Other outcomes (a window too long, a draft gone) are input errors, not admissions."""
    reason = ""
    label: str
    if outcome.state in ("placed", "pending"):
        label = outcome.state
    elif outcome.state == "no_capacity":
        label, reason = "no_capacity", no_capacity_reason(outcome.excluded)
    elif outcome.state == "quota":
        label = "quota_exceeded"
    else:
        return
    context.metrics.admissions.labels(resource, label, reason).inc()


def _refusal(outcome: AdmitOutcome, gpus: int, path: str) -> Exception:
    """The error for an admission (or extension) that did not place."""
    if outcome.state == "quota":
        detail = dict(outcome.detail)
        return QuotaExceededError(
            f"the tenant's quota in this pool does not allow it ({detail.get('limit')})", details=detail
        )
    if outcome.state == "too_long":
        hours = outcome.detail.get("max_reservation_hours")
        reason = f"this pool allows reservations of at most {hours} hours"
        return InvalidInputError(f"{path}: {reason}", details={"path": path, "reason": reason, "max_hours": hours})
    if outcome.state == "no_capacity":
        details: dict[str, Any] = {"gpus": gpus, "excluded": dict(outcome.excluded)}
        details["earliest_start"] = outcome.earliest_start.isoformat() if outcome.earliest_start else None
        return NoCapacityError("no atoms in this pool fit the request for that time", details=details)
    return UnavailableError(
        "the reservation's draft is gone (taken back while it waited); retry",
        details={"reason": "draft_gone", "retryable": True},
    )


# --- create ------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class _Draft:
    id: str


async def draft_reservation(call: CallContext, input: CreateReservationInput) -> Drafted:
    """Admission's first step: the input's own checks, then transaction 1 (the idempotency key, the draft and its
    projection row, one statement); a replay's answer, or the draft for the IAM to decide on."""
    admission = call.admission
    assert admission is not None and call.identity is not None, "the dispatcher sets both for an admitting method"
    identity = call.identity
    claim = admission.idempotency
    context = call.context
    now = context.clock.now()
    on_pool = ResourceRef(type=RESERVATION, tenant=input.tenant, pool=input.pool_id)
    try:
        start, end = _window(input, now)
        _check_constraints(input.constraints)
    except InvalidInputError as exc:
        return Drafted(resource=on_pool, refusal=exc)
    repository = context.store.repository(RESERVATIONS)
    reservation_id = f"rsv_{secrets.token_hex(8)}"
    owners = (input.tenant, identity.tenant_id) if identity.is_root else (input.tenant,)
    draft = Draft(
        id=reservation_id,
        tenant=input.tenant,
        pool_id=input.pool_id,
        pool_tenants=owners,
        gpus=input.gpus,
        constraints={k: v for k, v in codec.encode(input.constraints).items() if v not in (None, False)},
        start_at=start,
        end_at=end,
        labels=input.labels,
        created_by=identity.principal_id,
        now=now,
        idempotency_key=claim.key if claim is not None else None,
        request_hash=claim.fingerprint if claim is not None else None,
    )
    begun = await idempotency.reserve(lambda: repository.begin(draft))
    if begun.state == "no_pool":
        return Drafted(resource=on_pool, refusal=NotFoundError("no such pool", details={"id": input.pool_id}))
    if begun.state == "replay":
        return Drafted(replay=await _replayed(call, begun.result or {}))
    key = draft.idempotency_key

    async def undo() -> None:
        await repository.abandon(reservation_id, identity=identity.principal_id, key=key)

    # The decision names the draft's tenant and pool, which transaction 1 checked (the pool is the tenant's, or the
    # root caller's own): a lookup of the projection row by id would only read back what it wrote. The row is there
    # for every later decision on the reservation by id.
    return Drafted(
        resource=on_pool,
        undo=undo,
        state=_Draft(id=reservation_id),
    )


@method(mutates=True, access="use", resource=_in_tenant, admit=draft_reservation)
async def create_reservation(call: CallContext, input: CreateReservationInput) -> Reservation:
    """Reserve GPUs of a pool for a time: placed at once when atoms fit (best fit on the fewest nodes).

    Raises:
        InvalidInputError: a bad window or constraint, or longer than the pool allows.
        NotFoundError: no such pool in the tenant.
        NoCapacityError: nothing fits; ``details`` counts the atoms left out per reason and gives the earliest start
            within 30 days at which it would fit.
        QuotaExceededError: the tenant's quota in the pool does not allow it.
        ConflictError: the idempotency key was used for another request.
        UnavailableError: a call with the same idempotency key is still running.
    """
    admission = call.admission
    assert admission is not None and admission.drafted is not None and call.identity is not None
    if admission.drafted.refusal is not None:
        raise admission.drafted.refusal
    drafted: _Draft = admission.drafted.state
    identity = call.identity
    context = call.context
    constraints = input.constraints
    settings = context.settings.get(CapacitySettings) or CapacitySettings()
    deferred = settings.placer == "pool-lease"
    work = PLACER.item(input.pool_id) if deferred else CONTROLLER.item(drafted.id)
    outcome = await context.store.repository(RESERVATIONS).admit(
        AdmitRequest(
            id=drafted.id,
            share=input.gpus * share_of(constraints.mig_profile),
            model=_like(constraints.model) if constraints.model is not None else None,
            min_memory_mib=constraints.min_memory_mib,
            one_node=constraints.one_node or constraints.nvlink,
            nvlink=constraints.nvlink,
            mig_profile=constraints.mig_profile,
            now=context.clock.now(),
            horizon=MAX_HORIZON,
            actor=identity.principal_id,
            action=call.method.action,
            decision_id=call.decision.id if call.decision is not None else None,
            event_type=event_type("placed"),
            work=work,
            defer=deferred,
            idempotency=admission.idempotency,
        )
    )
    _count_admission(context, "reservation", outcome)
    if outcome.state not in ("placed", "pending") or outcome.record is None:
        raise _refusal(outcome, input.gpus, "duration" if input.duration is not None else "end_at")
    call.audited_by_store(drafted.id)
    answer = reservation_of(outcome.record)
    if admission.idempotency is not None:
        # The key points at the reservation already (the store recorded it with the admission): a replay whose answer
        # was not stored answers the reservation as it is now.
        await idempotency.remember(context.store.idempotency, admission.idempotency, codec.encode(answer))
    return answer


async def _replayed(call: CallContext, stored: Any) -> Reservation:
    output = stored.get("output")
    if output is not None:
        replayed: Reservation = codec.decode(Reservation, output)
        return replayed
    record = await call.context.store.repository(RESERVATIONS).get(str(stored.get("reservation_id")))
    if record is None:
        raise ConflictError(
            "a request with this idempotency key succeeded before; its reservation is gone",
            details={"reason": "already_done", "id": stored.get("reservation_id")},
        )
    return reservation_of(record)


# --- reads -------------------------------------------------------------------------------------------------------

_PAGES: Keyset[Reservation] = Keyset(dt.datetime, str, key=lambda r: (r.created_at, r.id))


async def _existing(call: CallContext, reservation_id: str) -> ReservationRecord:
    record = await call.context.store.repository(RESERVATIONS).get(reservation_id)
    if record is None:
        raise NotFoundError("no such reservation", details={"id": reservation_id})
    return record


@method(mutates=False, resource=_on_reservation)
async def get_reservation(call: CallContext, input: GetReservationInput) -> Reservation:
    """A reservation by id.

    Raises:
        NotFoundError: there is no such reservation.
    """
    return reservation_of(await _existing(call, input.id))


@method(mutates=False, resource=_in_tenant)
async def list_reservations(call: CallContext, input: ListReservationsInput) -> ListReservationsOutput:
    """A page of a tenant's reservations, newest first.

    Raises:
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _PAGES.after(scope, input.cursor)
    label = tuple(input.label.split("=", 1)) if input.label is not None else None
    records = await call.context.store.repository(RESERVATIONS).page(
        input.tenant,
        state=input.state,
        pool_id=input.pool_id,
        overlaps_start=input.overlaps_start,
        overlaps_end=input.overlaps_end,
        label=(label[0], label[1]) if label is not None else None,
        after=after,
        limit=input.limit + 1,
    )
    reservations, next_cursor = _PAGES.page(scope, [reservation_of(r) for r in records], input.limit)
    return ListReservationsOutput(reservations=reservations, next_cursor=next_cursor)


@method(mutates=False, resource=_on_reservation)
async def explain_reservation(call: CallContext, input: ExplainReservationInput) -> Explanation:
    """Why a reservation is where it is: the placer, its rule, the nodes it chose and how many atoms it weighed.

    Raises:
        NotFoundError: there is no such reservation.
    """
    record = await _existing(call, input.id)
    why = record.placement.get("why") or {}
    nodes = record.placement.get("nodes") or ()
    state: Any = record.state
    return Explanation(
        id=record.id,
        state=state,
        placer=str(why.get("placer") or "none"),
        rule=str(why.get("rule") or "none"),
        nodes=reservation_of(record).placement,
        candidates=int(why.get("candidates") or 0),
        free_on_chosen={str(n["node_id"]): int(n.get("free") or 0) for n in nodes},
        reason=record.reason,
    )


# --- changes -----------------------------------------------------------------------------------------------------


@method(mutates=True, access="use", resource=_on_reservation)
async def cancel_reservation(call: CallContext, input: CancelReservationInput) -> Reservation:
    """Cancel a reservation: its atoms are released now and its nodes' desired state follows. Cancelling a
    cancelled one changes nothing.

    Raises:
        NotFoundError: there is no such reservation.
        FailedPreconditionError: it has ended or failed.
    """
    now = call.context.clock.now()
    async with call.transaction() as tx:
        repository = tx.repository(RESERVATIONS)
        record = await repository.get_for_update(input.id)
        if record is None:
            raise NotFoundError("no such reservation", details={"id": input.id})
        call.describe(resource_type=RESERVATION, resource_id=record.id, tenant=record.tenant)
        if record.state == "cancelled":
            return reservation_of(record)
        if record.state not in LIVE:
            raise FailedPreconditionError(
                f"the reservation has {record.state}", details={"id": record.id, "state": record.state}
            )
        if record.end_at <= now:  # ended; its controller has not said so yet
            raise FailedPreconditionError(
                "the reservation has ended",
                details={"id": record.id, "state": "ended", "end_at": record.end_at.isoformat()},
            )
        await repository.release(record.id, at=now)
        reason = input.reason or "cancelled"
        record = await repository.transition(record, state="cancelled", at=now, reason=reason)
        await tx.publish([transition_event(record, "cancelled", reason=reason)])
        await tx.enqueue([controller_item(record.id)])
        call.describe(details={"reason": reason})
    return reservation_of(record)


@method(mutates=True, access="use", resource=_on_reservation)
async def extend_reservation(call: CallContext, input: ExtendReservationInput) -> Reservation:
    """Move a reservation's end later; only if its atoms stay free in between and the quota allows.

    Raises:
        NotFoundError: there is no such reservation.
        InvalidInputError: neither or both of ``end_at`` and ``duration``, an end that is not later, or longer than
            the pool allows.
        FailedPreconditionError: it is not live (ended, cancelled or failed).
        NoCapacityError: one of its atoms is booked in between.
        QuotaExceededError: the tenant's quota does not allow the added time.
    """
    if (input.end_at is None) == (input.duration is None):
        raise InvalidInputError(
            "give end_at or duration (one of them)", details={"path": "duration", "reason": "one of end_at, duration"}
        )
    now = call.context.clock.now()
    async with call.transaction() as tx:
        repository = tx.repository(RESERVATIONS)
        record = await repository.get_for_update(input.id)
        if record is None:
            raise NotFoundError("no such reservation", details={"id": input.id})
        if record.state not in LIVE:
            raise FailedPreconditionError(
                f"the reservation has {record.state}", details={"id": record.id, "state": record.state}
            )
        path = "end_at" if input.end_at is not None else "duration"
        end = _utc(input.end_at) if input.end_at is not None else record.end_at + parse_duration(input.duration or "")
        if end <= record.end_at:
            reason = "must be later than the reservation's end"
            raise InvalidInputError(f"{path}: {reason}", details={"path": path, "reason": reason})
        if end - record.start_at > MAX_HORIZON:
            reason = f"a reservation lasts at most {MAX_HORIZON.days} days"
            raise InvalidInputError(f"{path}: {reason}", details={"path": path, "reason": reason})
        outcome = await repository.extend(record.id, end_at=end, now=now)
        if outcome.state == "gone":
            raise FailedPreconditionError(
                "the reservation is over or ends before the change", details={"id": record.id, "state": record.state}
            )
        _count_admission(call.context, "reservation_extension", outcome)
        if outcome.state != "placed" or outcome.record is None:
            raise _refusal(outcome, record.gpus, path)
        extended = outcome.record
        await tx.publish([transition_event(extended, "extended", previous_end_at=record.end_at.isoformat())])
        await tx.enqueue([controller_item(extended.id)])
        call.describe(
            resource_type=RESERVATION,
            resource_id=extended.id,
            tenant=extended.tenant,
            details={"end_at": end.isoformat(), "previous_end_at": record.end_at.isoformat()},
        )
    return reservation_of(extended)


# --- the controller ----------------------------------------------------------------------------------------------
