"""A method's input as command-line options, and the options given as the request's body.

An option comes from each field of the input, as the catalog lists it (a method this command knows: ``_catalog``,
made from its attrs class) or from its JSON schema (a method of a server's own modules, from its OpenAPI document):
text, numbers, ``--flag/--no-flag`` for booleans, a choice for a fixed set of values, a repeatable option for a
list, ``key=value`` (repeatable) for a map, JSON for a nested object. Each field's kind says how its value goes back
into the body. ``--json '{...}'`` or ``--input file.json`` gives a whole input; options given next to it replace its
fields. An option left out is not sent, so the server's defaults and its checks apply.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import click

__all__ = ["Fields", "catalog_fields", "field_entries", "operation_fields", "request_body", "whole_input_options"]

Fields = Mapping[str, tuple[str, click.Option]]
"""An input's fields by name: each one's kind (``flag``, ``choice``, ``list``, ``map``, ``json``, ``scalar``) and
its option."""

_RESERVED = frozenset({"json", "input", "server", "token", "profile", "output"})
"""Options every method's command has: a served method's field of the same name gets no option of its own."""


# --- from an attrs input, through the catalog ----------------------------------------------------------------------


def field_entries(input_class: type[Any]) -> list[dict[str, Any]]:
    """Each field of a method's input class as the catalog keeps it (``_catalog``): its name, its kind, and for a
    scalar its type, for a choice its values."""
    hints = typing.get_type_hints(input_class)
    entries: list[dict[str, Any]] = []
    for field in attrs.fields(input_class):
        hint = hints[field.name]
        entry: dict[str, Any] = {"name": field.name, "kind": _kind(hint)}
        bare = _bare(hint)
        if entry["kind"] == "choice":
            entry["choices"] = [str(v) for v in typing.get_args(bare)]
        elif entry["kind"] == "scalar":
            entry["type"] = {int: "integer", float: "number"}.get(bare, "string")
        entries.append(entry)
    return entries


def _bare(hint: Any) -> Any:
    """``X`` for ``X | None``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _kind(hint: Any) -> str:
    hint = _bare(hint)
    origin = typing.get_origin(hint)
    if hint is bool:
        return "flag"
    if origin is typing.Literal:
        return "choice"
    if origin in (tuple, list, Sequence) or hint in (tuple, list):
        return "list"
    if origin in (dict, Mapping) or hint in (dict,):
        return "map"
    if hint in (int, float, str) or hint in (dt.datetime, dt.date):
        return "scalar"
    return "json"


def catalog_fields(entries: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, click.Option]]:
    """An option for each field the catalog lists for a method."""
    return {entry["name"]: (entry["kind"], _entry_option(entry)) for entry in entries}


def _entry_option(entry: Mapping[str, Any]) -> click.Option:
    name, kind = entry["name"], entry["kind"]
    flag = name.replace("_", "-")
    if kind == "flag":
        return click.Option([f"--{flag}/--no-{flag}", name], default=None, help=f"{name} (true/false)")
    if kind == "choice":
        return click.Option([f"--{flag}", name], type=click.Choice(list(entry["choices"])), default=None)
    if kind == "list":
        return click.Option([f"--{flag}", name], multiple=True, default=None, help="repeat for each item")
    if kind == "map":
        return click.Option([f"--{flag}", name], multiple=True, default=None, help="key=value, repeatable")
    if kind == "json":
        return click.Option([f"--{flag}", name], default=None, help="a JSON object")
    return click.Option([f"--{flag}", name], type=_SCALARS.get(entry.get("type", ""), click.STRING), default=None)


_SCALARS: dict[str, click.ParamType[Any]] = {"integer": click.INT, "number": click.FLOAT}


# --- from an OpenAPI operation ------------------------------------------------------------------------------------


def operation_fields(operation: Mapping[str, Any], document: Mapping[str, Any]) -> dict[str, tuple[str, click.Option]]:
    """An option for each property of an OpenAPI operation's JSON request body (a field whose name is no option's
    name, or that of one of the client's own options, has none)."""
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    schema = _resolved(body, document)
    found = schema.get("properties")
    properties: dict[str, Any] = found if isinstance(found, dict) else {}
    return {
        field: _schema_option(field, _resolved(sub, document))
        for field, sub in properties.items()
        if re.fullmatch(r"[a-z][a-z0-9_]{0,63}", field) and field.replace("_", "-") not in _RESERVED
    }


