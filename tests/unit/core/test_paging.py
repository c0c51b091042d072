"""The paging convention: what a cursor may hold, and the registry refusing a list that does not page."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
from typing import Any, TypeVar

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bettercompute import CallContext, GroupSpec, MethodDef, Options, better_compute
from bettercompute._runtime.codec import decode
from bettercompute.errors import InvalidConfigError, InvalidInputError
from bettercompute.paging import MAX_CURSOR, MAX_LIMIT, Keyset, PageInput
from tests.strategies import json_values

from ._echo import EchoModule, SayOutput
from .conftest import make_compute, make_iam

B = TypeVar("B")
SCOPE = "compute:things:list"


@attrs.frozen(kw_only=True)
class Thing:
    id: str
    created_at: dt.datetime


KEYSET: Keyset[Thing] = Keyset(dt.datetime, str, key=lambda t: (t.created_at, t.id))
AT = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)


def _raw(body: bytes) -> str:
    return base64.urlsafe_b64encode(body).rstrip(b"=").decode()


def test_a_cursor_gives_back_the_key_it_was_made_from() -> None:
    cursor = KEYSET.cursor(SCOPE, Thing(id="t_1", created_at=AT))
    assert KEYSET.after(SCOPE, cursor) == (AT, "t_1")
    assert KEYSET.after(SCOPE, None) is None


def test_a_page_has_a_cursor_only_when_a_row_is_left() -> None:
    rows = [Thing(id=f"t_{i}", created_at=AT) for i in range(3)]
    items, cursor = KEYSET.page(SCOPE, rows, 2)
    assert items == tuple(rows[:2]) and cursor is not None
    assert KEYSET.after(SCOPE, cursor) == (AT, "t_1")
    assert KEYSET.page(SCOPE, rows[:2], 2) == (tuple(rows[:2]), None)
    assert KEYSET.page(SCOPE, [], 2) == ((), None)


@pytest.mark.parametrize(
    "cursor",
    [
        _raw(b'{"m":"compute:other:list","k":["2026-01-02T03:04:05+00:00","t_1"]}'),  # another list's
        _raw(b'{"m":"compute:things:list","k":["2026-01-02T03:04:05","t_1"]}'),  # a datetime without its zone
        _raw(b'{"m":"compute:things:list","k":["2026-01-02T03:04:05+00:00"]}'),  # too short
        _raw(b'{"m":"compute:things:list","k":["2026-01-02T03:04:05+00:00","t_1",1]}'),  # too long
        _raw(b'{"m":"compute:things:list","k":["2026-01-02T03:04:05+00:00","t\\u0000"]}'),  # NUL
        _raw(b'{"m":"compute:things:list","k":["2026-01-02T03:04:05+00:00","\\udc80"]}'),  # lone surrogate
        _raw(b'{"m":"compute:things:list","k":["2026-01-02T03:04:05+00:00",7]}'),  # a number for a string
        _raw(b'{"m":"compute:things:list","k":["\xef\xbc\x92026-01-02T03:04:05+00:00","t"]}'),  # a full-width digit
        _raw(b'{"m":"compute:things:list","k":["2026-01-02T03:04:05+00:00","' + b"x" * 600 + b'"]}'),
        _raw(b'{"m":"compute:things:list","k":["x","t"],"z":1}'),
        _raw(b'["compute:things:list"]'),
        _raw(b"\xff\xfe not json"),
        _raw(b"[" * 5000),
        "not base64 at all!",
        "a",
    ],
)
def test_a_cursor_this_list_did_not_make_is_invalid_input(cursor: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        KEYSET.after(SCOPE, cursor)
    assert info.value.details == {"path": "cursor", "reason": "is not a cursor returned by this list"}


def test_an_int_key_is_bounded_to_a_bigint() -> None:
    ints: Keyset[int] = Keyset(int, key=lambda i: (i,))
    assert ints.after(SCOPE, ints.cursor(SCOPE, 2**63 - 1)) == (2**63 - 1,)
    for value in (2**63, True, 1.0):
        with pytest.raises(InvalidInputError):
            ints.after(SCOPE, _raw(json.dumps({"m": SCOPE, "k": [value]}).encode()))


@given(
    st.text(max_size=2000)
    | json_values().map(lambda k: _raw(json.dumps({"m": SCOPE, "k": k}).encode()))
    | st.lists(json_values(), min_size=2, max_size=2).map(lambda k: _raw(json.dumps({"m": SCOPE, "k": k}).encode()))
)
def test_no_cursor_makes_after_raise_anything_but_invalid_input(cursor: str) -> None:
    # Anything else (a TypeError, a KeyError, an OverflowError) would reach the caller as a 500.
    with contextlib.suppress(InvalidInputError):
        key = KEYSET.after(SCOPE, cursor)
        assert key is not None and isinstance(key[0], dt.datetime) and isinstance(key[1], str)


@attrs.frozen(kw_only=True)
class ListThingsInput(PageInput):
    tenant: str


def test_limit_and_cursor_are_checked_at_the_edge() -> None:
    assert decode(ListThingsInput, {"tenant": "t"}).limit == 100
    assert decode(ListThingsInput, {"tenant": "t", "limit": MAX_LIMIT}).limit == MAX_LIMIT
    cases: list[tuple[dict[str, Any], str]] = [
        ({"limit": 0}, "limit"),
        ({"limit": MAX_LIMIT + 1}, "limit"),
        ({"limit": True}, "limit"),
        ({"cursor": "has space"}, "cursor"),
        ({"cursor": "x" * (MAX_CURSOR + 1)}, "cursor"),
        ({"cursor": ""}, "cursor"),
    ]
    for body, path in cases:
        with pytest.raises(InvalidInputError) as info:
            decode(ListThingsInput, {"tenant": "t", **body})
        assert info.value.details["path"] == path


# --- the registry refuses a list that breaks the convention -----------------------------------------------------


@attrs.frozen(kw_only=True)
class ListOutput:
    things: tuple[SayOutput, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class UnpagedInput:
    tenant: str


@attrs.frozen(kw_only=True)
class TruncatedOutput:
    things: tuple[SayOutput, ...]
    truncated: bool


async def _handler(call: CallContext, input: Any) -> Any:
    raise AssertionError("never called")


def _refused(group: type[GroupSpec[Any]]) -> list[str]:
    module = EchoModule(name="things", groups=(group,), actions=tuple(m.action for m in group.methods.values()))
    with pytest.raises(InvalidConfigError) as info:
        better_compute(Options(store=make_compute().context.store, iam=make_iam(), modules=[module]))
    problems: list[str] = info.value.details["problems"]
    return problems


def test_a_list_without_paging_fields_is_refused() -> None:
    class Unpaged(GroupSpec[B]):
        name = "unpaged"
        list = MethodDef(input=UnpagedInput, output=TruncatedOutput, handler=_handler, mutates=False)

    problems = _refused(Unpaged)
    assert any("must subclass bettercompute.paging.PageInput" in p for p in problems)
    assert any("next_cursor" in p for p in problems)
    assert all(p.startswith("unpaged.list of 'things'") for p in problems)


def test_a_method_with_a_cursor_is_a_list_whatever_its_name() -> None:
    class Half(GroupSpec[B]):
        name = "half"
        history = MethodDef(input=ListThingsInput, output=TruncatedOutput, handler=_handler, mutates=False)

    assert _refused(Half) == [
        "half.history of 'things': a list's output must have 'next_cursor: str | None'",
        "half.history of 'things': a list's output must hold exactly one tuple of items and 'next_cursor'",
    ]


def test_a_paged_list_is_accepted() -> None:
    class Paged(GroupSpec[B]):
        name = "paged"
        list = MethodDef(input=ListThingsInput, output=ListOutput, handler=_handler, mutates=False)

    module = EchoModule(name="paged", groups=(Paged,), actions=("compute:paged:list",))
    compute = better_compute(Options(store=make_compute().context.store, iam=make_iam(), modules=[module]))
    assert compute.registry.method("paged", "list") is Paged.list
