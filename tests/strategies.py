"""Hypothesis strategies shared by the tests."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import attrs
from hypothesis import strategies as st

from bettercompute import Job, Options
from bettercompute._jobs import ROLES
from bettercompute.joins import JoinSettings
from bettercompute.testing import StaticIamDouble
from bettercompute.webhooks import WebhookSettings
from bettercompute_store_pg import PgStore

__all__ = ["OptionsCase", "anything", "options_cases"]

# Nothing listens on port 1; building a PgStore touches nothing anyway.
_UNREACHABLE = "postgresql://postgres@127.0.0.1:1/none"


def anything() -> st.SearchStrategy[Any]:
    """Values of arbitrary types, including the near misses of an option's type (bool for int, float for
    timedelta, text for anything)."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(),
        st.binary(max_size=8),
        st.timedeltas(),
        st.datetimes(),
        st.builds(object),
        st.just(print),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.tuples(inner, inner),
            st.dictionaries(st.text(max_size=5), inner, max_size=3),
        ),
        max_leaves=6,
    )


@attrs.frozen(kw_only=True)
class FakeModule:
    """Shaped like ``bettercompute.Module``, with whatever values a strategy puts in its members."""

    name: Any = "fake"
    version: Any = "0.1.0"
    core_range: Any = ">=0.1"
    groups: Any = ()
    actions: Any = ()
    migrations: Any = attrs.field(factory=dict)
    jobs: Any = ()
    reconcilers: Any = ()
    workflows: Any = ()

    async def start(self, context: Any) -> None:
        return None

    async def stop(self) -> None:
        return None


@attrs.frozen(kw_only=True)
class FakePlugin:
    """Shaped like ``bettercompute.Plugin``, with whatever values a strategy puts in its members."""

    name: Any = "fake-plugin"
    core_range: Any = ">=0.1"
    actions: Any = ()

    async def intercept(self, call: Any, input: Any, next: Any) -> Any:
        return await next(call, input)


async def _no_pass(context: Any) -> int:
    return 0


def _settings_with_anything(cls: type[Any], required: Mapping[str, Any] | None = None) -> st.SearchStrategy[Any]:
    """``cls`` (an attrs class) with arbitrary values in arbitrary fields, the others left as they are."""
    fields = [f.name for f in attrs.fields(cls)]
    return st.builds(
        lambda chosen: cls(**{**(required or {}), **chosen}),
        st.dictionaries(st.sampled_from(fields), anything(), max_size=len(fields)),
    )


def _jobs_with_anything() -> st.SearchStrategy[Any]:
    """A ``Job`` with arbitrary values in some of its fields (one a module may declare by mistake)."""
    required = {"name": "j", "role": "iam", "interval": None, "run": _no_pass}
    return _settings_with_anything(Job, required)


def _durations(low: dt.timedelta, high: dt.timedelta) -> st.SearchStrategy[dt.timedelta]:
    return st.timedeltas(min_value=low, max_value=high)


_SECOND = dt.timedelta(seconds=1)
_DAY = dt.timedelta(days=1)
_NOT_DURATIONS = st.one_of(st.integers(), st.floats(), st.text(max_size=5), st.booleans(), st.none())

