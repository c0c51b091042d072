"""The store's pool, ``max_in_flight`` and the worker loops must fit together, or ``better_compute()`` says why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import attrs
import httpx
import pytest

from bettercompute import Intercepted, Next, Options, better_compute
from bettercompute.errors import InvalidConfigError
from bettercompute_store_pg import PgStore

from .conftest import ROOT, UNREACHABLE, make_iam


def _options(pool_size: int, **options: object) -> Options:
    return Options(store=PgStore(UNREACHABLE, pool_size=pool_size), iam=make_iam(), **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("pool_size", "in_flight"), [(2, 1), (4, 3), (10, 9), (17, 16), (64, 16)])
def test_by_default_requests_leave_the_workers_a_connection(pool_size: int, in_flight: int) -> None:
    assert PgStore(UNREACHABLE, pool_size=pool_size).pool_capacity == pool_size
    assert better_compute(_options(pool_size)).max_in_flight == in_flight


@pytest.mark.parametrize(("pool_size", "in_flight"), [(2, 1), (4, 3), (20, 16), (64, 63)])
def test_a_cap_the_pool_can_serve_is_kept(pool_size: int, in_flight: int) -> None:
    assert better_compute(_options(pool_size, max_in_flight=in_flight)).max_in_flight == in_flight


@pytest.mark.parametrize(("pool_size", "in_flight"), [(2, 2), (4, 4), (4, 16), (10, 10)])
def test_requests_that_would_take_the_workers_last_connection_are_refused(pool_size: int, in_flight: int) -> None:
    with pytest.raises(InvalidConfigError) as info:
        better_compute(_options(pool_size, max_in_flight=in_flight))
    assert info.value.code == "INVALID_CONFIG"
    assert info.value.details["problems"] == [
        f"max_in_flight: {in_flight} requests at once need {in_flight} pooled connections and the worker roles 1 "
        f"more, but the store's pool holds {pool_size}: lower max_in_flight to {pool_size - 1} or raise the pool "
        f"size to {in_flight + 1}"
    ]


def test_a_pool_of_one_cannot_run_a_job_beside_its_lease_renewal() -> None:
    with pytest.raises(InvalidConfigError) as info:
        better_compute(_options(1, max_in_flight=2, lease_ttl=5))
    # Listed with the other problems of the same options, not instead of them.
    assert info.value.details["problems"] == [
        "lease_ttl: must be a datetime.timedelta, not int",
        "store: a pool of 1 connection cannot run a job pass beside its lease renewal; give it at least 2 "
        "(PgStore(pool_size=...))",
        "max_in_flight: 2 requests at once need 2 pooled connections and the worker roles 1 more, but the "
        "store's pool holds 1: lower max_in_flight to 1 or raise the pool size to 3",
    ]


@pytest.mark.parametrize("pool_size", [True, "10", 0, -3, 2.5])
def test_the_pool_size_itself_must_be_a_positive_integer(pool_size: object) -> None:
    with pytest.raises(InvalidConfigError, match="pool_size must be at least 1"):
        PgStore(UNREACHABLE, pool_size=pool_size)  # type: ignore[arg-type]


@attrs.define
class _Gauge:
    """A plugin that counts the calls running at once (each lingers a little, so a burst overlaps)."""

    name: str = "gauge"
    core_range: str = ">=0.1"
    actions: Sequence[str] = ()
    running: int = 0
    most: int = 0

    async def intercept(self, intercepted: Intercepted, next: Next) -> Any:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await anyio.sleep(0.02)
            return await next(intercepted)
        finally:
            self.running -= 1


@pytest.mark.anyio
async def test_a_burst_over_http_waits_its_turn_within_the_pool() -> None:
    gauge = _Gauge()
    # A queue as long as the burst: none of it is shed (tests/integration/core/test_load_shedding.py sheds).
    compute = better_compute(_options(4, plugins=[gauge], max_queued=64))
    transport = httpx.ASGITransport(app=compute.asgi)
    statuses: list[int] = []
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:

        async def one() -> None:
            response = await http.post(
                "/api/compute/system/version", headers={"authorization": f"Bearer {ROOT}"}, json={}
            )
            statuses.append(response.status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(4 * 16):
                tg.start_soon(one)
    assert statuses == [200] * 64
    assert gauge.most == 3  # the pool's size less the workers' connection, not the default 16
