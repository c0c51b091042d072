"""Options of the wrong type or out of range: ``INVALID_CONFIG`` naming each one, never another exception."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings

from bettercompute import BetterCompute, Job, Options, better_compute
from bettercompute.errors import InvalidConfigError
from bettercompute.modules.nodes import JoinSettings
from bettercompute.modules.webhooks import WebhookSettings
from bettercompute_store_pg import PgStore
from tests.strategies import FakeModule, OptionsCase, options_cases

from .conftest import UNREACHABLE, make_iam

_FIELD = re.compile(r"^(?P<field>[a-z_]+)(?:\[\d+\])?[:.]")


def _named(problem: str) -> str | None:
    """The option a problem names: ``lease_ttl: ...``, ``webhooks.timeout: ...``, ``modules[2]: ...``."""
    if problem.startswith(("module '", "group '")) or problem.endswith(
        ("is not a bettercompute.Reconciler", "is not a bettercompute.Workflow")
    ):
        return "modules"  # a module's own declaration, or the items of its reconcilers or workflows
    if problem.startswith("plugin '"):
        return "plugins"
    match = _FIELD.match(problem)
    return match.group("field") if match else None


def _problems(**options: Any) -> list[str]:
    base: dict[str, Any] = {"store": PgStore(UNREACHABLE), "iam": make_iam()}
    with pytest.raises(InvalidConfigError) as info:
        better_compute(Options(**{**base, **options}))
    assert info.value.code == "INVALID_CONFIG"
    problems: list[str] = info.value.details["problems"]
    return problems


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("lease_ttl", 5, "lease_ttl: must be a datetime.timedelta, not int"),
        ("lease_ttl", 15.0, "lease_ttl: must be a datetime.timedelta, not float"),
        ("lease_ttl", "15s", "lease_ttl: must be a datetime.timedelta, not str"),
        ("poll_interval", None, "poll_interval: must be a datetime.timedelta, not NoneType"),
        ("session_timeout", 45, "session_timeout: must be a datetime.timedelta, not int"),
        ("max_in_flight", "16", "max_in_flight: must be a positive integer (at most 10000) or None"),
        ("max_in_flight", True, "max_in_flight: must be a positive integer (at most 10000) or None"),
        ("max_queued", -1, "max_queued: must be an integer from 0 to 100,000, or None (as max_in_flight)"),
        ("max_queued", 100_001, "max_queued: must be an integer from 0 to 100,000, or None (as max_in_flight)"),
        ("max_queued", True, "max_queued: must be an integer from 0 to 100,000, or None (as max_in_flight)"),
        ("max_queued", "16", "max_queued: must be an integer from 0 to 100,000, or None (as max_in_flight)"),
        ("max_queued", 2.0, "max_queued: must be an integer from 0 to 100,000, or None (as max_in_flight)"),
        ("max_body_bytes", True, "max_body_bytes: must be an integer between 1024 and 1 GiB"),
        ("max_body_bytes", "1048576", "max_body_bytes: must be an integer between 1024 and 1 GiB"),
        ("max_body_bytes", 2**40, "max_body_bytes: must be an integer between 1024 and 1 GiB"),
        ("instance", 7, "instance: must be printable text of 1 to 200 characters, or None"),
        ("instance", "host\x00:1", "instance: must be printable text of 1 to 200 characters, or None"),
        ("instance", "host\ud800", "instance: must be printable text of 1 to 200 characters, or None"),
        ("endpoint", 5, "endpoint: a int must be a path like '/api/compute', without a trailing slash"),
        (
            "endpoint",
            "/api\u202e" + "x" * 10_000,
            "endpoint: '/api\\u202e" + "x" * 59 + "' must be a path like '/api/compute', without a trailing slash",
        ),
        ("modules", "echo", "modules: must be a list or tuple, not str"),
        ("plugins", 3, "plugins: must be a list or tuple, not int"),
        ("attestors", None, "attestors: must be a list or tuple, not NoneType"),
        ("notifier", object(), "notifier: object lacks notify, listen"),
        ("clock", "now", "clock: str lacks now()"),
        (
            "webhooks",
            {"max_attempts": 3},
            "webhooks: must be a bettercompute.modules.webhooks.WebhookSettings, not dict",
        ),
        ("webhooks", WebhookSettings(timeout=10), "webhooks.timeout: must be datetime.timedelta, not int"),  # type: ignore[arg-type]
        ("webhooks", WebhookSettings(max_attempts=True), "webhooks.max_attempts: must be int, not bool"),
        ("webhooks", WebhookSettings(batch_size="50"), "webhooks.batch_size: must be int, not str"),  # type: ignore[arg-type]
        ("webhooks", WebhookSettings(max_backoff=dt.timedelta.max), "webhooks.max_backoff: must be at most 1000 years"),
        ("join", "gw:443", "join: must be a bettercompute.JoinSettings or None, not str"),
        (
            "join",
            JoinSettings(gateway_address="gw:443", trust_domain="ex.com", sealed_token_max_age=60),  # type: ignore[arg-type]
            "join.sealed_token_max_age: must be datetime.timedelta, not int",
        ),
    ],
)
def test_a_wrongly_typed_option_is_invalid_config(field: str, value: Any, expected: str) -> None:
    assert _problems(**{field: value}) == [expected]


@pytest.mark.parametrize("field", ["lease_ttl", "poll_interval", "session_timeout"])
@pytest.mark.parametrize("value", [dt.timedelta(0), dt.timedelta(seconds=-1), dt.timedelta.min])
def test_every_duration_must_be_positive(field: str, value: dt.timedelta) -> None:
    (problem,) = _problems(**{field: value})
    assert problem.startswith(f"{field}: must be at least ")


@pytest.mark.parametrize("field", ["lease_ttl", "poll_interval", "session_timeout"])
def test_a_duration_beyond_a_day_is_refused(field: str) -> None:
    assert _problems(**{field: dt.timedelta(days=2)}) == [f"{field}: must be at most one day"]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, (16, 16)),  # a pool large enough: the default cap, and a queue as long
        ({"store": PgStore(UNREACHABLE, pool_size=4)}, (3, 3)),  # the queue follows the cap the pool allows
        ({"max_in_flight": 5}, (5, 5)),
        ({"max_in_flight": 5, "max_queued": 0}, (5, 0)),  # shed as soon as every slot is busy
        ({"max_queued": 100_000}, (16, 100_000)),
    ],
)
def test_the_queue_bound_defaults_to_the_in_flight_cap(options: dict[str, Any], expected: tuple[int, int]) -> None:
    base: dict[str, Any] = {"store": PgStore(UNREACHABLE, pool_size=64), "iam": make_iam()}
    compute = better_compute(Options(**{**base, **options}))
    assert (compute.max_in_flight, compute.max_queued) == expected


def test_every_wrong_option_is_listed_at_once() -> None:
    problems = _problems(
        lease_ttl=5, poll_interval=dt.timedelta(0), max_in_flight=False, max_queued=-1, webhooks=7, instance=""
    )
    assert sorted(p.split(":")[0] for p in problems) == [
        "instance",
        "lease_ttl",
        "max_in_flight",
        "max_queued",
        "poll_interval",
        "webhooks",
    ]


def test_a_module_with_malformed_members_is_refused_by_name() -> None:
    jobs = [
        Job(name="j", role="nobody", interval=None, run=_no_pass),
        3,
        Job(name="j\x00", role="iam", interval=None, run=_no_pass),
        Job(name="j", role="iam", interval=5, run=_no_pass),  # type: ignore[arg-type]
    ]
    assert _problems(modules=[FakeModule(name=["x"], jobs=jobs), FakeModule(version="1\x00")]) == [
        "modules[0]: name must be non-empty printable text",
        "modules[0]: jobs[0] has an unknown role 'nobody'",
        "modules[0]: jobs[1] is a int, not a bettercompute.Job",
        "modules[0]: jobs[2].name must be printable text of 1 to 200 characters",
        "modules[0]: jobs[3].interval: must be datetime.timedelta or None, not int",
        "modules[1]: version must be non-empty printable text",
    ]


async def _no_pass(context: Any) -> int:
    return 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options_cases())
def test_any_options_give_a_control_plane_or_every_problem(case: OptionsCase) -> None:
    event("valid" if case.valid else "invalid" if case.invalid else "arbitrary only")
    try:
        compute = better_compute(case.options)
    except InvalidConfigError as exc:
        assert exc.code == "INVALID_CONFIG"
        problems = exc.details["problems"]
        assert problems and all(isinstance(p, str) for p in problems)
        named = {_named(p) for p in problems}
        # Every field given a value it must refuse is named; no problem is made up about a field drawn valid.
        assert case.invalid <= named, (problems, case.invalid)
        assert named <= case.invalid | case.arbitrary, (problems, case)
        assert not case.valid
    else:
        assert isinstance(compute, BetterCompute)
        assert not case.invalid, case.invalid