# Per field: values better_compute() must accept, and values it must refuse naming the field.
_VALID: dict[str, st.SearchStrategy[Any]] = {
    "store": st.builds(lambda size: PgStore(_UNREACHABLE, pool_size=size), st.integers(17, 64)),
    "iam": st.builds(lambda: StaticIamDouble({})),
    "modules": st.sampled_from([(), [], (FakeModule(),)]),
    "plugins": st.sampled_from([(), (FakePlugin(),)]),
    "endpoint": st.sampled_from(["/api/compute", "/compute", "/a/b.c_d-e"]),
    "notifier": st.none(),
    "clock": st.none(),
    "max_body_bytes": st.integers(1024, 1024**3),
    "max_in_flight": st.one_of(st.none(), st.integers(1, 16)),
    "instance": st.one_of(st.none(), st.text("abcdefghij0123456789:-./", min_size=1, max_size=200)),
    "lease_ttl": _durations(_SECOND, _DAY),
    "poll_interval": _durations(dt.timedelta(milliseconds=1), _DAY),
    "session_timeout": _durations(_SECOND, _DAY),
    "kms": st.none(),
    "webhooks": st.just(WebhookSettings()),
    "join": st.one_of(st.none(), st.just(JoinSettings(gateway_address="gw.example.com:443", trust_domain="ex.com"))),
    "attestors": st.sampled_from([(), []]),
}
_INVALID: dict[str, st.SearchStrategy[Any]] = {
    "store": st.sampled_from([None, 5, "postgresql://x", object()]),
    "iam": st.sampled_from([None, 5, object()]),
    "modules": st.one_of(
        st.sampled_from([5, "modules", {"a": 1}, [object()], [FakeModule(name="")], [FakeModule(jobs=5)]]),
        st.builds(lambda v: [FakeModule(reconcilers=v)], st.sampled_from([5, "r", {1: 2}, None])),
        st.builds(lambda v: [FakeModule(workflows=v)], st.sampled_from([5, "w", {1: 2}, None])),
        st.builds(lambda name: [FakeModule(name=name)], st.one_of(st.integers(), st.lists(st.integers()))),
        st.builds(
            lambda role: [FakeModule(jobs=(Job(name="j", role=role, interval=None, run=_no_pass),))],
            st.text().filter(lambda role: role not in ROLES),
        ),
    ),
    "plugins": st.sampled_from([5, "plugins", [object()], [FakePlugin(name=5)], [FakePlugin(actions=[1])]]),
    "endpoint": st.one_of(st.sampled_from(["", "api", "/api/", "/API"]), st.integers(), st.none()),
    "notifier": st.sampled_from([5, "notifier", object()]),
    "clock": st.sampled_from([5, "clock", object()]),
    "max_body_bytes": st.one_of(
        st.integers(max_value=1023), st.integers(min_value=1024**3 + 1), st.booleans(), st.text(), st.floats()
    ),
    "max_in_flight": st.one_of(
        st.integers(max_value=0), st.integers(min_value=10_001), st.booleans(), st.text(), st.floats()
    ),
    "instance": st.one_of(
        st.just(""),
        st.text(min_size=201, max_size=300),
        st.text(min_size=1).map(lambda t: t + "\x00"),
        st.just("a\ud800b"),
        st.integers(),
    ),
    "lease_ttl": st.one_of(_NOT_DURATIONS, _durations(dt.timedelta.min, _SECOND - dt.timedelta.resolution)),
    "poll_interval": st.one_of(_NOT_DURATIONS, _durations(dt.timedelta.min, dt.timedelta(0)), st.just(_DAY * 2)),
    "session_timeout": st.one_of(_NOT_DURATIONS, _durations(_DAY + dt.timedelta.resolution, dt.timedelta.max)),
    "kms": st.sampled_from([5, "key", object()]),
    "webhooks": st.one_of(
        st.sampled_from([5, "webhooks", None, {}]),
        st.builds(lambda v: WebhookSettings(timeout=v), _NOT_DURATIONS),
        st.builds(lambda v: WebhookSettings(max_attempts=v), st.one_of(st.booleans(), st.text(), st.floats())),
        st.just(WebhookSettings(backoff=dt.timedelta(0))),
    ),
    "join": st.one_of(
        st.sampled_from([5, "gw:443", {}]),
        st.builds(
            lambda v: JoinSettings(gateway_address=v, trust_domain="ex.com"), st.one_of(st.integers(), st.none())
        ),
        st.builds(
            lambda v: JoinSettings(gateway_address="gw:1", trust_domain="ex.com", sealed_token_max_age=v),
            _NOT_DURATIONS,
        ),
    ),
    "attestors": st.sampled_from([5, "attestor", [object()]]),
}
# Arbitrary values: some may happen to be valid, so a case only says they were arbitrary.
_ARBITRARY: dict[str, st.SearchStrategy[Any]] = {
    **{name: anything() for name in _VALID},
    "webhooks": st.one_of(anything(), _settings_with_anything(WebhookSettings)),
    "join": st.one_of(
        anything(),
        _settings_with_anything(JoinSettings, {"gateway_address": "gw:1", "trust_domain": "ex.com"}),
    ),
    "modules": st.one_of(
        anything(),
        st.lists(st.one_of(anything(), _settings_with_anything(FakeModule)), max_size=2),
        st.lists(
            st.builds(lambda jobs: FakeModule(jobs=jobs), st.lists(_jobs_with_anything(), max_size=2)), max_size=2
        ),
    ),
    "plugins": st.one_of(anything(), st.lists(st.one_of(anything(), _settings_with_anything(FakePlugin)), max_size=2)),
}


@attrs.frozen(kw_only=True)
class OptionsCase:
    """Options drawn field by field: ``invalid`` names the fields given a value that must be refused,
    ``arbitrary`` those given any value at all (which may or may not be valid)."""

    options: Options
    invalid: frozenset[str]
    arbitrary: frozenset[str]

    @property
    def valid(self) -> bool:
        """Whether every field was drawn from its valid values."""
        return not self.invalid and not self.arbitrary


@st.composite
def options_cases(draw: st.DrawFn) -> OptionsCase:
    """``Options`` with a few, many or no fields given an invalid or an arbitrary value, the others valid ones."""
    names = sorted(_VALID)
    some = st.sampled_from(names)
    disturbed = draw(
        st.one_of(st.just(frozenset()), st.frozensets(some, min_size=1, max_size=2), st.frozensets(some, min_size=3))
    )
    chosen: dict[str, Any] = {}
    invalid: set[str] = set()
    arbitrary: set[str] = set()
    for name in names:
        kind = draw(st.sampled_from(["invalid", "arbitrary"])) if name in disturbed else "valid"
        chosen[name] = draw({"valid": _VALID, "invalid": _INVALID, "arbitrary": _ARBITRARY}[kind][name])
        if kind == "invalid":
            invalid.add(name)
        elif kind == "arbitrary":
            arbitrary.add(name)
    return OptionsCase(options=Options(**chosen), invalid=frozenset(invalid), arbitrary=frozenset(arbitrary))