def _resolved(schema: Any, document: Mapping[str, Any]) -> dict[str, Any]:
    """A schema with a ``$ref`` (to ``#/components/schemas/...``) followed, and ``X | null`` as ``X``."""
    for _ in range(8):
        if not isinstance(schema, dict):
            return {}
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            schema = document.get("components", {}).get("schemas", {}).get(ref.rsplit("/", 1)[1], {})
            continue
        options = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(options, list):
            rest = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            if len(rest) == 1:
                schema = rest[0]
                continue
        return schema
    return {}


def _schema_option(field: str, schema: dict[str, Any]) -> tuple[str, click.Option]:
    flag, help = field.replace("_", "-"), str(schema.get("description") or "")[:200] or None
    kind = schema.get("type")
    if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
        return "choice", click.Option([f"--{flag}", field], type=click.Choice(schema["enum"]), default=None, help=help)
    if kind == "boolean":
        return "flag", click.Option([f"--{flag}/--no-{flag}", field], default=None, help=help)
    if kind == "array":
        return "list", click.Option([f"--{flag}", field], multiple=True, default=None, help="repeat for each item")
    values = schema.get("additionalProperties")
    if (
        kind == "object"
        and isinstance(values, dict)
        and values.get("type") == "string"
        and not schema.get("properties")
    ):
        return "map", click.Option([f"--{flag}", field], multiple=True, default=None, help="key=value, repeatable")
    if kind in ("string", "integer", "number"):
        scalar = _SCALARS.get(kind, click.STRING)
        return "scalar", click.Option([f"--{flag}", field], type=scalar, default=None, help=help)
    return "json", click.Option([f"--{flag}", field], default=None, help="a JSON value")


# --- and back: the options given as a body ------------------------------------------------------------------------


def whole_input_options() -> list[click.Option]:
    """``--json`` and ``--input``: a whole input, as text or as a file."""
    return [
        click.Option(["--json", "whole"], default=None, help="The whole input as JSON; options replace its fields."),
        click.Option(["--input", "input_file"], type=click.Path(dir_okay=False, path_type=Path), default=None),
    ]


def request_body(given: dict[str, Any], fields: Fields) -> dict[str, Any]:
    """The body of a call from a command's options: ``--input``'s, then ``--json``'s (both popped from ``given``),
    then each field's option that was given."""
    body: dict[str, Any] = {}
    input_file, whole = given.pop("input_file"), given.pop("whole")
    if input_file is not None:
        try:
            body.update(_load(input_file.read_text(encoding="utf-8"), "--input"))
        except (OSError, UnicodeDecodeError) as exc:
            raise click.UsageError(f"--input: cannot read {input_file} ({type(exc).__name__})") from None
    if whole is not None:
        body.update(_load(whole, "--json"))
    for field, (kind, _) in fields.items():
        raw = given.get(field)
        if raw is None or (kind in ("list", "map") and not raw):
            continue
        body[field] = _value(kind, raw, field)
    return body


def _value(kind: str, raw: Any, name: str) -> Any:
    if kind == "list":
        return list(raw)
    if kind == "map":
        pairs: dict[str, str] = {}
        for item in raw:
            key, sep, value = str(item).partition("=")
            if not sep or not key:
                raise click.UsageError(f"--{name.replace('_', '-')}: expected key=value, got {item!r}")
            pairs[key] = value
        return pairs
    if kind == "json":
        try:
            return json.loads(raw)
        except ValueError:
            raise click.UsageError(f"--{name.replace('_', '-')}: not JSON") from None
    return raw


def _load(text: str, source: str) -> dict[str, Any]:
    try:
        loaded = json.loads(text)
    except ValueError:
        raise click.UsageError(f"{source}: not JSON") from None
    if not isinstance(loaded, dict):
        raise click.UsageError(f"{source}: must be a JSON object")
    return loaded
