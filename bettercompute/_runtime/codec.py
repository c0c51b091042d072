"""The one JSON codec: attrs inputs and outputs to and from JSON values, and their JSON Schema.

Field names on the wire are the attribute names (snake_case). Timestamps are ISO 8601 in UTC with a ``Z``. Decoding
is strict: an unknown field, a missing required field or a value of the wrong type is ``InvalidInputError`` with the
field's path (``spec.devices[2].model``) in ``details["path"]``. Converters are built once per type and cached.

Text that PostgreSQL or UTF-8 cannot carry (a NUL character, an unpaired UTF-16 surrogate, which JSON's ``\\ud800``
escapes can spell) is refused at the codec, in values, field names and map keys alike, so it never reaches a store
or a response. Error messages escape whatever part of the input they quote (``quote``), and never quote text that
could not be encoded.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import math
import re
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import attrs

from bettercompute.errors import InvalidConfigError, InvalidInputError
from bettercompute.fields import rules_of

__all__ = ["decode", "encode", "json_schema", "quote", "storable", "supported_problems"]

T = TypeVar("T")
Path = tuple[str | int, ...]
_Decoder = Callable[[Any, Path], Any]
_Encoder = Callable[[Any], Any]


# NUL: PostgreSQL's text cannot hold it. U+D800-U+DFFF: only an unpaired surrogate lands there in a Python str, and
# UTF-8 (PostgreSQL's encoding, and the response's) cannot encode it.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_UNSTORABLE_REASON = "holds a NUL character or an unpaired UTF-16 surrogate, which cannot be stored"
_QUOTE_LIMIT = 64


def storable(text: str) -> bool:
    """Whether ``text`` can be stored in PostgreSQL and sent as UTF-8 (no NUL, no unpaired surrogate)."""
    return _UNSTORABLE.search(text) is None


def storable_json(value: object) -> bool:
    """Whether every string in a JSON value (object keys included) is ``storable``."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return all(storable(str(k)) and storable_json(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(storable_json(v) for v in value)
    return True


def quote(text: str, limit: int = _QUOTE_LIMIT) -> str:
    """``text`` made safe to put in an error message or a log line: every character that is not printable (controls,
    bidirectional and other format marks, surrogates, separators) becomes a ``\\x``/``\\u`` escape, and the result is
    cut at ``limit`` characters."""
    out: list[str] = []
    size = 0
    for char in text:
        piece = char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        if size + len(piece) > limit:
            out.append("…")
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


