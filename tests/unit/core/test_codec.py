"""The JSON codec: strict decoding with field paths, UTC timestamps, and a lossless round trip."""

from __future__ import annotations

import datetime as dt
import enum
import json
from typing import Any, Literal

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bettercompute._runtime.codec import decode, encode, json_schema, quote, supported_problems
from bettercompute.errors import InvalidInputError
from tests.strategies import storable_text


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@attrs.frozen(kw_only=True)
class Device:
    model: str
    memory_gib: int
    healthy: bool = True


@attrs.frozen(kw_only=True)
class Spec:
    name: str
    devices: tuple[Device, ...] = ()
    labels: dict[str, str] = attrs.field(factory=dict)
    color: Color = Color.RED
    mode: Literal["fast", "safe"] = "safe"
    weight: float = 1.0
    starts_at: dt.datetime | None = None
    note: str | None = None


def _error(cls: type, data: Any) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as info:
        decode(cls, data)
    return info.value


def test_decodes_nested_values() -> None:
    spec = decode(
        Spec,
        {
            "name": "a",
            "devices": [{"model": "H100", "memory_gib": 80}],
            "labels": {"rack": "r1"},
            "color": "blue",
            "mode": "fast",
            "starts_at": "2026-12-02T10:00:00+01:00",
        },
    )
    assert spec.devices == (Device(model="H100", memory_gib=80),)
    assert spec.color is Color.BLUE
    assert spec.starts_at == dt.datetime(2026, 12, 2, 9, 0, tzinfo=dt.UTC)


def test_unknown_field_is_named_with_its_path() -> None:
    error = _error(Spec, {"name": "a", "devices": [{"model": "x", "memory_gib": 1, "vram": 2}]})
    assert error.code == "INVALID_INPUT"
    assert error.details["path"] == "devices[0].vram"
    assert error.details["reason"] == "unknown field"


def test_ill_typed_field_is_named_with_its_path() -> None:
    error = _error(Spec, {"name": "a", "devices": [{"model": "x", "memory_gib": "80"}]})
    assert error.details["path"] == "devices[0].memory_gib"
    assert "integer" in error.message


def test_missing_required_field() -> None:
    assert _error(Spec, {}).details["path"] == "name"


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"name": True}, "name"),
        ({"name": "a", "devices": [{"model": "x", "memory_gib": True}]}, "devices[0].memory_gib"),
        ({"name": "a", "color": "green"}, "color"),
        ({"name": "a", "mode": "turbo"}, "mode"),
        ({"name": "a", "labels": {"k": 1}}, "labels.k"),
        ({"name": "a", "devices": {}}, "devices"),
        ({"name": "a", "weight": "heavy"}, "weight"),
        ({"name": "a", "starts_at": "yesterday"}, "starts_at"),
        ([], ""),
    ],
)
def test_wrong_types_are_refused(data: Any, path: str) -> None:
    assert _error(Spec, data).details["path"] == path


def test_naive_timestamp_is_refused() -> None:
    error = _error(Spec, {"name": "a", "starts_at": "2026-12-02T10:00:00"})
    assert "time zone" in error.message


def test_timestamps_are_encoded_in_utc_with_z() -> None:
    when = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert encode(Spec(name="a", starts_at=when))["starts_at"] == "2026-12-02T08:00:00Z"


def test_validator_errors_become_invalid_input() -> None:
    @attrs.frozen(kw_only=True)
    class Positive:
        n: int = attrs.field(validator=attrs.validators.ge(1))

    error = _error(Positive, {"n": 0})
    assert error.code == "INVALID_INPUT"


def test_validator_errors_that_name_their_attribute_point_at_the_field() -> None:
    @attrs.frozen(kw_only=True)
    class Named:
        name: str = attrs.field(validator=attrs.validators.matches_re(r"[a-z]+"))

    error = _error(Named, {"name": "A"})
    # attrs' validators raise (message, attribute, ...): the path names the field, the reason is the message alone.
    assert error.details["path"] == "name"
    assert error.details["reason"].startswith("'name' must match regex")
    assert "Attribute(" not in error.message


def test_schema_describes_fields_and_requirements() -> None:
    defs: dict[str, Any] = {}
    assert json_schema(Spec, defs) == {"$ref": "#/components/schemas/Spec"}
    assert defs["Spec"]["required"] == ["name"]
    assert defs["Spec"]["additionalProperties"] is False
    assert defs["Device"]["properties"]["memory_gib"] == {"type": "integer"}
    assert defs["Spec"]["properties"]["starts_at"]["anyOf"][0] == {"type": "string", "format": "date-time"}


def test_unsupported_types_are_reported() -> None:
    @attrs.frozen
    class Bad:
        value: set[int]

    assert supported_problems(Bad)
    assert supported_problems(dict)
    assert supported_problems(Spec) == []


