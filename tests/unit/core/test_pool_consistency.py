"""The store's pool, ``max_in_flight`` and the worker loops must fit together, or ``better_compute()`` says why."""

from __future__ import annotations

import pytest

from bettercompute import Options, better_compute
from bettercompute.errors import InvalidConfigError
from bettercompute_store_pg import PgStore

from .conftest import UNREACHABLE, make_iam


def _options(pool_size: int, **options: object) -> Options:
    return Options(store=PgStore(UNREACHABLE, pool_size=pool_size), iam=make_iam(), **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("pool_size", "in_flight"), [(2, 2), (4, 4), (10, 10), (16, 16), (64, 16)])
def test_by_default_requests_in_flight_never_outnumber_the_pool(pool_size: int, in_flight: int) -> None:
    assert PgStore(UNREACHABLE, pool_size=pool_size).pool_capacity == pool_size
    assert better_compute(_options(pool_size)).max_in_flight == in_flight


@pytest.mark.parametrize(("pool_size", "in_flight"), [(2, 1), (4, 4), (20, 16), (64, 64)])
def test_a_cap_the_pool_can_serve_is_kept(pool_size: int, in_flight: int) -> None:
    assert better_compute(_options(pool_size, max_in_flight=in_flight)).max_in_flight == in_flight


@pytest.mark.parametrize(("pool_size", "in_flight"), [(2, 3), (4, 16), (10, 11)])
def test_more_requests_in_flight_than_pooled_connections_is_refused(pool_size: int, in_flight: int) -> None:
    with pytest.raises(InvalidConfigError) as info:
        better_compute(_options(pool_size, max_in_flight=in_flight))
    assert info.value.code == "INVALID_CONFIG"
    assert info.value.details["problems"] == [
        f"max_in_flight: {in_flight} requests at once need {in_flight} pooled connections, but the store's pool "
        f"holds {pool_size}: lower max_in_flight or raise the pool size"
    ]


def test_a_pool_of_one_cannot_run_a_job_beside_its_lease_renewal() -> None:
    with pytest.raises(InvalidConfigError) as info:
        better_compute(_options(1, max_in_flight=2, lease_ttl=5))
    # Listed with the other problems of the same options, not instead of them.
    assert info.value.details["problems"] == [
        "lease_ttl: must be a datetime.timedelta, not int",
        "store: a pool of 1 connection cannot run a job pass beside its lease renewal; give it at least 2 "
        "(PgStore(pool_size=...))",
        "max_in_flight: 2 requests at once need 2 pooled connections, but the store's pool holds 1: lower "
        "max_in_flight or raise the pool size",
    ]


@pytest.mark.parametrize("pool_size", [True, "10", 0, -3, 2.5])
def test_the_pool_size_itself_must_be_a_positive_integer(pool_size: object) -> None:
    with pytest.raises(InvalidConfigError, match="pool_size must be at least 1"):
        PgStore(UNREACHABLE, pool_size=pool_size)  # type: ignore[arg-type]