def _fmt(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # Map keys and unknown field names come from the caller: quoted like any other input.
            name = quote(part)
            out += f".{name}" if out else name
    return out


def _fail(path: Path, reason: str) -> InvalidInputError:
    where = _fmt(path)
    # A validator's reason may quote the value it refused: escaped and bounded like any other quoted input.
    reason = quote(reason, limit=400)
    message = f"{where}: {reason}" if where else reason
    return InvalidInputError(message, details={"path": where, "reason": reason})


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "an unsupported value"


# --- decoding ---------------------------------------------------------------------------------------------------


def decode(cls: type[T], data: Any) -> T:
    """Build ``cls`` from a parsed JSON value.

    Raises:
        InvalidInputError: the value does not fit ``cls``; ``details["path"]`` names the field.
    """
    try:
        result: T = _decoder(typing.cast(Any, cls))(data, ())
    except RecursionError:
        raise InvalidInputError("the input is nested too deeply", details={"path": ""}) from None
    return result


@functools.cache
def _decoder(tp: Any) -> _Decoder:
    if tp is Any or tp is object:
        return _decode_any
    if tp is str:
        return _decode_str
    if tp is bool:
        return _decode_bool
    if tp is int:
        return _decode_int
    if tp is float:
        return _decode_float
    if tp is type(None):
        return _decode_none
    if tp is dt.datetime:
        return _decode_datetime
    if tp is uuid.UUID:
        return _decode_uuid
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_decoder(tp)
    if isinstance(tp, type) and attrs.has(tp):
        return _attrs_decoder(tp)
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Literal:
        return _literal_decoder(args)
    if origin is Union or origin is types.UnionType:
        return _union_decoder(args)
    if origin in (list, tuple, Sequence) or origin is typing.Sequence:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise TypeError(f"only tuple[X, ...] is supported, not {tp!r}")
        return _sequence_decoder(_decoder(args[0]), as_tuple=origin is not list)
    if origin in (dict, Mapping) or origin is typing.Mapping:
        if args[0] is not str:
            raise TypeError(f"mapping keys must be str, not {args[0]!r}")
        return _mapping_decoder(_decoder(args[1]))
    raise TypeError(f"type {tp!r} is not supported by the codec")


def _decode_any(value: Any, path: Path) -> Any:
    # Passed through as it is, but what it holds may still end up stored: its text is checked like any other.
    if isinstance(value, str):
        return _decode_str(value, path)
    if isinstance(value, list):
        for i, item in enumerate(value):
            _decode_any(item, (*path, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            if not storable(key):
                raise _fail(path, f"a key {_UNSTORABLE_REASON}")
            _decode_any(item, (*path, key))
    return value


def _decode_str(value: Any, path: Path) -> str:
    if not isinstance(value, str):
        raise _fail(path, f"expected a string, got {_describe(value)}")
    if not storable(value):
        raise _fail(path, _UNSTORABLE_REASON)
    return value


def _decode_bool(value: Any, path: Path) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, f"expected a boolean, got {_describe(value)}")
    return value


def _decode_int(value: Any, path: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _fail(path, f"expected an integer, got {_describe(value)}")
    return value


def _decode_float(value: Any, path: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(path, f"expected a number, got {_describe(value)}")
    if not math.isfinite(value):
        raise _fail(path, "expected a finite number")
    return float(value)


def _decode_none(value: Any, path: Path) -> None:
    if value is not None:
        raise _fail(path, f"expected null, got {_describe(value)}")


def _decode_datetime(value: Any, path: Path) -> dt.datetime:
    if not isinstance(value, str):
        raise _fail(path, f"expected an ISO 8601 timestamp, got {_describe(value)}")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise _fail(path, "expected an ISO 8601 timestamp") from None
    if parsed.tzinfo is None:
        raise _fail(path, "the timestamp needs a time zone (use Z for UTC)")
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:  # 9999-12-31T23:00:00-10:00 is past the last representable instant
        raise _fail(path, "the timestamp is out of range") from None


def _decode_uuid(value: Any, path: Path) -> uuid.UUID:
    if not isinstance(value, str):
        raise _fail(path, f"expected a UUID string, got {_describe(value)}")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise _fail(path, "expected a UUID") from None


def _enum_decoder(tp: type[enum.Enum]) -> _Decoder:
    by_value = {member.value: member for member in tp}
    allowed = ", ".join(repr(v) for v in by_value)

    def decode_enum(value: Any, path: Path) -> Any:
        if isinstance(value, bool) or value not in by_value:
            raise _fail(path, f"expected one of {allowed}")
        return by_value[value]

    return decode_enum


def _literal_decoder(choices: tuple[Any, ...]) -> _Decoder:
    allowed = ", ".join(repr(v) for v in choices)

    def decode_literal(value: Any, path: Path) -> Any:
        for choice in choices:
            if value == choice and type(value) is type(choice):
                return value
        raise _fail(path, f"expected one of {allowed}")

    return decode_literal


def _union_decoder(members: tuple[Any, ...]) -> _Decoder:
    optional = type(None) in members
    rest = [m for m in members if m is not type(None)]
    if len(rest) != 1:
        raise TypeError("only X | None unions are supported")
    inner = _decoder(rest[0])

    def decode_optional(value: Any, path: Path) -> Any:
        if value is None and optional:
            return None
        return inner(value, path)

    return decode_optional


def _sequence_decoder(item: _Decoder, *, as_tuple: bool) -> _Decoder:
    def decode_sequence(value: Any, path: Path) -> Any:
        if not isinstance(value, list):
            raise _fail(path, f"expected an array, got {_describe(value)}")
        items = [item(v, (*path, i)) for i, v in enumerate(value)]
        return tuple(items) if as_tuple else items

    return decode_sequence


def _mapping_decoder(item: _Decoder) -> _Decoder:
    def decode_mapping(value: Any, path: Path) -> Any:
        if not isinstance(value, dict):
            raise _fail(path, f"expected an object, got {_describe(value)}")
        for key in value:
            if not storable(key):
                # The map's path, not the key's: the key itself cannot be quoted.
                raise _fail(path, f"a key {_UNSTORABLE_REASON}")
        return {k: item(v, (*path, k)) for k, v in value.items()}

    return decode_mapping


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _attrs_decoder(cls: type) -> _Decoder:
    hints = _field_types(cls)
    fields = [
        (f.name, f.alias or f.name, _decoder(hints[f.name]), f.default is attrs.NOTHING) for f in attrs.fields(cls)
    ]
    known = {name for name, _, _, _ in fields}

    def decode_attrs(value: Any, path: Path) -> Any:
        if not isinstance(value, dict):
            raise _fail(path, f"expected an object, got {_describe(value)}")
        for key in value:
            if key not in known:
                if not storable(key):
                    raise _fail(path, f"a field name {_UNSTORABLE_REASON}")
                raise _fail((*path, str(key)), "unknown field")
        kwargs: dict[str, Any] = {}
        for name, init_name, field_decoder, required in fields:
            if name in value:
                kwargs[init_name] = field_decoder(value[name], (*path, name))
            elif required:
                raise _fail((*path, name), "this field is required")
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as exc:
            # attrs validators say why a value is refused; their text is ours, never a caller's secret. attrs'
            # own validators (and ours, by the same convention) raise ``(message, attribute, ...)``: the
            # attribute names the field, so the path points at it.
            field = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], attrs.Attribute) else None
            if field is None:
                raise _fail(path, str(exc) or "invalid value") from None
            raise _fail((*path, field.name), str(exc.args[0])) from None

    return decode_attrs


# --- encoding ---------------------------------------------------------------------------------------------------


def encode(value: Any) -> Any:
    """Turn an attrs object (or any supported value) into a JSON value."""
    encoder: _Encoder = _encoder(typing.cast(Any, type(value)))
    return encoder(value)


@functools.cache
def _encoder(tp: type) -> _Encoder:
    if tp in (str, int, bool, type(None)):
        return _identity
    if tp is float:
        return _identity
    if tp is dt.datetime:
        return _encode_datetime
    if tp is uuid.UUID:
        return str
    if issubclass(tp, enum.Enum):
        return _encode_enum
    if attrs.has(tp):
        return _attrs_encoder(tp)
    if issubclass(tp, list | tuple):
        return _encode_sequence
    if issubclass(tp, Mapping):
        return _encode_mapping
    raise TypeError(f"cannot encode a {tp.__name__}")


def _identity(value: Any) -> Any:
    return value


def _encode_datetime(value: dt.datetime) -> str:
    if value.tzinfo is None:
        raise TypeError("refusing to encode a naive datetime")
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _encode_enum(value: enum.Enum) -> Any:
    return value.value


def _encode_sequence(value: Sequence[Any]) -> list[Any]:
    return [encode(v) for v in value]


def _encode_mapping(value: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): encode(v) for k, v in value.items()}


def _attrs_encoder(cls: type) -> _Encoder:
    names = [f.name for f in attrs.fields(cls)]

    def encode_attrs(value: Any) -> dict[str, Any]:
        return {name: encode(getattr(value, name)) for name in names}

    return encode_attrs


# --- schema -----------------------------------------------------------------------------------------------------


def json_schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema (2020-12, as OpenAPI 3.1 uses it) of ``tp``; attrs classes go into ``defs`` by name."""
    if tp is Any or tp is object:
        return {}
    if tp is str:
        # The codec refuses NUL in any string (see the module docstring); surrogates cannot be in a JSON document
        # that is valid UTF-8, so NUL is the one character to publish.
        return {"type": "string", "pattern": _NO_NUL}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is type(None):
        return {"type": "null"}
    if tp is dt.datetime:
        return {"type": "string", "format": "date-time"}
    if tp is uuid.UUID:
        return {"type": "string", "format": "uuid"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if isinstance(tp, type) and attrs.has(tp):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}  # reserve first: a class may refer to itself
            hints = _field_types(tp)
            props = {f.name: _constrained(json_schema(hints[f.name], defs), f) for f in attrs.fields(tp)}
            required = [f.name for f in attrs.fields(tp) if f.default is attrs.NOTHING]
            schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
            if required:
                schema["required"] = required
            if tp.__doc__:
                schema["description"] = tp.__doc__.strip().splitlines()[0]
            # A rule across fields (one field's allowed values depend on another's) has no place on one field:
            # the class publishes it, in JSON Schema, next to the validator that enforces it.
            schema.update(getattr(tp, "__json_schema__", {}))
            defs[name] = schema
        return {"$ref": f"#/components/schemas/{name}"}
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if origin is Union or origin is types.UnionType:
        return {"anyOf": [json_schema(a, defs) for a in args]}
    if origin in (list, tuple, Sequence) or origin is typing.Sequence:
        return {"type": "array", "items": json_schema(args[0], defs)}
    if origin in (dict, Mapping) or origin is typing.Mapping:
        return {
            "type": "object",
            "propertyNames": {"pattern": _NO_NUL},
            "additionalProperties": json_schema(args[1], defs),
        }
    raise TypeError(f"type {tp!r} is not supported by the codec")


_NO_NUL = "^[^\\u0000]*$"


def _constrained(schema: dict[str, Any], field: attrs.Attribute[Any]) -> dict[str, Any]:
    """``schema`` with the keywords of the field's declared rules (``bettercompute.fields``) merged in."""
    rules = rules_of(field)
    if not rules:
        return schema
    if "anyOf" in schema:
        # ``X | None``: the rules apply to the X branch; null stays null.
        branches = [b if b.get("type") == "null" else _constrained(b, field) for b in schema["anyOf"]]
        return {**schema, "anyOf": branches}
    out = dict(schema)
    for rule in rules:
        for key, value in rule.schema().items():
            if key in ("items", "additionalProperties", "propertyNames") and isinstance(out.get(key), dict):
                out[key] = {**out[key], **value}
            else:
                out[key] = value
    return out


def supported_problems(cls: type) -> list[str]:
    """Why ``cls`` cannot be an input or output (empty when it can): it must be an attrs class of supported types."""
    if not (isinstance(cls, type) and attrs.has(cls)):
        return [f"{getattr(cls, '__name__', cls)!r} is not an attrs class"]
    try:
        _decoder(typing.cast(Any, cls))
        json_schema(cls, {})
    except (TypeError, NameError) as exc:
        return [f"{cls.__name__}: {exc}"]
    return []


def check_supported(cls: type, what: str) -> None:
    """Raise ``InvalidConfigError`` when ``cls`` cannot be used as ``what``."""
    problems = supported_problems(cls)
    if problems:
        raise InvalidConfigError(f"{what} cannot be used: {problems[0]}", details={"problems": problems})
