"""``reservations.create`` under contention on real PostgreSQL: many admissions at once for fewer atoms than asked
(through the API object and over HTTP), and many identical calls with one idempotency key.

What a caller must see whatever the interleaving: each atom booked once, exactly as many reservations placed as
there are atoms, every other call refused with ``NO_CAPACITY`` and its reasons (never a retryable ``UNAVAILABLE`` or
an internal error), nothing left behind by a refused call, and one reservation for one idempotency key.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

import anyio
import pytest

from bettercompute.errors import NoCapacityError
from bettercompute.modules.reservations import CreateReservationInput, Reservation

from .conftest import NOW, Plane, seed_fleet
from .conftest import reservations as _group
from .conftest import rows as _rows

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

HOUR = dt.timedelta(hours=1)
NODES = 25
GPUS_PER_NODE = 4
ATOMS = NODES * GPUS_PER_NODE
CALLS = 2 * ATOMS


async def _fleet(plane: Plane, database_url: str) -> str:
    pool = await plane.pool()
    seed_fleet(database_url, plane.t.store.schema, tenant=plane.t.acme, pool=pool, nodes=NODES, gpus=GPUS_PER_NODE)
    return pool


def _assert_written_once(plane: Plane, database_url: str, placed: list[Reservation]) -> None:
    """The placed reservations and nothing else: one booking of one atom each, no atom twice, no draft, one
    projection row, audit row and ``reservation.placed`` event each."""
    ids = sorted(r.id for r in placed)
    by_atom = _rows(plane, database_url, "SELECT atom_id, count(*) FROM {s}.bookings GROUP BY atom_id")
    assert len(by_atom) == ATOMS, "every atom of the pool is booked"
    assert [atom for atom, n in by_atom if n != 1] == [], "an atom booked twice"
    booked = _rows(
        plane,
        database_url,
        "SELECT b.reservation_id, a.node_id, a.ident FROM {s}.bookings AS b JOIN {s}.atoms AS a ON a.id = b.atom_id"
        " ORDER BY 1",
    )
    assert [r for r, _, _ in booked] == ids
    # What each caller was told is where its booking is.
    told = {r.id: (r.placement[0].node_id, r.placement[0].atoms[0]) for r in placed}
    assert all(len(r.placement) == 1 and len(r.placement[0].atoms) == 1 for r in placed)
    assert {r: (node, ident) for r, node, ident in booked} == told
    rows = _rows(plane, database_url, "SELECT id, state FROM {s}.reservations ORDER BY id")
    assert rows == [(i, "placed") for i in ids], "a draft or a stray reservation row is left"
    projected = _rows(
        plane,
        database_url,
        "SELECT resource_id FROM {s}.authz_resources WHERE resource_type = 'reservation' ORDER BY 1",
    )
    assert [r for (r,) in projected] == ids, "a refused call's projection row is left"
    audited = _rows(
        plane,
        database_url,
        "SELECT resource_id FROM {s}.audit WHERE resource_type = 'reservation' ORDER BY 1",
    )
    assert [r for (r,) in audited] == ids
    events = _rows(plane, database_url, "SELECT key FROM {s}.outbox WHERE type = 'reservation.placed' ORDER BY key")
    assert [k for (k,) in events] == ids


async def test_twice_as_many_admissions_as_atoms_book_each_atom_once_and_refuse_the_rest_cleanly(
    plane: Plane, database_url: str
) -> None:
    pool = await _fleet(plane, database_url)
    r = _group(plane)
    placed: list[Reservation] = []
    refused: list[NoCapacityError] = []
    other: list[BaseException] = []

    async def one(i: int) -> None:
        ask = CreateReservationInput(
            tenant=plane.t.acme, pool_id=pool, gpus=1, duration="PT1H", idempotency_key=f"burst-{i}"
        )
        try:
            placed.append(await r.create(plane.t.alice, ask))
        except NoCapacityError as exc:
            refused.append(exc)
        except Exception as exc:  # any other class is a defect: kept to be named in the failure
            other.append(exc)

    async with anyio.create_task_group() as tg:
        for i in range(CALLS):
            tg.start_soon(one, i)

    assert [f"{type(e).__name__}: {e}" for e in other] == [], "only placed or NO_CAPACITY, never a retryable error"
    assert (len(placed), len(refused)) == (ATOMS, CALLS - ATOMS)
    assert len({p.id for p in placed}) == ATOMS
    assert all(p.state == "placed" and (p.start_at, p.end_at) == (NOW, NOW + HOUR) for p in placed)
    _assert_written_once(plane, database_url, placed)

    # Each refusal says why: every atom of the pool counted once, booked (or, for a competitor's booking not yet
    # committed when the refusal looked, free), and the earliest start is when the bookings end.
    reasons = Counter[str]()
    for exc in refused:
        details = exc.details
        assert details["gpus"] == 1
        excluded = details["excluded"]
        assert set(excluded) <= {"booked", "free"}, excluded
        assert sum(excluded.values()) == ATOMS, excluded
        assert excluded.get("booked", 0) > 0, excluded
        assert details["earliest_start"] == (NOW + HOUR).isoformat()
        reasons.update(excluded)
    # The last refusals came after every booking committed: they count all of them booked.
    assert any(exc.details["excluded"] == {"booked": ATOMS} for exc in refused)

    # Only the placed calls' idempotency keys are kept, finished; a refused call's key is gone (a retry runs again).
    keys = _rows(plane, database_url, "SELECT key, state FROM {s}.idempotency_keys ORDER BY key")
    assert all(state == "done" for _, state in keys), "an idempotency key left in_progress"
    assert len(keys) == ATOMS


async def test_many_identical_calls_with_one_idempotency_key_make_one_reservation(
    plane: Plane, database_url: str
) -> None:
    """The first call drafts under the key; the others find it in progress, wait for it (admission polls the key,
    up to 10 s) and replay its answer: the same reservation for every caller, one set of bookings."""
    pool = await _fleet(plane, database_url)
    r = _group(plane)
    ask = CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=3, duration="PT2H", idempotency_key="same")
    answers: list[Reservation] = []
    other: list[BaseException] = []

    async def one() -> None:
        try:
            answers.append(await r.create(plane.t.alice, ask))
        except Exception as exc:  # UNAVAILABLE (still in progress after the wait) would show here
            other.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(one)

    assert [f"{type(e).__name__}: {e}" for e in other] == []
    assert len(answers) == 50
    assert {a.id for a in answers} == {answers[0].id}
    assert all(a == answers[0] for a in answers), "a replay answers what the first call answered"
    assert answers[0].state == "placed" and sum(len(p.atoms) for p in answers[0].placement) == 3
    rows = _rows(plane, database_url, "SELECT id, state FROM {s}.reservations")
    assert rows == [(answers[0].id, "placed")]
    booked = _rows(plane, database_url, "SELECT reservation_id, count(*) FROM {s}.bookings GROUP BY 1")
    assert booked == [(answers[0].id, 3)]
    assert _rows(plane, database_url, "SELECT key, state FROM {s}.idempotency_keys") == [("same", "done")]
    assert _rows(plane, database_url, "SELECT count(*) FROM {s}.authz_resources WHERE resource_type = 'reservation'")[
        0
    ] == (1,)


async def test_an_http_burst_answers_placed_or_no_capacity_envelopes_never_a_5xx(
    plane: Plane, database_url: str
) -> None:
    pool = await _fleet(plane, database_url)
    statuses: list[tuple[int, str, str | None]] = []

    async def one(i: int) -> None:
        response = await plane.t.http.post(
            "/api/compute/reservations/create",
            headers={"authorization": f"Bearer {plane.t.alice}", "idempotency-key": f"http-{i}"},
            json={"tenant": plane.t.acme, "pool_id": pool, "gpus": 1, "duration": "PT1H"},
        )
        assert response.headers["content-type"] == "application/json", response.text
        body = response.json()
        if response.status_code == 200:
            statuses.append((200, body["data"]["state"], body["data"]["id"]))
        else:
            statuses.append((response.status_code, body["error"]["code"], None))

    async with anyio.create_task_group() as tg:
        for i in range(CALLS):
            tg.start_soon(one, i)

    counted = Counter((status, code) for status, code, _ in statuses)
    assert counted == {(200, "placed"): ATOMS, (409, "NO_CAPACITY"): CALLS - ATOMS}, counted
    by_atom = _rows(plane, database_url, "SELECT atom_id, count(*) FROM {s}.bookings GROUP BY atom_id")
    assert len(by_atom) == ATOMS and all(n == 1 for _, n in by_atom)
    ids = sorted(i for _, _, i in statuses if i is not None)
    rows = _rows(plane, database_url, "SELECT id FROM {s}.reservations WHERE state = 'placed' ORDER BY id")
    assert [i for (i,) in rows] == ids
    assert _rows(plane, database_url, "SELECT count(*) FROM {s}.reservations WHERE state <> 'placed'")[0] == (0,)
