"""Reservations as a Hypothesis state machine on real PostgreSQL: random creates (sometimes under a quota), cancels,
extensions, lost nodes, acknowledgements of the nodes' desired states, and time passing with the controllers
ticking, with the invariants a user relies on checked after every step:

- no atom is booked twice for one moment (the exclusion constraint's job), and a live reservation holds exactly its
  atoms for exactly its time;
- the tenant's quota holds: the most GPUs held at once, and the GPU-hours of each month;
- booked time is what the reservation's state says (a cancelled or failed one up to when it stopped, others whole),
  and the usage job's records are that time, hour by hour;
- every reservation's state is explained by its history: placed, then bound, active, and one end (ended,
  cancelled, failed), each for its reason and not before its time; and what was refused left nothing behind.

One control plane for the test (the ``plane`` fixture); each example gets a pool and a fleet of its own, so examples
do not see each other's bookings. The machine runs in a worker thread (Hypothesis's stateful runner is synchronous)
and calls the API on the test's event loop through ``anyio.from_thread``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
import attrs
import psycopg
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from bettercompute.errors import FailedPreconditionError, NoCapacityError, QuotaExceededError
from bettercompute.modules.capacity import QuotasGroup, SetQuotaInput
from bettercompute.modules.nodes import RetireNodeInput
from bettercompute.modules.reservations import (
    CancelReservationInput,
    CreateReservationInput,
    ExtendReservationInput,
    GetReservationInput,
    ListReservationsInput,
    Reservation,
    ReservationsGroup,
)
from bettercompute.modules.usage import USAGE_RECORDS
from bettercompute.testing import ManualClock

from .conftest import Plane, seed_fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

T = TypeVar("T")

NODES = 4
GPUS_PER_NODE = 4
MINUTE = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
LIVE = frozenset({"placed", "bound", "active"})
# Where each state may go next (a state repeated is an extension, recorded with the reason "extended").
NEXT: dict[str, frozenset[str]] = {
    "placed": frozenset({"bound", "ended", "cancelled", "failed"}),
    "bound": frozenset({"active", "ended", "cancelled", "failed"}),
    "active": frozenset({"ended", "cancelled", "failed"}),
    "ended": frozenset(),
    "cancelled": frozenset(),
    "failed": frozenset(),
}
CANCEL_REASON = "plans changed"

# No shrinking: each step is a few round trips to PostgreSQL, and shrinking a 20-step failure would outlast the
# test's timeout; the failing steps are printed as found (add Phase.shrink here to shrink one by hand).
MACHINE_SETTINGS = settings(
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _run(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    """Run ``fn(*args)`` on the test's event loop, from the machine's thread."""
    return anyio.from_thread.run(fn, *args)


def _catch_up(clock: ManualClock, by: dt.timedelta = dt.timedelta(0)) -> dt.datetime:
    """Move the clock on by ``by``, and at least a minute ahead of the database's clock: work enqueued outside
    admission (a cancel's, a retired node's) is dated by the database, and must be due at the next ticks however
    slowly they run."""
    clock.set(max(clock.now() + by, dt.datetime.now(dt.UTC).replace(microsecond=0) + MINUTE))
    return clock.now()


@attrs.frozen(kw_only=True)
class Booked:
    atom_id: str
    node_id: str
    ident: str
    reservation_id: str
    gpus: float
    start: dt.datetime
    end: dt.datetime


def _peak(bookings: list[Booked], start: dt.datetime, end: dt.datetime) -> float:
    """The most GPUs the bookings hold at one moment of ``[start, end)``."""
    inside = [b for b in bookings if b.start < end and b.end > start]
    points = {start} | {b.start for b in inside if b.start > start}
    return max((sum(b.gpus for b in inside if b.start <= p < b.end) for p in points), default=0.0)


def _month_start(at: dt.datetime) -> dt.datetime:
    return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _next_month(month: dt.datetime) -> dt.datetime:
    return month.replace(year=month.year + 1, month=1) if month.month == 12 else month.replace(month=month.month + 1)


def _months(start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
    months = []
    month = _month_start(start)
    while month < end:
        months.append((month, _next_month(month)))
        month = _next_month(month)
    return months


def _overlap(start: dt.datetime, end: dt.datetime, lo: dt.datetime, hi: dt.datetime) -> float:
    """Seconds of ``[start, end)`` inside ``[lo, hi)``."""
    return max(0.0, (min(end, hi) - max(start, lo)).total_seconds())


def _hours_in(bookings: list[Booked], lo: dt.datetime, hi: dt.datetime) -> float:
    return sum(b.gpus * _overlap(b.start, b.end, lo, hi) for b in bookings) / 3600


def _stopped_at(r: Reservation) -> dt.datetime:
    """Until when a reservation holds its atoms, by its state: a cancelled or failed one until it stopped (not
    before its start), any other to its end."""
    if r.state in ("cancelled", "failed"):
        return max(r.start_at, min(r.end_at, r.history[-1].at))
    return r.end_at


@attrs.define
class World:
    """What every example of the machine shares: the control plane and a connection for the invariants' reads."""

    plane: Plane
    url: str
    conn: psycopg.Connection[Any]
    examples: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    tally: Counter[str] = attrs.field(factory=Counter)
    """What the steps did (printed with ``-s``: a run that never places, cancels or fails anything tests little)."""


