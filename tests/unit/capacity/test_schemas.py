"""The ``quotas`` and ``capacity`` inputs' rules: what a quota may hold, and the wire shape the codec reads."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bettercompute._runtime.codec import decode
from bettercompute.errors import InvalidInputError
from bettercompute.fields import Number
from bettercompute.modules.capacity import GetCapacityInput, GetQuotaInput, ListQuotasInput, SetQuotaInput
from bettercompute.modules.capacity._schemas import MAX_GPU_HOURS_PER_MONTH, MAX_GPUS


def _set(**fields: Any) -> SetQuotaInput:
    return SetQuotaInput(pool_id="pool_1", **fields)


def test_a_quota_holds_limits_or_nulls() -> None:
    assert _set().max_gpus is None and _set().max_gpu_hours_per_month is None and _set().tenant is None
    edge = _set(tenant="tn_1", max_gpus=MAX_GPUS, max_gpu_hours_per_month=MAX_GPU_HOURS_PER_MONTH)
    assert (edge.max_gpus, edge.max_gpu_hours_per_month) == (1_000_000, 744_000_000)
    assert _set(max_gpus=0, max_gpu_hours_per_month=0).max_gpus == 0  # zero: nothing may be held
    assert _set(max_gpu_hours_per_month=0.25).max_gpu_hours_per_month == 0.25


@pytest.mark.parametrize(
    "fields",
    [
        {"max_gpus": -1},
        {"max_gpus": MAX_GPUS + 1},
        {"max_gpus": True},
        {"max_gpu_hours_per_month": -0.001},
        {"max_gpu_hours_per_month": MAX_GPU_HOURS_PER_MONTH * 1.001},
        {"max_gpu_hours_per_month": math.nan},
        {"max_gpu_hours_per_month": math.inf},
        {"max_gpu_hours_per_month": -math.inf},
        {"max_gpu_hours_per_month": False},
        {"tenant": ""},
        {"tenant": "a b"},
        {"tenant": "x" * 129},
    ],
)
def test_a_bad_quota_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must"):
        _set(**fields)


@pytest.mark.parametrize("cls", [SetQuotaInput, ListQuotasInput, GetCapacityInput])
def test_a_bad_pool_id_is_refused(cls: type) -> None:
    with pytest.raises(ValueError, match="must be 1 to 128"):
        cls(pool_id="../pools")


def test_get_needs_a_tenant() -> None:
    with pytest.raises(InvalidInputError) as refused:
        decode(GetQuotaInput, {"pool_id": "pool_1"})
    assert refused.value.details["path"] == "tenant"


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"pool_id": "pool_1", "max_gpu_hours_per_month": "10"}, "max_gpu_hours_per_month"),
        ({"pool_id": "pool_1", "max_gpus": 2.5}, "max_gpus"),
        ({"pool_id": "pool_1", "max_gpus": -3}, "max_gpus"),
        ({"pool_id": "pool_1", "max_gpu_hours_per_month": math.nan}, "max_gpu_hours_per_month"),
        ({"pool_id": "pool_1", "max_gpu_hours_per_month": 1e300}, "max_gpu_hours_per_month"),
        ({"pool_id": "pool_1", "limit": 1}, "limit"),
    ],
)
def test_the_codec_refuses_bad_quota_fields_at_their_path(body: dict[str, Any], path: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        decode(SetQuotaInput, body)
    assert refused.value.details["path"] == path


def test_the_capacity_window_is_a_zoned_start_and_1_to_31_days() -> None:
    got = decode(GetCapacityInput, {"pool_id": "pool_1", "start": "2026-03-10T00:00:00+02:00"})
    assert got.start is not None and got.start.hour == 22 and got.start.utcoffset() is not None and got.days == 7
    assert decode(GetCapacityInput, {"pool_id": "pool_1", "days": 31}).days == 31
    for body, path in (
        ({"start": "next week"}, "start"),
        ({"start": "2026-03-10T00:00:00"}, "start"),
        ({"days": 0}, "days"),
        ({"days": 32}, "days"),
        ({"end": "2026-03-10T00:00:00Z"}, "end"),
    ):
        with pytest.raises(InvalidInputError) as refused:
            decode(GetCapacityInput, {"pool_id": "pool_1", **body})
        assert refused.value.details["path"] == path, body


def test_a_number_rule_refuses_what_is_not_a_finite_number() -> None:
    rule = Number(minimum=0, maximum=1, reason="must be between 0 and 1")
    assert [rule.problem(v) for v in (0, 0.5, 1, 1.0)] == [None] * 4
    assert rule.problem(1.5) == rule.problem(-1) == "must be between 0 and 1"
    assert rule.problem(math.nan) == rule.problem(math.inf) == "must be a finite number"
    assert rule.problem(True) == rule.problem("1") == "must be a number"
    assert rule.schema() == {"minimum": 0, "maximum": 1}