# Every text the codec accepts (NUL is refused below, with surrogates).
_text = storable_text()
_devices = st.builds(Device, model=_text, memory_gib=st.integers(-(2**40), 2**40), healthy=st.booleans())
_specs = st.builds(
    Spec,
    name=_text,
    devices=st.lists(_devices, max_size=3).map(tuple),
    labels=st.dictionaries(_text, _text, max_size=3),
    color=st.sampled_from(Color),
    mode=st.sampled_from(["fast", "safe"]),
    weight=st.floats(allow_nan=False, allow_infinity=False),
    starts_at=st.none() | st.datetimes(timezones=st.just(dt.UTC)),
    note=st.none() | _text,
)


@given(_specs)
def test_round_trip(spec: Spec) -> None:
    assert decode(Spec, encode(spec)) == spec


# Text PostgreSQL or UTF-8 cannot carry: NUL, and each kind of unpaired surrogate (high, low, reversed pair).
UNSTORABLE = ["a\x00b", "\x00", "x\ud800", "\udfff", "\udc00\ud800"]


def _sendable(error: InvalidInputError) -> None:
    """The error's envelope can be sent as UTF-8 JSON, as the HTTP transport sends it."""
    json.dumps(error.to_envelope(), ensure_ascii=False).encode()


@pytest.mark.parametrize("text", UNSTORABLE)
@pytest.mark.parametrize(
    ("build", "path"),
    [
        (lambda t: {"name": t}, "name"),
        (lambda t: {"name": "a", "note": t}, "note"),
        (
            lambda t: {"name": "a", "devices": [{"model": "x", "memory_gib": 1}, {"model": t, "memory_gib": 1}]},
            "devices[1].model",
        ),
        (lambda t: {"name": "a", "labels": {"zone": t}}, "labels.zone"),
    ],
)
def test_unstorable_text_in_a_value_is_refused_at_its_path(text: str, build: Any, path: str) -> None:
    error = _error(Spec, build(text))
    assert error.details["path"] == path
    assert "NUL" in error.details["reason"]
    assert text not in error.message
    _sendable(error)


@pytest.mark.parametrize("text", UNSTORABLE)
def test_an_unstorable_map_key_names_the_map_without_the_key(text: str) -> None:
    error = _error(Spec, {"name": "a", "labels": {"ok": "1", text: "2"}})
    assert error.details["path"] == "labels"
    assert "key" in error.details["reason"]
    _sendable(error)


@pytest.mark.parametrize("text", UNSTORABLE)
def test_an_unstorable_field_name_names_the_object_without_the_name(text: str) -> None:
    error = _error(Spec, {"name": "a", "devices": [{"model": "x", "memory_gib": 1, text: 1}]})
    assert error.details["path"] == "devices[0]"
    assert "field name" in error.details["reason"]
    _sendable(error)


def test_unstorable_text_inside_a_free_form_value_is_refused() -> None:
    @attrs.frozen(kw_only=True)
    class Free:
        data: Any

    assert _error(Free, {"data": {"a": [1, {"b": "\x00"}]}}).details["path"] == "data.a[1].b"
    assert _error(Free, {"data": {"a": {"\ud800": 1}}}).details["path"] == "data.a"
    assert decode(Free, {"data": {"a": ["ok", 1, None]}}) == Free(data={"a": ["ok", 1, None]})


def test_quoted_input_is_escaped_and_bounded() -> None:
    # An unknown field name is quoted in the path: a right-to-left override, a control character or a page of text
    # must reach the caller escaped and cut short, not as they are.
    error = _error(Spec, {"name": "a", "x\u202eevil\x07": 1})
    assert error.details["path"] == "x\\u202eevil\\x07"
    error = _error(Spec, {"name": "a", "y" * 10_000: 1})
    assert len(error.message) < 200
    wide = "\uff46\uff55\uff4c\uff4c \u0661\u0662\u0663"  # full-width letters, Arabic-Indic digits
    assert quote(wide) == wide  # printable text, however unusual, is kept as it is


def test_a_validator_message_that_quotes_the_value_is_escaped() -> None:
    @attrs.frozen(kw_only=True)
    class Echoing:
        name: str = attrs.field(validator=attrs.validators.in_(["a"]))

    error = _error(Echoing, {"name": "\u202e" + "z" * 5000})
    assert "\u202e" not in error.message
    assert len(error.message) < 600


def test_plain_text_still_decodes() -> None:
    odd = "\uff46\uff55\uff4c\uff4c\u0661\u0662\u0663\u200f\u202e " + "é" * 100_000 + "😀"
    assert decode(Spec, {"name": odd, "labels": {odd: odd}}) == Spec(name=odd, labels={odd: odd})
