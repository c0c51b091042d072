"""The JSON codec: strict decoding with field paths, UTC timestamps, and a lossless round trip."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, Literal

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bettercompute._codec import decode, encode, json_schema, supported_problems
from bettercompute.errors import InvalidInputError


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


_text = st.text(max_size=20)
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
