"""``reservations`` on real PostgreSQL: admission (placement, quota, refusals with nothing written, idempotency,
tenant isolation), cancel, extend and explain, on nodes and atoms inserted as the inventory controller leaves them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import psycopg
import pytest

from bettercompute.errors import (
    AccessDeniedError,
    ConflictError,
    InvalidInputError,
    NoCapacityError,
    NotFoundError,
    QuotaExceededError,
)
from bettercompute.modules.capacity import SetQuotaInput
from bettercompute.modules.reservations import (
    CancelReservationInput,
    Constraints,
    CreateReservationInput,
    ExplainReservationInput,
    ExtendReservationInput,
    GetReservationInput,
    ListReservationsInput,
)
from bettercompute.modules.reservations._controller import sweep_drafts
from bettercompute.modules.reservations._port import RESERVATIONS, Draft

from .conftest import NOW, Plane, seed_fleet
from .conftest import reservations as _group
from .conftest import rows as _rows

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

HOUR = dt.timedelta(hours=1)


def _written(plane: Plane, database_url: str) -> tuple[Any, ...]:
    """Reservations (drafts too), bookings, reservation projection rows, idempotency keys and audit rows."""
    return _rows(
        plane,
        database_url,
        "SELECT (SELECT count(*) FROM {s}.reservations), (SELECT count(*) FROM {s}.bookings),"
        " (SELECT count(*) FROM {s}.authz_resources WHERE resource_type = 'reservation'),"
        " (SELECT count(*) FROM {s}.idempotency_keys),"
        " (SELECT count(*) FROM {s}.audit WHERE resource_type = 'reservation')",
    )[0]


async def _fleet(plane: Plane, database_url: str, nodes: int = 2, **kwargs: Any) -> str:
    pool = await plane.pool()
    seed_fleet(database_url, plane.t.store.schema, tenant=plane.t.acme, pool=pool, nodes=nodes, **kwargs)
    return pool


def _admissions(plane: Plane, resource: str = "reservation", **labels: str) -> float:
    """``bettercompute_admissions_total`` summed over the samples with these labels."""
    total = 0.0
    for family in plane.t.compute.metrics.registry.collect():
        for sample in family.samples:
            wanted = {"resource": resource, **labels}
            if sample.name == "bettercompute_admissions_total" and all(
                sample.labels[k] == v for k, v in wanted.items()
            ):
                total += sample.value
    return total


async def test_a_reservation_is_placed_by_best_fit_booked_audited_and_announced(
    plane: Plane, database_url: str
) -> None:
    pool = await _fleet(plane, database_url, nodes=2)
    r = _group(plane)
    first = await r.create(
        plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=3, duration="PT8H")
    )
    assert first.state == "placed"
    assert (first.start_at, first.end_at) == (NOW, NOW + 8 * HOUR)
    assert [p.node_id for p in first.placement] == ["n0"] and len(first.placement[0].atoms) == 3
    # Best fit: the next 4-GPU request goes on the node with 5 free (n0), not the empty one.
    second = await r.create(
        plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=4, duration="PT1H")
    )
    assert [p.node_id for p in second.placement] == ["n0"]
    # 9 GPUs cannot go on one node: the fewest nodes, the largest first.
    third = await r.create(
        plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=9, duration="PT1H")
    )
    assert sorted(p.node_id for p in third.placement) == ["n0", "n1"]
    assert sum(len(p.atoms) for p in third.placement) == 9
    booked = _rows(plane, database_url, "SELECT reservation_id, count(*) FROM {s}.bookings GROUP BY 1")
    assert dict(booked) == {first.id: 3, second.id: 4, third.id: 9}
    audit = _rows(
        plane,
        database_url,
        "SELECT action, resource_id, decision_id IS NOT NULL FROM {s}.audit WHERE resource_type = 'reservation'",
    )
    assert sorted(audit) == sorted(("compute:reservations:create", x.id, True) for x in (first, second, third))
    events = _rows(plane, database_url, "SELECT type, key FROM {s}.outbox WHERE type LIKE 'reservation.%%'")
    assert sorted(events) == sorted(("reservation.placed", x.id) for x in (first, second, third))
    got = await r.get(plane.t.alice, GetReservationInput(id=first.id))
    assert got == first
    why = await r.explain(plane.t.alice, ExplainReservationInput(id=third.id))
    assert (why.placer, why.rule) == ("inline", "fewest_nodes")


async def test_no_capacity_says_why_and_when_and_writes_nothing(plane: Plane, database_url: str) -> None:
    pool = await _fleet(plane, database_url, nodes=1)
    r = _group(plane)
    held = await r.create(
        plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=6, duration="PT2H")
    )
    before = _written(plane, database_url)
    with pytest.raises(NoCapacityError) as caught:
        await r.create(
            plane.t.alice,
            CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=4, duration="PT1H"),
            idempotency_key="k-nocap",
        )
    details = caught.value.details
    assert details["excluded"] == {"booked": 6, "free": 2}
    assert details["earliest_start"] == held.end_at.isoformat()
    assert _written(plane, database_url) == before
    with pytest.raises(NoCapacityError) as caught:
        await r.create(
            plane.t.alice,
            CreateReservationInput(
                tenant=plane.t.acme, pool_id=pool, gpus=1, duration="PT1H", constraints=Constraints(model="A100")
            ),
        )
    assert caught.value.details["excluded"] == {"model": 8}
    assert caught.value.details["earliest_start"] is None
    with pytest.raises(NoCapacityError) as caught:
        await r.create(
            plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=4096, duration="PT1H")
        )
    assert _written(plane, database_url) == before
    # Counted for the metrics, by the reason that left out the most atoms.
    assert _admissions(plane, outcome="placed", reason="") == 1
    assert _admissions(plane, outcome="no_capacity") == 3
    assert _admissions(plane, outcome="no_capacity", reason="model") == 1
    assert _admissions(plane, outcome="no_capacity", reason="booked") == 2


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"duration": "PT0S"}, "duration"),
        ({"duration": "P31D"}, "duration"),
        ({"duration": "-PT1H"}, "duration"),
        ({"duration": "PT\uff11H"}, "duration"),  # a full-width digit one
        ({"end_at": NOW - HOUR}, "end_at"),
        ({"end_at": NOW}, "end_at"),
        ({}, "duration"),
        ({"duration": "PT1H", "end_at": NOW + HOUR}, "duration"),
        ({"duration": "PT1H", "start_at": NOW - dt.timedelta(days=1)}, "start_at"),
        ({"duration": "PT1H", "gpus": 0}, "gpus"),
        ({"duration": "PT1H", "constraints": {"mig_profile": "1g.10gb", "nvlink": True}}, "constraints.nvlink"),
        ({"duration": "PT1H", "constraints": {"colour": "red"}}, "constraints.colour"),
    ],
)
async def test_bad_input_is_refused_with_its_path_and_nothing_written(
    plane: Plane, database_url: str, fields: dict[str, Any], path: str
) -> None:
    pool = await _fleet(plane, database_url, nodes=1)
    body: dict[str, Any] = {"tenant": plane.t.acme, "pool_id": pool, "gpus": 1, **fields}
    for key in ("start_at", "end_at"):
        if isinstance(body.get(key), dt.datetime):
            body[key] = body[key].isoformat()
    before = _written(plane, database_url)
    response = await plane.t.http.post(
        "/api/compute/reservations/create", headers={"authorization": f"Bearer {plane.t.alice}"}, json=body
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "INVALID_INPUT"
    assert error["details"]["path"] == path
    assert _written(plane, database_url) == before


async def test_a_caller_of_another_tenant_is_refused_before_any_query(plane: Plane, database_url: str) -> None:
    pool = await _fleet(plane, database_url, nodes=1)
    r = _group(plane)
    await r.list(plane.t.mallory, ListReservationsInput(tenant=plane.t.globex))  # authentication is cached now
    before = plane.t.store.pool_usage.checkouts  # every database access is one checkout
    with pytest.raises(AccessDeniedError):
        await r.create(
            plane.t.mallory, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=1, duration="PT1H")
        )
    assert plane.t.store.pool_usage.checkouts == before
    # Its own tenant but another tenant's pool: no such pool, nothing written.
    with pytest.raises(NotFoundError):
        await r.create(
            plane.t.mallory, CreateReservationInput(tenant=plane.t.globex, pool_id=pool, gpus=1, duration="PT1H")
        )
    placed = await r.create(
        plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=1, duration="PT1H")
    )
    # Another tenant's reservation is one it cannot tell from none.
    with pytest.raises(NotFoundError):
        await r.get(plane.t.mallory, GetReservationInput(id=placed.id))
    with pytest.raises(NotFoundError):
        await r.cancel(plane.t.mallory, CancelReservationInput(id=placed.id))
    assert (await r.get(plane.t.alice, GetReservationInput(id=placed.id))).state == "placed"


async def test_an_idempotent_retry_replays_and_another_request_with_the_key_conflicts(
    plane: Plane, database_url: str
) -> None:
    pool = await _fleet(plane, database_url, nodes=1)
    r = _group(plane)
    ask = CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=2, duration="PT1H", idempotency_key="k-1")
    first = await r.create(plane.t.alice, ask)
    again = await r.create(plane.t.alice, ask, idempotency_key="k-1")
    assert again == first
    with pytest.raises(ConflictError):
        await r.create(
            plane.t.alice,
            CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=3, duration="PT1H", idempotency_key="k-1"),
        )
    with pytest.raises(InvalidInputError):
        await r.create(plane.t.alice, ask, idempotency_key="k-2")
    assert _rows(plane, database_url, "SELECT count(*) FROM {s}.bookings")[0][0] == 2


async def test_quotas_are_enforced_under_their_lock(plane: Plane, database_url: str) -> None:
    pool = await _fleet(plane, database_url, nodes=2)
    r = _group(plane)
    from bettercompute.modules.capacity import QuotasGroup

    quotas: QuotasGroup[Any] = plane.t.compute.api.group(QuotasGroup)
    await quotas.set(
        plane.t.alice, SetQuotaInput(pool_id=pool, max_gpus=4, max_gpu_hours_per_month=20, max_reservation_hours=10)
    )
    await r.create(plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=3, duration="PT2H"))
    with pytest.raises(QuotaExceededError) as caught:
        await r.create(
            plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=2, duration="PT1H")
        )
    assert caught.value.details["limit"] == "max_gpus"
    # After the first ends, 4 at once fit, but 4 GPUs for 4 h is 16 GPU-hours on top of 6: over 20.
    with pytest.raises(QuotaExceededError) as caught:
        await r.create(
            plane.t.alice,
            CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=4, start_at=NOW + 2 * HOUR, duration="PT4H"),
        )
    assert caught.value.details["limit"] == "max_gpu_hours_per_month"
    with pytest.raises(InvalidInputError) as bad:
        await r.create(
            plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=1, duration="PT11H")
        )
    assert bad.value.details["path"] == "duration"
    fits = await r.create(
        plane.t.alice,
        CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=4, start_at=NOW + 2 * HOUR, duration="PT3H"),
    )
    assert fits.state == "placed"
    assert _admissions(plane, outcome="quota_exceeded", reason="") == 2
    assert _admissions(plane, outcome="placed") == 2
    assert _admissions(plane, outcome="no_capacity") == 0  # a window too long is an input error, not an admission


async def test_cancel_releases_and_extend_needs_the_atoms_free(plane: Plane, database_url: str) -> None:
    pool = await _fleet(plane, database_url, nodes=1, gpus=2)
    r = _group(plane)
    a = await r.create(
        plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=2, duration="PT1H")
    )
    later = await r.create(
        plane.t.alice,
        CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=2, start_at=NOW + 2 * HOUR, duration="PT1H"),
    )
    longer = await r.extend(plane.t.alice, ExtendReservationInput(id=a.id, duration="PT1H"))
    assert longer.end_at == NOW + 2 * HOUR
    with pytest.raises(NoCapacityError):
        await r.extend(plane.t.alice, ExtendReservationInput(id=a.id, duration="PT1M"))
    cancelled = await r.cancel(plane.t.alice, CancelReservationInput(id=later.id, reason="plans changed"))
    assert (cancelled.state, cancelled.reason) == ("cancelled", "plans changed")
    assert (
        _rows(plane, database_url, f"SELECT count(*) FROM {{s}}.bookings WHERE reservation_id = '{later.id}'")[0][0]
        == 0
    )
    assert (await r.extend(plane.t.alice, ExtendReservationInput(id=a.id, duration="PT1H"))).end_at == NOW + 3 * HOUR
    page = await r.list(plane.t.alice, ListReservationsInput(tenant=plane.t.acme, state="placed"))
    assert [x.id for x in page.reservations] == [a.id]
    assert _admissions(plane, "reservation_extension", outcome="placed") == 2
    assert _admissions(plane, "reservation_extension", outcome="no_capacity", reason="booked") == 1


async def test_the_pool_lease_placer_answers_pending_and_places_oldest_first(
    database_url: str, fresh_schema: str, tmp_path: Any
) -> None:
    from bettercompute import JoinSettings, LocalKeyKms
    from bettercompute.modules.capacity import CapacitySettings
    from bettercompute.testing import ManualClock

    from ..iam.conftest import two_tenants

    clock = ManualClock(NOW)
    join = JoinSettings(gateway_address="gw.capacity.example:443", trust_domain="capacity.example")
    async with two_tenants(
        database_url,
        fresh_schema,
        join=join,
        kms=LocalKeyKms(tmp_path / "kms.key"),
        clock=clock,
        capacity=CapacitySettings(placer="pool-lease"),
    ) as t:
        plane = Plane(t=t, clock=clock)
        pool = await _fleet(plane, database_url, nodes=1, gpus=4)
        r = _group(plane)
        asks = [3, 2, 1]  # the second cannot fit once the first is placed; the third can
        made = []
        for n in asks:
            clock.set(clock.now() + dt.timedelta(seconds=1))  # first come, first placed
            made.append(
                await r.create(t.alice, CreateReservationInput(tenant=t.acme, pool_id=pool, gpus=n, duration="PT1H"))
            )
        assert [m.state for m in made] == ["pending"] * 3 and all(m.placement == () for m in made)
        await t.compute.jobs.tick({"scheduler"})
        after = [await r.get(t.alice, GetReservationInput(id=m.id)) for m in made]
        assert [a.state for a in after] == ["placed", "failed", "placed"]
        assert after[1].reason == "no_capacity"
        why = await r.explain(t.alice, ExplainReservationInput(id=after[0].id))
        assert why.placer == "pool-lease"
        events = _rows(plane, database_url, "SELECT type FROM {s}.outbox WHERE key = '" + made[1].id + "' ORDER BY seq")
        assert [e for (e,) in events] == ["reservation.pending", "reservation.failed"]
        booked = _rows(plane, database_url, "SELECT reservation_id, count(*) FROM {s}.bookings GROUP BY 1")
        assert dict(booked) == {made[0].id: 3, made[2].id: 1}


async def test_a_reservation_on_a_node_that_is_retired_fails_with_the_reason(plane: Plane, database_url: str) -> None:
    from bettercompute.modules.nodes import RetireNodeInput

    pool = await _fleet(plane, database_url, nodes=2, gpus=2)
    r = _group(plane)

    def catch_up() -> None:
        # Work enqueued outside admission is dated by the database's clock: the manual clock keeps a little ahead
        # of it, so that what one pass enqueues is due in the same tick.
        plane.clock.set(max(plane.clock.now(), dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)))

    catch_up()
    made = await r.create(
        plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=3, duration="PT2H")
    )
    assert sorted(p.node_id for p in made.placement) == ["n0", "n1"]
    await plane.t.compute.jobs.tick({"controllers"})
    # Its nodes' desired states carry it (no daemon here acknowledges them, so it stays placed).
    desired = _rows(plane, database_url, "SELECT id, desired_generation, desired_state FROM {s}.nodes ORDER BY id")
    assert [(i, g, [a["id"] for a in d["allocations"]]) for i, g, d in desired] == [
        ("n0", 1, [made.id]),
        ("n1", 1, [made.id]),
    ]
    await plane.t.compute.api.nodes.retire(plane.t.alice, RetireNodeInput(id="n1", reason="burnt"))
    catch_up()
    await plane.t.compute.jobs.tick({"controllers"})  # the node's wake-up enqueues its reservations' passes
    await plane.t.compute.jobs.tick({"controllers"})
    failed = await r.get(plane.t.alice, GetReservationInput(id=made.id))
    assert (failed.state, failed.reason) == ("failed", "node_failed")
    ends = _rows(plane, database_url, f"SELECT upper(during) FROM {{s}}.bookings WHERE reservation_id = '{made.id}'")
    assert ends and all(end <= plane.clock.now() for (end,) in ends)  # released when it failed
    catch_up()
    await plane.t.compute.jobs.tick({"controllers"})
    n0 = _rows(plane, database_url, "SELECT desired_state FROM {s}.nodes WHERE id = 'n0'")[0][0]
    assert n0["allocations"] == []  # the surviving node no longer carries it
    events = _rows(
        plane, database_url, f"SELECT type, payload->>'reason' FROM {{s}}.outbox WHERE key = '{made.id}' ORDER BY seq"
    )
    assert events[-1] == ("reservation.failed", "node_failed")


async def test_concurrent_admissions_never_pass_a_nearly_full_quota_together(plane: Plane, database_url: str) -> None:
    import anyio

    from bettercompute.modules.capacity import QuotasGroup

    pool = await _fleet(plane, database_url, nodes=4, gpus=4)
    quotas: QuotasGroup[Any] = plane.t.compute.api.group(QuotasGroup)
    await quotas.set(plane.t.alice, SetQuotaInput(pool_id=pool, tenant=plane.t.acme, max_gpus=5))
    r = _group(plane)
    outcomes: list[str] = []

    async def one() -> None:
        try:
            await r.create(
                plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=1, duration="PT1H")
            )
            outcomes.append("placed")
        except QuotaExceededError:
            outcomes.append("quota")

    async with anyio.create_task_group() as tg:
        for _ in range(24):  # more than the store's pool of connections
            tg.start_soon(one)
    assert sorted(outcomes) == ["placed"] * 5 + ["quota"] * 19
    assert _rows(plane, database_url, "SELECT count(*) FROM {s}.bookings")[0][0] == 5


async def test_cordoned_draining_and_unhealthy_nodes_are_skipped_and_counted(plane: Plane, database_url: str) -> None:
    from bettercompute.modules.nodes import CordonNodeInput

    pool = await _fleet(plane, database_url, nodes=4, gpus=2)
    await plane.t.compute.api.nodes.cordon(plane.t.alice, CordonNodeInput(id="n0", reason="rack work"))
    await plane.t.compute.api.nodes.drain(plane.t.alice, CordonNodeInput(id="n1", reason="retiring soon"))
    with psycopg.connect(database_url, autocommit=True) as conn:
        s = f'"{plane.t.store.schema}"'
        conn.execute(f"UPDATE {s}.nodes SET state = 'unreachable' WHERE id = 'n2'")  # within its grace: atoms stay
        conn.execute(f"UPDATE {s}.atoms SET state = 'unavailable', reason = 'xid-79' WHERE id = 'atom-n3-0'")
    r = _group(plane)
    only = await r.create(
        plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=1, duration="PT1H")
    )
    assert [(p.node_id, p.atoms) for p in only.placement] == [("n3", ("GPU-n3-1",))]
    with pytest.raises(NoCapacityError) as caught:
        await r.create(
            plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=1, duration="PT1H")
        )
    assert caught.value.details["excluded"] == {"cordoned": 4, "unhealthy": 3, "booked": 1}


async def test_released_gpus_are_packed_again_so_a_whole_node_stays_free(plane: Plane, database_url: str) -> None:
    # Two nodes of 8. A cancelled (and an ended) reservation's GPUs count as free again at once for the best fit:
    # the next requests fill the node they were on, and a whole-node request still finds the other node whole.
    pool = await _fleet(plane, database_url, nodes=2)
    r = _group(plane)

    async def create(gpus: int, **kwargs: Any) -> Any:
        return await r.create(
            plane.t.alice,
            CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=gpus, duration="PT1H", **kwargs),
        )

    four = await create(4)
    two = await create(2)
    assert [p.node_id for p in four.placement] == [p.node_id for p in two.placement] == ["n0"]
    plane.clock.advance(dt.timedelta(minutes=10))  # it ran for a while: its booking is cut, not taken back
    await r.cancel(plane.t.alice, CancelReservationInput(id=four.id))
    six = await create(6)
    assert [p.node_id for p in six.placement] == ["n0"]  # n0 has 6 free again; n1 stays whole
    whole = await create(8, constraints=Constraints(one_node=True))
    assert [p.node_id for p in whole.placement] == ["n1"]
    why = await r.explain(plane.t.alice, ExplainReservationInput(id=six.id))
    assert why.rule == "best_fit_one_node"


async def test_an_ended_reservations_gpus_are_packed_again(plane: Plane, database_url: str) -> None:
    pool = await _fleet(plane, database_url, nodes=2)
    r = _group(plane)
    # Work the controllers enqueue is dated by the database's clock: keep the manual clock a little ahead of it.
    plane.clock.set(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5))

    async def create(gpus: int, duration: str) -> Any:
        made = await r.create(
            plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=gpus, duration=duration)
        )
        return [p.node_id for p in made.placement], made

    assert (await create(4, "PT1H"))[0] == ["n0"]
    assert (await create(4, "PT3H"))[0] == ["n0"]
    assert (await create(3, "PT3H"))[0] == ["n1"]
    plane.clock.advance(HOUR + dt.timedelta(minutes=1))
    await plane.t.compute.jobs.tick({"controllers"})
    states = _rows(plane, database_url, "SELECT state, count(*) FROM {s}.reservations GROUP BY 1")
    assert dict(states) == {"ended": 1, "placed": 2}
    # n0 has 4 free again, n1 has 5: the best fit for 4 is n0, which keeps n1's 5 for a larger request.
    assert (await create(4, "PT1H"))[0] == ["n0"]


async def test_a_reservation_past_its_end_ends_whatever_befell_its_node_after(plane: Plane, database_url: str) -> None:
    from bettercompute.errors import FailedPreconditionError
    from bettercompute.modules.nodes import RetireNodeInput

    pool = await _fleet(plane, database_url, nodes=1, gpus=2)
    r = _group(plane)
    # Work the controllers enqueue is dated by the database's clock: keep the manual clock a little ahead of it.
    plane.clock.set(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5))
    made = await r.create(
        plane.t.alice, CreateReservationInput(tenant=plane.t.acme, pool_id=pool, gpus=2, duration="PT1H")
    )
    plane.clock.advance(HOUR + dt.timedelta(minutes=5))
    # Its end passed before any pass of its controller: cancelling it now is refused as for an ended one ...
    with pytest.raises(FailedPreconditionError) as refused:
        await r.cancel(plane.t.alice, CancelReservationInput(id=made.id))
    assert refused.value.details["state"] == "ended"
    # ... and a node retired after its end does not make it failed: it ran its whole time and ends as planned.
    await plane.t.compute.api.nodes.retire(plane.t.alice, RetireNodeInput(id="n0", reason="decommissioned"))
    await plane.t.compute.jobs.tick({"controllers"})
    await plane.t.compute.jobs.tick({"controllers"})
    ended = await r.get(plane.t.alice, GetReservationInput(id=made.id))
    assert (ended.state, ended.reason) == ("ended", "end_reached")
    sql = f"SELECT lower(during), upper(during) FROM {{s}}.bookings WHERE reservation_id = '{made.id}'"
    booked = _rows(plane, database_url, sql)
    assert booked == [(made.start_at, made.end_at)] * 2  # charged for the whole of it


async def test_a_draft_left_between_the_two_transactions_gives_its_key_back_when_swept(
    plane: Plane, database_url: str
) -> None:
    # A process that stops (or loses the database) after transaction 1 leaves a draft holding the caller's key.
    # The drafts sweeper takes the draft back and the key with it, so the caller's retry is admitted; before, every
    # retry with that key was refused UNAVAILABLE for the key's whole 24 hours.
    pool = await _fleet(plane, database_url, nodes=1)
    repository = plane.t.store.repository(RESERVATIONS)
    draft = Draft(
        id="rsv_00000000000000aa",
        tenant=plane.t.acme,
        pool_id=pool,
        pool_tenants=(plane.t.acme,),
        gpus=1,
        constraints={},
        start_at=NOW + HOUR,
        end_at=NOW + 2 * HOUR,
        labels={},
        created_by="pr_left",
        now=NOW,
        idempotency_key="k-left",
        request_hash="h-left",
    )
    assert (await repository.begin(draft)).state == "drafted"
    retry = attrs.evolve(draft, id="rsv_00000000000000bb")
    assert (await repository.begin(retry)).state == "in_progress"  # the first one may still be coming
    await sweep_drafts(plane.t.compute.context)
    assert _rows(plane, database_url, "SELECT count(*) FROM {s}.reservations")[0][0] == 1  # too young to take
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE \"{plane.t.store.schema}\".reservations SET created_at = created_at - interval '2 minutes'"
        )
    assert await sweep_drafts(plane.t.compute.context) == 1
    assert _rows(plane, database_url, "SELECT count(*) FROM {s}.reservations")[0][0] == 0
    assert (await repository.begin(retry)).state == "drafted"
