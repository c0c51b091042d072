"""Hypothesis strategies shared by the tests.

``hostile_text`` is the text an attacker sends: NUL, unpaired surrogates, full-width and other Unicode digits,
bidirectional and other format marks, very long runs, mixed into plausible identifiers so that some of it passes
the field rules and reaches the store. ``json_bodies(cls)`` builds request bodies for an input class from its
annotations, with such text in every string field and map key, and, now and then, junk in place of a value or a
field that does not exist. ``options_cases()`` builds ``Options`` with valid, invalid and arbitrary values in
every field, saying which fields it spoiled.
"""

from __future__ import annotations

import datetime as dt
import enum
import ipaddress
import json
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st

from bettercompute import Job, MethodDef, Options
from bettercompute._runtime.jobs import ROLES
from bettercompute.fields import Integer, Number, Text, rules_of
from bettercompute.modules.nodes import JoinSettings
from bettercompute.modules.webhooks import WebhookSettings
from bettercompute.testing import StaticIamDouble
from bettercompute_iam._policy import Grant
from bettercompute_store_pg import PgStore

__all__ = [
    "FUZZ",
    "INVISIBLE_MARKS",
    "UNICODE_DIGITS",
    "UNICODE_DOTS",
    "OptionsCase",
    "anything",
    "grants",
    "hostile_text",
    "hostish_text",
    "internal_ipv4_addresses",
    "json_bodies",
    "json_junk",
    "json_values",
    "method_calls",
    "options_cases",
    "storable_text",
    "text_rule_candidates",
    "valid_inputs",
    "wrong_types",
]

# Modest on purpose: it runs in CI on every change, on two cores. Raise ``max_examples`` by hand for a longer hunt.
settings.register_profile(
    "fuzz",
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("fuzz")

# One of each class of character that has broken something, or could: what PostgreSQL cannot store (NUL), what
# UTF-8 cannot encode (unpaired surrogates, both halves and reversed), digits that are digits only to Unicode
# (full-width, Arabic-Indic, Devanagari), bidirectional controls and other invisible format characters, line and
# paragraph separators, the replacement character and a non-BMP character.
SPECIAL = (
    "\x00",
    "\ud800",
    "\udfff",
    "\udc00\ud800",
    "\uff11\uff12\uff17",
    "\u0661\u0662",
    "\u0967",
    "\u202e",
    "\u200f",
    "\u2066",
    "\u200b",
    "\ufeff",
    "\u2028",
    "\x85",
    "\x7f",
    "\n",
    "\ufffd",
    "\U0001f600",
    "%2F",
    "../",
    "'",
    '"',
    "\\",
)

_plain = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
# Hypothesis leaves surrogates out of its text unless asked: they are asked for here.
_any_char = st.characters() | st.characters(categories=["Cs"])
_piece = st.one_of(
    _plain,
    st.sampled_from(SPECIAL),
    st.text(_any_char, max_size=8),
)


@st.composite
def _long(draw: st.DrawFn) -> str:
    # Longer than any field allows, and sometimes than any column or index: repeated, so drawing it stays cheap.
    unit = draw(st.sampled_from(["a", "\u00e9", "\uff11", "\U0001f600", "\x00", "\u202e"]))
    return unit * draw(st.sampled_from([129, 2049, 70_000]))


# Built once: a strategy made afresh for every draw is validated afresh, which cost a body-fuzzing test 60 ms an
# example (most of its time) before a byte reached the code under test.
_HOSTILE_TEXT: st.SearchStrategy[str] = st.one_of(
    _plain,
    st.lists(_piece, min_size=1, max_size=4).map("".join),
    _long(),
)
_JSON_JUNK: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _HOSTILE_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_HOSTILE_TEXT, inner, max_size=3),
    max_leaves=8,
)


def hostile_text() -> st.SearchStrategy[str]:
    """Strings mixing plausible identifiers with the characters in ``SPECIAL`` and arbitrary code points."""
    return _HOSTILE_TEXT


