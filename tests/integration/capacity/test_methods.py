"""The ``quotas`` and ``capacity`` groups on real PostgreSQL: every method, the effective quota's source, bad input
refused with nothing written, another tenant's caller refused, and the capacity view over atoms and bookings
inserted here (nothing books yet)."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

import httpx
import psycopg
import pytest

from bettercompute.errors import NotFoundError
from bettercompute.modules.capacity import (
    GetCapacityInput,
    GetQuotaInput,
    ListQuotasInput,
    SetQuotaInput,
)

from .conftest import NOW, Plane

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def _post(plane: Plane, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    # Python's JSON writes NaN and the infinities as bare words, as a careless client would send them.
    return await plane.t.http.post(
        f"/api/compute/{path}",
        headers={"authorization": f"Bearer {plane.t.alice}", "content-type": "application/json", **headers},
        content=json.dumps(body, allow_nan=True),
    )


def _quota_rows(plane: Plane, database_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            f'SELECT pool_id, tenant, max_gpus, max_gpu_hours_per_month FROM "{plane.t.store.schema}".quotas'
            " ORDER BY pool_id, tenant"
        ).fetchall()


# --- quotas -----------------------------------------------------------------------------------------------------


async def test_the_effective_quota_is_the_tenants_row_else_the_pool_default_else_unlimited(plane: Plane) -> None:
    t = plane.t
    pool = await plane.pool()
    unlimited = await plane.quotas.get(t.alice, GetQuotaInput(pool_id=pool, tenant=t.globex))
    assert (unlimited.source, unlimited.max_gpus, unlimited.max_gpu_hours_per_month) == ("unlimited", None, None)

    default = await plane.quotas.set(t.alice, SetQuotaInput(pool_id=pool, max_gpus=8, max_gpu_hours_per_month=100.5))
    assert default.tenant is None and default.max_gpus == 8 and default.max_gpu_hours_per_month == 100.5
    own = await plane.quotas.set(t.alice, SetQuotaInput(pool_id=pool, tenant=t.acme, max_gpus=2))
    assert own.tenant == t.acme and own.max_gpu_hours_per_month is None

    for_acme = await plane.quotas.get(t.alice, GetQuotaInput(pool_id=pool, tenant=t.acme))
    assert (for_acme.source, for_acme.max_gpus, for_acme.max_gpu_hours_per_month) == ("tenant", 2, None)
    for_globex = await plane.quotas.get(t.alice, GetQuotaInput(pool_id=pool, tenant=t.globex))
    assert (for_globex.source, for_globex.max_gpus, for_globex.max_gpu_hours_per_month) == ("pool_default", 8, 100.5)

    # Setting again replaces both limits of the row; the list shows the default first.
    await plane.quotas.set(t.alice, SetQuotaInput(pool_id=pool, max_gpu_hours_per_month=10))
    listed = await plane.quotas.list(t.alice, ListQuotasInput(pool_id=pool))
    assert [(q.tenant, q.max_gpus, q.max_gpu_hours_per_month) for q in listed.quotas] == [
        (None, None, 10.0),
        (t.acme, 2, None),
    ]
    assert listed.next_cursor is None
    # Quotas are per pool: another pool of the tenant has none.
    other = await plane.pool("other")
    assert (await plane.quotas.get(t.alice, GetQuotaInput(pool_id=other, tenant=t.acme))).source == "unlimited"
    assert (await plane.quotas.list(t.alice, ListQuotasInput(pool_id=other))).quotas == ()


async def test_quotas_of_another_tenants_pool_are_refused(plane: Plane, database_url: str) -> None:
    t = plane.t
    pool = await plane.pool()
    # Decided on the pool, as join tokens are: another tenant's pool is NOT_FOUND, as an unknown one is.
    with pytest.raises(NotFoundError):
        await plane.quotas.set(t.mallory, SetQuotaInput(pool_id=pool, tenant=t.globex, max_gpus=1000))
    with pytest.raises(NotFoundError):
        await plane.quotas.get(t.mallory, GetQuotaInput(pool_id=pool, tenant=t.globex))
    with pytest.raises(NotFoundError):
        await plane.quotas.list(t.mallory, ListQuotasInput(pool_id=pool))
    with pytest.raises(NotFoundError):
        await plane.capacity.get(t.mallory, GetCapacityInput(pool_id=pool))
    assert _quota_rows(plane, database_url) == []


async def test_an_unknown_pool_or_tenant_is_not_found_and_nothing_is_written(plane: Plane, database_url: str) -> None:
    t = plane.t
    with pytest.raises(NotFoundError):
        await plane.quotas.set(t.root, SetQuotaInput(pool_id="pool_nope", max_gpus=1))
    with pytest.raises(NotFoundError):
        await plane.quotas.get(t.root, GetQuotaInput(pool_id="pool_nope", tenant=t.acme))
    with pytest.raises(NotFoundError):
        await plane.quotas.list(t.root, ListQuotasInput(pool_id="pool_nope"))
    with pytest.raises(NotFoundError):
        await plane.capacity.get(t.root, GetCapacityInput(pool_id="pool_nope"))
    pool = await plane.pool()
    with pytest.raises(NotFoundError) as refused:
        await plane.quotas.set(t.alice, SetQuotaInput(pool_id=pool, tenant="tenant_nope", max_gpus=1))
    assert refused.value.details["path"] == "tenant"
    assert _quota_rows(plane, database_url) == []


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"max_gpus": -1}, "max_gpus"),
        ({"max_gpus": 1_000_001}, "max_gpus"),
        ({"max_gpus": 1.5}, "max_gpus"),
        ({"max_gpus": "8"}, "max_gpus"),
        ({"max_gpu_hours_per_month": -0.5}, "max_gpu_hours_per_month"),
        ({"max_gpu_hours_per_month": 1e12}, "max_gpu_hours_per_month"),
        ({"max_gpu_hours_per_month": math.nan}, "max_gpu_hours_per_month"),
        ({"max_gpu_hours_per_month": math.inf}, "max_gpu_hours_per_month"),
        ({"max_gpu_hours_per_month": -math.inf}, "max_gpu_hours_per_month"),
        ({"tenant": "bad tenant!"}, "tenant"),
        ({"max_cpus": 4}, "max_cpus"),
    ],
)
async def test_bad_quota_input_is_refused_with_its_path_and_nothing_written(
    plane: Plane, database_url: str, body: dict[str, Any], path: str
) -> None:
    pool = await plane.pool()
    response = await _post(plane, "quotas/set", {"pool_id": pool, **body})
    if response.status_code == 400 and response.json()["error"]["details"].get("path") is None:
        # NaN and infinities are not JSON: a strict parser refuses the body before any field is read.
        assert not math.isfinite(body.get("max_gpu_hours_per_month", 0.0)), response.text
    else:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == path, error
    assert response.json()["error"]["code"] == "INVALID_INPUT"
    assert _quota_rows(plane, database_url) == []


async def test_set_is_audited_and_idempotent(plane: Plane, database_url: str) -> None:
    t = plane.t
    pool = await plane.pool()
    body = {"pool_id": pool, "tenant": t.globex, "max_gpus": 4}
    first = await _post(plane, "quotas/set", body, **{"idempotency-key": "quota-1"})
    again = await _post(plane, "quotas/set", body, **{"idempotency-key": "quota-1"})
    assert first.status_code == again.status_code == 200, first.text
    assert first.json() == again.json()
    other = await _post(plane, "quotas/set", {**body, "max_gpus": 5}, **{"idempotency-key": "quota-1"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "CONFLICT"
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            f'SELECT action, tenant, resource_type, resource_id, decision_id FROM "{t.store.schema}".audit'
            " WHERE action = 'compute:quotas:set'"
        ).fetchall()
    assert len(rows) == 1
    _, tenant, resource_type, resource_id, decision_id = rows[0]
    assert (tenant, resource_type, resource_id) == (t.acme, "quota", f"{pool}/{t.globex}") and decision_id
    assert _quota_rows(plane, database_url) == [(pool, t.globex, 4, None)]


async def test_quotas_work_without_node_identity(bare_plane: Plane) -> None:
    t = bare_plane.t
    pool = await bare_plane.pool()
    await bare_plane.quotas.set(t.alice, SetQuotaInput(pool_id=pool, max_gpus=3))
    got = await bare_plane.quotas.get(t.alice, GetQuotaInput(pool_id=pool, tenant=t.acme))
    assert (got.source, got.max_gpus) == ("pool_default", 3)


# --- capacity ---------------------------------------------------------------------------------------------------


def _seed_atoms(plane: Plane, database_url: str, pool: str, other: str) -> None:
    """One node of the pool: four H100s (one unavailable for an XID, one without a reason), an A100 with two MIG
    slices, and bookings around ``NOW``; plus an atom and a booking of another pool, which must not count."""
    s = f'"{plane.t.store.schema}"'
    tenant = plane.t.acme
    hour = dt.timedelta(hours=1)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for node, node_pool in (("node_a", pool), ("node_x", other)):
            conn.execute(
                f"INSERT INTO {s}.nodes (id, tenant, pool_id, state, hardware_key) VALUES (%s, %s, %s, 'adopting', %s)",
                (node, tenant, node_pool, "hw-" + node),
            )
        atoms = [
            # id, node, pool, kind, model, state, reason
            ("a1", "node_a", pool, "gpu", "H100", "available", None),
            ("a2", "node_a", pool, "gpu", "H100", "available", None),
            ("a3", "node_a", pool, "gpu", "H100", "unavailable", "xid-79"),
            ("a4", "node_a", pool, "gpu", "H100", "unavailable", None),
            ("m1", "node_a", pool, "mig", "A100", "available", None),
            ("m2", "node_a", pool, "mig", "A100", "available", None),
            ("x1", "node_x", other, "gpu", "H100", "available", None),
        ]
        for atom, node, atom_pool, kind, model, state, reason in atoms:
            conn.execute(
                f"INSERT INTO {s}.devices (id, node_id, tenant, pool_id, kind, ident, state, model)"
                " VALUES (%s, %s, %s, %s, 'gpu', %s, 'present', %s) ON CONFLICT DO NOTHING",
                ("dev_" + atom, node, tenant, atom_pool, "GPU-" + atom, model),
            )
            conn.execute(
                f"INSERT INTO {s}.atoms (id, node_id, device_id, tenant, pool_id, kind, ident, model, state, reason)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (atom, node, "dev_" + atom, tenant, atom_pool, kind, atom, model, state, reason),
            )
        bookings = [
            # atom, pool, gpus, start, end (None: open)
            ("a1", pool, 1, NOW - hour, NOW + 2 * hour),  # now, 2 h inside a window starting now
            ("a3", pool, 1, NOW - hour, None),  # now, on an unavailable atom, open-ended
            ("m1", pool, 0.5, NOW + 11 * hour, NOW + 14 * hour),  # future, across midnight: 1 h + 2 h
            ("a2", pool, 1, NOW + 30 * dt.timedelta(days=1), NOW + 31 * dt.timedelta(days=1)),  # outside 7 days
            ("x1", other, 1, NOW - hour, NOW + hour),  # another pool
        ]
        for atom, booking_pool, gpus, start, end in bookings:
            conn.execute(
                f"INSERT INTO {s}.bookings (atom_id, reservation_id, tenant, pool_id, gpus, during)"
                " VALUES (%s, 'res_1', %s, %s, %s, tstzrange(%s, %s))",
                (atom, tenant, booking_pool, gpus, start, end),
            )


async def test_capacity_counts_atoms_and_what_is_booked_now_and_over_the_window(
    plane: Plane, database_url: str
) -> None:
    t = plane.t
    pool = await plane.pool()
    _seed_atoms(plane, database_url, pool, await plane.pool("other"))
    view = await plane.capacity.get(t.alice, GetCapacityInput(pool_id=pool))

    assert (view.at, view.start, view.end) == (NOW, NOW, NOW + dt.timedelta(days=7))
    assert (view.atoms, view.available, view.free, view.booked, view.booked_gpus) == (6, 4, 3, 2, 2.0)
    assert view.unavailable == {"unknown": 1, "xid-79": 1}
    by_model = {m.model: m for m in view.models}
    assert set(by_model) == {"A100", "H100"}
    h100, a100 = by_model["H100"], by_model["A100"]
    assert (h100.atoms, h100.available, h100.free, h100.booked, h100.unavailable) == (
        4,
        2,
        1,
        2,
        {"unknown": 1, "xid-79": 1},
    )
    assert (a100.atoms, a100.available, a100.free, a100.booked, a100.booked_gpus) == (2, 2, 2, 0, 0.0)

    # The window's days: today from noon (the open booking's 12 h, a1's 2 h, m1's 0.5 x 1 h before midnight), then
    # the open booking's 24 h a day and m1's 0.5 x 2 h after midnight; the last day is clipped at the window's end.
    assert len(view.days) == 8
    assert view.days[0].day == dt.datetime(2026, 3, 10, tzinfo=dt.UTC)
    assert view.days[0].by_model == {"A100": pytest.approx(0.5), "H100": pytest.approx(14.0)}
    assert view.days[1].by_model == {"A100": pytest.approx(1.0), "H100": pytest.approx(24.0)}
    assert view.days[2].by_model == {"H100": pytest.approx(24.0)}
    assert view.days[7].day == dt.datetime(2026, 3, 17, tzinfo=dt.UTC)
    assert view.days[7].gpu_hours == pytest.approx(12.0)
    total = 14.5 + 25.0 + 5 * 24.0 + 12.0
    assert view.gpu_hours == pytest.approx(total)
    assert sum(d.gpu_hours for d in view.days) == pytest.approx(total)
    assert h100.gpu_hours + a100.gpu_hours == pytest.approx(total)

    # Later, a1's booking has ended and the open one goes on.
    plane.clock.advance(dt.timedelta(hours=3))
    later = await plane.capacity.get(t.alice, GetCapacityInput(pool_id=pool))
    assert (later.booked, later.free) == (1, 4)


async def test_capacity_over_a_window_given(plane: Plane, database_url: str) -> None:
    t = plane.t
    pool = await plane.pool()
    _seed_atoms(plane, database_url, pool, await plane.pool("other"))
    start = NOW + dt.timedelta(days=29, hours=12)
    view = await plane.capacity.get(t.alice, GetCapacityInput(pool_id=pool, start=start))
    assert view.end == start + dt.timedelta(days=7)
    # The open booking all along, and a2's day from day 30.
    assert view.gpu_hours == pytest.approx(7 * 24.0 + 24.0)
    one_hour = await plane.capacity.get(t.alice, GetCapacityInput(pool_id=pool, days=1))
    assert (one_hour.start, one_hour.end, len(one_hour.days)) == (NOW, NOW + dt.timedelta(days=1), 2)
    assert one_hour.days[0].by_model == {"A100": pytest.approx(0.5), "H100": pytest.approx(14.0)}
    assert one_hour.days[1].by_model == {"A100": pytest.approx(1.0), "H100": pytest.approx(12.0)}


@pytest.mark.parametrize("days", [0, -1, 32])
async def test_a_bad_window_is_refused(plane: Plane, days: int) -> None:
    pool = await plane.pool()
    response = await _post(plane, "capacity/get", {"pool_id": pool, "days": days})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["details"]["path"] == "days"


async def test_a_window_at_the_end_of_time_is_answered(plane: Plane) -> None:
    pool = await plane.pool()
    start = dt.datetime(9999, 12, 30, 6, tzinfo=dt.UTC)
    view = await plane.capacity.get(plane.t.alice, GetCapacityInput(pool_id=pool, start=start, days=31))
    assert view.end.year == 9999 and [d.day.day for d in view.days] == [30, 31]


async def test_capacity_is_zeros_without_node_identity(bare_plane: Plane) -> None:
    pool = await bare_plane.pool()
    view = await bare_plane.capacity.get(bare_plane.t.alice, GetCapacityInput(pool_id=pool))
    assert (view.atoms, view.available, view.free, view.booked, view.gpu_hours) == (0, 0, 0, 0, 0.0)
    assert view.models == () and len(view.days) == 8 and all(d.gpu_hours == 0 for d in view.days)