class ReservationMachine(RuleBasedStateMachine):
    world: ClassVar[World]

    def __init__(self) -> None:
        super().__init__()
        w = self.world
        self.plane = w.plane
        self.clock = w.plane.clock
        self.n = next(w.examples)
        w.tally["examples"] += 1
        _catch_up(self.clock)
        self.pool: str = _run(self.plane.pool, f"gpus-{self.n}")
        self.nodes = seed_fleet(
            self.world.url,
            self.plane.t.store.schema,
            tenant=self.plane.t.acme,
            pool=self.pool,
            nodes=NODES,
            gpus=GPUS_PER_NODE,
            prefix=f"x{self.n}n",
        )
        self.made: list[str] = []
        self.lost: set[str] = set()
        self.max_gpus: int | None = None
        self.max_hours: float | None = None

    # --- reads ----------------------------------------------------------------------------------------------------

    @property
    def _r(self) -> ReservationsGroup[Any]:
        group: ReservationsGroup[Any] = self.plane.t.compute.api.group(ReservationsGroup)
        return group

    def _sql(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        s = f'"{self.plane.t.store.schema}"'
        return self.world.conn.execute(sql.replace("{s}", s), {"pool": self.pool, **(params or {})}).fetchall()

    def _bookings(self) -> list[Booked]:
        """The pool's bookings, live and moved to history."""
        rows = self._sql(
            "SELECT b.atom_id, a.node_id, a.ident, b.reservation_id, b.gpus, lower(b.during), upper(b.during)"
            " FROM (SELECT * FROM {s}.bookings WHERE pool_id = %(pool)s"
            "       UNION ALL SELECT * FROM {s}.bookings_history WHERE pool_id = %(pool)s) AS b"
            " JOIN {s}.atoms AS a ON a.id = b.atom_id ORDER BY b.id"
        )
        return [
            Booked(atom_id=a, node_id=n, ident=i, reservation_id=r, gpus=float(g), start=lo, end=hi)
            for a, n, i, r, g, lo, hi in rows
        ]

    def _footprint(self) -> tuple[Any, ...]:
        """What a refused call must not change: the pool's reservations (drafts too), bookings and projection rows,
        and the idempotency keys."""
        return self._sql(
            "SELECT (SELECT count(*) FROM {s}.reservations WHERE pool_id = %(pool)s),"
            " (SELECT count(*) FROM {s}.bookings WHERE pool_id = %(pool)s),"
            " (SELECT count(*) FROM {s}.authz_resources WHERE resource_type = 'reservation' AND pool_id = %(pool)s),"
            " (SELECT count(*) FROM {s}.idempotency_keys)"
        )[0]

    def _free(self, start: dt.datetime, end: dt.datetime) -> int:
        """Atoms a new reservation could take for ``[start, end)``: available, on an adopted node, not booked."""
        return int(
            self._sql(
                "SELECT count(*) FROM {s}.atoms AS a JOIN {s}.nodes AS n ON n.id = a.node_id"
                " WHERE a.pool_id = %(pool)s AND a.state = 'available' AND n.state = 'adopted'"
                " AND NOT EXISTS (SELECT 1 FROM {s}.bookings AS b WHERE b.atom_id = a.id"
                "                 AND b.during && tstzrange(%(start)s, %(end)s, '[)'))",
                {"start": start, "end": end},
            )[0][0]
        )

    def _get(self, reservation_id: str) -> Reservation:
        got: Reservation = _run(self._r.get, self.plane.t.alice, GetReservationInput(id=reservation_id))
        return got

    def _pick(self, pick: int) -> str:
        return self.made[pick % len(self.made)]

    def _quota_refusal_is_due(
        self, details: dict[str, Any], share: float, start: dt.datetime, end: dt.datetime
    ) -> None:
        """A quota refusal only when the limit named would really be passed."""
        bookings = self._bookings()
        if details["limit"] == "max_gpus":
            assert self.max_gpus is not None, details
            assert _peak(bookings, start, end) + share > self.max_gpus, details
        else:
            assert details["limit"] == "max_gpu_hours_per_month" and self.max_hours is not None, details
            over = [
                (lo, _hours_in(bookings, lo, hi), share * _overlap(start, end, lo, hi) / 3600)
                for lo, hi in _months(start, end)
            ]
            assert any(used + asked > self.max_hours + 1e-6 for _, used, asked in over), (details, over)

    # --- rules ----------------------------------------------------------------------------------------------------

    @initialize(
        max_gpus=st.none() | st.integers(2, 12),
        max_hours=st.none() | st.sampled_from([6.0, 20.0, 60.0]),
    )
    def set_quota(self, max_gpus: int | None, max_hours: float | None) -> None:
        if max_gpus is None and max_hours is None:
            return
        quotas: QuotasGroup[Any] = self.plane.t.compute.api.group(QuotasGroup)
        ask = SetQuotaInput(
            pool_id=self.pool, tenant=self.plane.t.acme, max_gpus=max_gpus, max_gpu_hours_per_month=max_hours
        )
        _run(quotas.set, self.plane.t.alice, ask)
        self.max_gpus, self.max_hours = max_gpus, max_hours

    @rule(
        gpus=st.integers(1, 6),
        start_minutes=st.sampled_from([0, 0, 10, 30, 60, 120, 180]),
        minutes=st.integers(1, 24).map(lambda k: 10 * k),
    )
    def create(self, gpus: int, start_minutes: int, minutes: int) -> None:
        now = self.clock.now()
        start = now + start_minutes * MINUTE
        end = start + minutes * MINUTE
        ask = CreateReservationInput(
            tenant=self.plane.t.acme,
            pool_id=self.pool,
            gpus=gpus,
            start_at=start if start_minutes else None,
            duration=f"PT{minutes}M",
        )
        before = self._footprint()
        free = self._free(start, end)
        try:
            made = _run(self._r.create, self.plane.t.alice, ask)
        except QuotaExceededError as exc:
            self._quota_refusal_is_due(exc.details, float(gpus), start, end)
            assert self._footprint() == before, "a refused create left something behind"
            self.world.tally["create: quota"] += 1
            return
        except NoCapacityError as exc:
            assert free < gpus, f"{gpus} GPUs refused with {free} free"
            excluded = exc.details["excluded"]
            assert excluded.get("free", 0) == free, excluded
            assert sum(excluded.values()) == GPUS_PER_NODE * (NODES - len(self.lost)), excluded
            assert self._footprint() == before, "a refused create left something behind"
            self.world.tally["create: no capacity"] += 1
            return
        assert free >= gpus
        assert made.state == "placed" and (made.start_at, made.end_at) == (start, end)
        assert sum(len(p.atoms) for p in made.placement) == gpus
        assert not {p.node_id for p in made.placement} & self.lost, "placed on a lost node"
        self.made.append(made.id)
        self.world.tally["create: placed"] += 1

    @precondition(lambda self: self.made)
    @rule(pick=st.integers(0, 1000))
    def cancel(self, pick: int) -> None:
        before = self._get(self._pick(pick))
        now = self.clock.now()
        try:
            after = _run(self._r.cancel, self.plane.t.alice, CancelReservationInput(id=before.id, reason=CANCEL_REASON))
        except FailedPreconditionError:
            assert before.state in ("ended", "failed"), before.state
            self.world.tally["cancel: refused"] += 1
            return
        if before.state == "cancelled":
            assert after == before, "cancelling a cancelled reservation changed it"
            self.world.tally["cancel: again"] += 1
            return
        assert before.state in LIVE, before.state
        assert (after.state, after.reason) == ("cancelled", CANCEL_REASON)
        assert after.history[-1].at == now
        held = [b for b in self._bookings() if b.reservation_id == before.id]
        assert all(b.end <= max(now, before.start_at) for b in held), "a cancelled reservation still holds atoms"
        self.world.tally[f"cancel: {before.state}"] += 1

    @precondition(lambda self: self.made)
    @rule(pick=st.integers(0, 1000), minutes=st.integers(1, 12).map(lambda k: 10 * k))
    def extend(self, pick: int, minutes: int) -> None:
        before = self._get(self._pick(pick))
        now = self.clock.now()
        more = minutes * MINUTE
        try:
            after = _run(
                self._r.extend, self.plane.t.alice, ExtendReservationInput(id=before.id, duration=f"PT{minutes}M")
            )
        except FailedPreconditionError:
            assert before.state not in LIVE or before.end_at <= now, (before.state, before.end_at, now)
            self.world.tally["extend: refused, over"] += 1
            return
        except NoCapacityError:
            # One of its atoms is someone else's in the added time.
            mine = {b.atom_id for b in self._bookings() if b.reservation_id == before.id}
            taken = [
                b
                for b in self._bookings()
                if b.atom_id in mine
                and b.reservation_id != before.id
                and b.start < before.end_at + more
                and b.end > before.end_at
            ]
            assert taken, "an extension refused as no capacity with its atoms free"
            assert self._get(before.id) == before, "a refused extension changed the reservation"
            self.world.tally["extend: no capacity"] += 1
            return
        except QuotaExceededError as exc:
            self._quota_refusal_is_due(exc.details, float(before.gpus), before.end_at, before.end_at + more)
            assert self._get(before.id) == before, "a refused extension changed the reservation"
            self.world.tally["extend: quota"] += 1
            return
        assert before.state in LIVE and before.end_at > now
        assert (after.state, after.start_at, after.end_at) == (before.state, before.start_at, before.end_at + more)
        assert after.history[-1].reason == "extended"
        self.world.tally[f"extend: {before.state}"] += 1

    @precondition(lambda self: len(self.lost) < NODES - 1)
    @rule(pick=st.integers(0, 1000))
    def lose_node(self, pick: int) -> None:
        node = sorted(set(self.nodes) - self.lost)[pick % (NODES - len(self.lost))]
        _run(self.plane.t.compute.api.nodes.retire, self.plane.t.alice, RetireNodeInput(id=node, reason="burnt"))
        self.lost.add(node)
        self.world.tally["node lost"] += 1

    @rule()
    def nodes_acknowledge(self) -> None:
        """Every surviving node's daemon applies its latest desired state, as a gateway records its ack."""
        self._sql(
            "UPDATE {s}.nodes SET observed_generation = desired_generation"
            " WHERE pool_id = %(pool)s AND state = 'adopted' RETURNING id"
        )
        self.world.tally["acknowledged"] += 1

    @rule(minutes=st.sampled_from([1, 5, 20, 60, 150, 300]), acknowledged=st.booleans())
    def advance_and_tick(self, minutes: int, acknowledged: bool) -> None:
        if acknowledged:
            self.nodes_acknowledge()
        now = _catch_up(self.clock, minutes * MINUTE)
        self.world.tally["ticked"] += 1
        for _ in range(3):  # a retired node's pass enqueues its reservations' passes, due at the next tick
            _run(self.plane.t.compute.jobs.tick, {"controllers"})
        for r in self._list():
            if r.state in LIVE:
                assert r.end_at > now, f"{r.id} is still {r.state} after its end"
                assert not set(self._nodes_of(r)) & self.lost, f"{r.id} is still {r.state} on a lost node"
            if r.state == "bound":
                assert r.start_at > now, f"{r.id} is bound, not active, after its start"
            self.world.tally[f"after a tick: {r.state}"] += 1

    # --- invariants -----------------------------------------------------------------------------------------------

    def _list(self) -> list[Reservation]:
        page = _run(
            self._r.list,
            self.plane.t.alice,
            ListReservationsInput(tenant=self.plane.t.acme, pool_id=self.pool, limit=1000),
        )
        assert page.next_cursor is None
        return list(page.reservations)

    @staticmethod
    def _nodes_of(r: Reservation) -> list[str]:
        return [p.node_id for p in r.placement]

    @invariant()
    def nothing_but_what_was_placed(self) -> None:
        self.world.tally["checks"] += 1
        listed = self._list()
        assert sorted(r.id for r in listed) == sorted(self.made), "a refused create shows, or a placed one is missing"
        rows = self._sql("SELECT id, state FROM {s}.reservations WHERE pool_id = %(pool)s ORDER BY id")
        assert [i for i, _ in rows] == sorted(self.made) and all(s != "draft" for _, s in rows)
        projected = self._sql(
            "SELECT count(*) FROM {s}.authz_resources WHERE resource_type = 'reservation' AND pool_id = %(pool)s"
        )
        assert projected == [(len(self.made),)]

    @invariant()
    def no_atom_is_booked_twice_and_live_ones_hold_exactly_their_atoms(self) -> None:
        bookings = self._bookings()
        by_atom: dict[str, list[Booked]] = {}
        for b in bookings:
            by_atom.setdefault(b.atom_id, []).append(b)
        for atom, held in by_atom.items():
            held.sort(key=lambda b: b.start)
            for a, b in itertools.pairwise(held):
                assert a.end <= b.start, f"{atom} booked twice: {a} and {b}"
        for r in self._list():
            mine = [b for b in bookings if b.reservation_id == r.id]
            if r.state in LIVE:
                assert len(mine) == r.gpus
                assert all((b.start, b.end) == (r.start_at, r.end_at) for b in mine), (r, mine)
                assert sorted((b.node_id, b.ident) for b in mine) == sorted(
                    (p.node_id, a) for p in r.placement for a in p.atoms
                ), "its bookings are not where it says it is placed"

    @invariant()
    def the_quota_holds(self) -> None:
        if self.max_gpus is None and self.max_hours is None:
            return
        bookings = self._bookings()
        if self.max_gpus is not None and bookings:
            start = min(b.start for b in bookings)
            end = max(b.end for b in bookings)
            assert _peak(bookings, start, end) <= self.max_gpus
        if self.max_hours is not None and bookings:
            for lo, hi in _months(min(b.start for b in bookings), max(b.end for b in bookings)):
                assert _hours_in(bookings, lo, hi) <= self.max_hours + 1e-6, lo

    @invariant()
    def booked_time_is_what_the_state_says_and_usage_counts_it(self) -> None:
        listed = self._list()
        bookings = self._bookings()
        for r in listed:
            seconds = sum(b.gpus * (b.end - b.start).total_seconds() for b in bookings if b.reservation_id == r.id)
            expected = r.gpus * (_stopped_at(r) - r.start_at).total_seconds()
            assert seconds == pytest.approx(expected), (r.id, r.state, seconds, expected)
        accounted = self._sql("SELECT accounted_until FROM {s}.usage_state")
        if not accounted or not listed:
            return
        until: dt.datetime = accounted[0][0]
        first = min(r.start_at for r in listed).replace(minute=0, second=0, microsecond=0)
        records = _run(_records, self.plane, self.plane.t.acme, self.pool, first, until)
        hour = first
        while hour + HOUR <= until:
            expected = sum(r.gpus * _overlap(r.start_at, _stopped_at(r), hour, hour + HOUR) for r in listed)
            assert records.get(hour, 0.0) == pytest.approx(expected, abs=1e-3), (hour, records.get(hour), expected)
            hour += HOUR

    @invariant()
    def every_state_is_explained_by_its_history(self) -> None:
        now = self.clock.now()
        for r in self._list():
            states = [h.state for h in r.history]
            assert states and states[0] == "placed", states
            assert states[-1] == r.state, (states, r.state)
            for a, b in itertools.pairwise(r.history):
                assert b.at >= a.at, r.history
                assert b.state in NEXT[a.state] or (b.state == a.state and b.reason == "extended"), states
            assert all(h.at <= now for h in r.history)
            for h in r.history:
                if h.state == "active":
                    assert h.at >= r.start_at, r.history
                if h.state == "ended":
                    assert (h.at >= r.end_at, h.reason) == (True, "end_reached"), r.history
                if h.state == "failed":
                    assert h.reason == "node_failed", r.history
                    assert set(self._nodes_of(r)) & self.lost, "failed without losing a node"
                if h.state == "cancelled":
                    assert h.reason == CANCEL_REASON, r.history
            if r.state in ("cancelled", "failed"):
                assert r.reason == r.history[-1].reason


async def _records(plane: Plane, tenant: str, pool: str, since: dt.datetime, until: dt.datetime) -> dict[Any, float]:
    found = await plane.t.store.repository(USAGE_RECORDS).records(tenant=tenant, since=since, until=until, pool_id=pool)
    return {r.period_start: float(r.gpu_seconds) for r in found}


async def test_reservations_keep_their_invariants_through_any_sequence_of_calls_and_time(
    plane: Plane, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:

        class Machine(ReservationMachine):
            world = World(plane=plane, url=database_url, conn=conn)

        began = time.monotonic()
        await anyio.to_thread.run_sync(lambda: run_state_machine_as_test(Machine, settings=MACHINE_SETTINGS))
        print(f"state machine: {time.monotonic() - began:.1f} s, {dict(sorted(Machine.world.tally.items()))}")
