"""Hypothesis strategies shared by the tests.

``hostile_text`` is the text an attacker sends: NUL, unpaired surrogates, full-width and other Unicode digits,
bidirectional and other format marks, very long runs, mixed into plausible identifiers so that some of it passes
the field rules and reaches the store. ``json_bodies(cls)`` builds request bodies for an input class from its
annotations, with such text in every string field and map key, and, now and then, junk in place of a value or a
field that does not exist.
"""

from __future__ import annotations

import datetime as dt
import enum
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = ["FUZZ", "hostile_text", "json_bodies", "json_junk"]

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


def hostile_text() -> st.SearchStrategy[str]:
    """Strings mixing plausible identifiers with the characters in ``SPECIAL`` and arbitrary code points."""
    return st.one_of(
        _plain,
        st.lists(_piece, min_size=1, max_size=4).map("".join),
        _long(),
    )


def json_junk() -> st.SearchStrategy[Any]:
    """Any JSON value, with hostile text in its strings and keys."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | hostile_text()
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text(), inner, max_size=3),
        max_leaves=8,
    )


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
    fields = attrs.fields(cls)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for field in fields:
            required = field.default is attrs.NOTHING
            if required or draw(st.booleans()):
                typed = _typed(hints[field.name], field.name, anchors)
                body[field.name] = draw(typed | json_junk() if junk else typed)
        if junk and draw(st.booleans()):
            body[draw(hostile_text())] = draw(json_junk())
        return body

    return build()