def json_junk() -> st.SearchStrategy[Any]:
    """Any JSON value, with hostile text in its strings and keys."""
    return _JSON_JUNK


def _text(name: str, anchors: Mapping[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[str]:
    # Plausible two times in three (a value that passes the field's rules, or at least an identifier): a body gets
    # past its other fields' rules only when they are plausible, and so the hostile one reaches the store.
    plausible = anchors.get(name, _plain)
    return st.one_of(plausible, plausible, hostile_text())


def _typed(tp: Any, name: str, anchors: Mapping[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    if tp is str:
        return _text(name, anchors)
    if tp is Any or tp is object:
        return json_junk()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.one_of(st.integers(-(2**70), 2**70), st.integers(0, 10**6))
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if tp is type(None):
        return st.none()
    if tp is dt.datetime:
        return st.one_of(
            st.datetimes(timezones=st.just(dt.UTC)).map(lambda d: d.isoformat()),
            hostile_text(),
        )
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from([m.value for m in tp])
    if isinstance(tp, type) and attrs.has(tp):
        return json_bodies(tp, anchors)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[_typed(a, name, anchors) for a in args])
    if origin in (tuple, list, Sequence):
        return st.lists(_typed(args[0], name, anchors), max_size=3)
    if origin in (dict, Mapping):
        return st.dictionaries(_text("", anchors), _typed(args[1], name, anchors), max_size=3)
    return json_junk()


def json_bodies(
    cls: type, anchors: Mapping[str, st.SearchStrategy[Any]] | None = None, *, junk: bool = False
) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects shaped like the attrs class ``cls``: each optional field present or not, hostile text in every
    string and map key.

    Args:
        cls: An input class of the registry.
        anchors: For a field name, values that pass its rules (a tenant that exists), drawn often so that the other
            fields' text gets past them to the handler and the store.
        junk: Also put any JSON value in place of a field's, and add a field with a hostile name. Kept apart from the
            well-typed bodies (rather than mixed in now and then) because Hypothesis favours the edges of a choice:
            mixed in, junk would stop most bodies at the codec, and the text would rarely reach the store.
    """
    anchors = anchors or {}
    hints = typing.get_type_hints(cls)
    # Each field's strategy is made here, once, rather than in every draw (see _HOSTILE_TEXT).
    values: list[tuple[str, bool, st.SearchStrategy[Any]]] = []
    for field in attrs.fields(cls):
        typed = _typed(hints[field.name], field.name, anchors)
        values.append((field.name, field.default is attrs.NOTHING, typed | _JSON_JUNK if junk else typed))

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for name, required, strategy in values:
            if required or draw(st.booleans()):
                body[name] = draw(strategy)
        if junk and draw(st.booleans()):
            body[draw(_HOSTILE_TEXT)] = draw(_JSON_JUNK)
        return body

    return build()


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

    async def intercept(self, intercepted: Any, next: Any) -> Any:
        return await next(intercepted)


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
    "max_queued": st.one_of(st.none(), st.integers(0, 100_000)),
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
    "max_queued": st.one_of(
        st.integers(max_value=-1), st.integers(min_value=100_001), st.booleans(), st.text(), st.floats()
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


# --- Webhook destinations ----------------------------------------------------------------------------------------

# Unicode that passes for ASCII digits and dots in some parser or other: full-width, Arabic-Indic, Devanagari,
# mathematical digits; ideographic, full-width and halfwidth full stops.
UNICODE_DIGITS = {
    "fullwidth": 0xFF10,
    "arabic-indic": 0x0660,
    "devanagari": 0x0966,
    "mathematical bold": 0x1D7CE,
}
UNICODE_DOTS = ("\u3002", "\uff0e", "\uff61")
INVISIBLE_MARKS = ("\u200e", "\u200f", "\u202e", "\u2066", "\u200b", "\ufeff", "\x00", "\u00ad")


def internal_ipv4_addresses() -> st.SearchStrategy[ipaddress.IPv4Address]:
    """Any address of a range a webhook may never reach: loopback, private, link-local, CGNAT, multicast, reserved."""
    return st.sampled_from(
        [
            "127.0.0.0/8",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "169.254.0.0/16",
            "100.64.0.0/10",
            "0.0.0.0/8",
            "224.0.0.0/4",
            "240.0.0.0/4",
        ]
    ).flatmap(
        lambda net: st.integers(0, ipaddress.IPv4Network(net).num_addresses - 1).map(
            lambda n: ipaddress.IPv4Network(net)[n]
        )
    )


def hostish_text() -> st.SearchStrategy[str]:
    """Text that looks like a host to some parser: digits of any script, dots of any width, invisible marks."""
    return st.text(
        alphabet=st.one_of(
            st.sampled_from("0123456789abcdefx.:[]%-_"),
            st.sampled_from(
                [chr(zero + n) for zero in UNICODE_DIGITS.values() for n in range(10)]
                + [*UNICODE_DOTS, *INVISIBLE_MARKS]
            ),
            st.characters(codec="utf-8"),
        ),
        max_size=40,
    )


def json_values() -> st.SearchStrategy[Any]:
    """Any value ``json.dumps`` writes: null, booleans, numbers (NaN and infinities too), text, lists and objects."""
    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    )


# --- IAM grants --------------------------------------------------------------------------------------------------

_scopes = st.one_of(
    st.builds(lambda: ("root", None, None)),
    st.tuples(st.just("tenant"), st.sampled_from(["acme", "globex"])).map(lambda t: (t[0], t[1], t[1])),
    st.tuples(st.just("pool"), st.sampled_from(["pl_a", "pl_b"]), st.sampled_from(["acme", "globex", None])),
)
_patterns = st.tuples(
    st.sampled_from(["compute", "iam", "*"]),
    st.sampled_from(["pools", "credentials", "*"]),
    st.sampled_from(["*", "list"]),
).map(":".join)
_grants = st.lists(
    st.builds(
        lambda scope, p: Grant(patterns=tuple(p), scope_type=scope[0], scope_id=scope[1], scope_tenant=scope[2]),
        _scopes,
        st.lists(_patterns, min_size=1, max_size=3),
    ),
    max_size=4,
)


def grants() -> st.SearchStrategy[list[Grant]]:
    """Up to four IAM grants: root, tenant or pool scope (a pool's tenant known or not), one to three patterns."""
    return _grants


# --- Method inputs -----------------------------------------------------------------------------------------------


def _plausible(tp: Any, name: str, tenant: str) -> st.SearchStrategy[Any]:
    if name == "tenant" and tp in (str, str | None):
        return st.just(tenant)
    if name == "url" and tp is str:
        return st.just("https://hooks.example.com/in")
    if name == "scope" and tp is str:
        return st.sampled_from(["node:n1", "pool:p1", "site:s1"])
    if name == "sha256" and tp is str:
        return st.just("0" * 64)
    if tp is str:
        return st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(60, 10**6)
    if tp is float:
        return st.floats(0, 1e6)
    if tp is dt.datetime:
        return st.datetimes(timezones=st.just(dt.UTC))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(tp)
    if isinstance(tp, type) and attrs.has(tp):
        return valid_inputs(tp, tenant=tenant)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[_plausible(a, name, tenant) for a in args])
    if tp is type(None):
        return st.none()
    if origin in (tuple, list):
        items = st.lists(_plausible(args[0], name, tenant), max_size=2)
        return items.map(tuple) if origin is tuple else items
    if origin is dict:
        return st.dictionaries(_plausible(args[0], name, tenant), _plausible(args[1], name, tenant), max_size=2)
    return st.none()


def valid_inputs(cls: type, *, tenant: str) -> st.SearchStrategy[Any]:
    """Instances of the input class ``cls`` that its validators accept, ``tenant`` in every ``tenant`` field.

    Values are plausible by annotation (identifiers, https URLs, positive numbers); draws the validators refuse are
    thrown away.
    """
    hints = typing.get_type_hints(cls)

    def plausible(field: attrs.Attribute[Any]) -> st.SearchStrategy[Any]:
        # A number with a declared range is drawn in it (``days`` 1 to 31 is never among the usual 60 to 10**6).
        tp = hints[field.name]
        kinds = (tp, *typing.get_args(tp))
        none: st.SearchStrategy[Any] = st.none() if type(None) in kinds else st.nothing()
        for rule in rules_of(field):
            if isinstance(rule, Integer) and int in kinds:
                return none | st.integers(rule.minimum, rule.maximum)
            if isinstance(rule, Number) and float in kinds:
                return none | st.floats(rule.minimum, rule.maximum)
        return _plausible(tp, field.name, tenant)

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        kwargs = {f.name: draw(plausible(f)) for f in attrs.fields(cls)}
        try:
            return cls(**kwargs)
        except (ValueError, TypeError):
            assume(False)  # the validators refused this draw: try another

    return build()


def method_calls(
    methods: Sequence[MethodDef[Any, Any]], anchors: Mapping[str, st.SearchStrategy[Any]], *, junk: bool
) -> st.SearchStrategy[tuple[MethodDef[Any, Any], bytes]]:
    """One of ``methods`` with a request body for it: ``json_bodies`` of its input, and with ``junk`` anything else."""

    def body(method: MethodDef[Any, Any]) -> st.SearchStrategy[bytes]:
        bodies: st.SearchStrategy[Any] = json_bodies(method.input, anchors, junk=junk)
        if junk:
            bodies |= json_junk()
        # ensure_ascii writes an unpaired surrogate as its \u escape, which is how a JSON body carries one.
        encoded: st.SearchStrategy[bytes] = bodies.map(lambda value: json.dumps(value).encode())
        return encoded | st.binary(max_size=64) if junk else encoded

    return st.sampled_from(list(methods)).flatmap(lambda m: st.tuples(st.just(m), body(m)))


def text_rule_candidates(rule: Text) -> st.SearchStrategy[str]:
    """Text for a field rule to judge: short and long, what its pattern matches, that with one more character, and
    that stretched or cut to one short of, at and one past each length bound."""
    pieces = [st.text(max_size=12), st.text(max_size=600)]
    matching = st.from_regex(rule.pattern, fullmatch=True) if rule.pattern is not None else st.text(max_size=3)
    if rule.pattern is not None:
        pieces.append(matching)
        # A value the pattern matches, with one character more at either end: the anchors must hold in both readings.
        pieces.append(st.tuples(matching, st.sampled_from(["\n", " ", "a", "-"])).map(lambda p: p[0] + p[1]))
    bounds = {
        bound + step
        for bound in (rule.min_length, rule.max_length)
        if bound is not None
        for step in (-1, 0, 1)
        if bound + step >= 0
    }
    if bounds:
        # Random text of 64 code points almost never is 64 long; an off-by-one in a published bound hides there.
        pieces.append(
            st.builds(
                lambda seed, fill, size: (seed + (seed[-1:] or fill) * size)[:size],
                matching,
                st.sampled_from(["a", "0", "-", "\u00e9"]),
                st.sampled_from(sorted(bounds)),
            )
        )
    return st.one_of(pieces)


# --- Values of the wrong kind, and what the codec carries --------------------------------------------------------


def storable_text(max_size: int = 20) -> st.SearchStrategy[str]:
    """Every text the codec accepts: anything UTF-8 can encode except NUL."""
    return st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=max_size)


def wrong_types() -> st.SearchStrategy[Any]:
    """Small values of every JSON kind, for fields of another type (attrs does not check types, the dispatcher must)."""
    return st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2))
