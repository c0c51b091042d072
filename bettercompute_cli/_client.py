"""Client commands: ``better-compute <group> <method> [--field value ...]`` for every method of the built-in groups,
made from their declarations (the registry), so a method declared once is a command too.

A method's options come from its input's fields: text, numbers, ``--flag/--no-flag`` for booleans, a choice for a
fixed set of values, a repeatable option for a list, ``key=value`` (repeatable) for a map, JSON for a nested object.
``--json '{...}'`` or ``--input file.json`` gives a whole input; options given next to it replace its fields. An
option left out is not sent, so the server's defaults and its checks apply (a missing field is its ``INVALID_INPUT``).

The server and the credential come from ``--server`` and ``--token``, else ``BETTERCOMPUTE_URL`` and
``BETTERCOMPUTE_TOKEN`` (or ``TOKEN``, as ``better-compute dev`` prints it). The answer is a table (or ``key: value``
lines) by default, or the answer's ``data`` as JSON with ``--output json``. An error is one line on stderr,
``error: CODE: message``, and the exit status says which code (``EXIT_CODES``; 1 for any other, 2 for a usage error).
A call the server shed under load (503, ``Retry-After``) did not run: it is sent again after the server's delay, with
jitter, ``SHED_RETRIES`` times, as the typed client does, and then reported with how many times it was tried.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import os
import random
import re
import sys
import time
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import click
import httpx
from click import shell_completion
from rich.console import Console
from rich.table import Table

from bettercompute._runtime.registry import GroupSpec, MethodDef
from bettercompute._runtime.shedding import retry_delay
from bettercompute.modules.builtin import BuiltinGroups
from bettercompute.modules.reservations import ReservationsGroup
from bettercompute_iam import IamGroups
from bettercompute_metal import MetalGroups
from bettercompute_vps import VpsGroups

from ._main import COMPLETE_VAR
from ._profiles import (
    DEFAULT_PROFILE,
    DEFAULT_SERVER,
    PROFILE_ENV,
    TOKEN_ENVS,
    URL_ENV,
    Connection,
    ProfileError,
    Profiles,
    check_server,
    check_token,
    default_path,
    resolve,
)
from ._views import capacity_calendar, watch_nodes

__all__ = [
    "COMPLETE_VAR",
    "DEFAULT_SERVER",
    "EXIT_CODES",
    "SHED_RETRIES",
    "WAIT_ENDED",
    "WAIT_TIMEOUT",
    "client_groups",
    "client_root",
    "group_names",
    "run_client",
]

EXIT_CODES: Mapping[str, int] = {
    "INVALID_INPUT": 3,
    "UNAUTHENTICATED": 4,
    "ACCESS_DENIED": 5,
    "NOT_FOUND": 6,
    "CONFLICT": 7,
    "FAILED_PRECONDITION": 8,
    "NO_CAPACITY": 9,
    "QUOTA_EXCEEDED": 10,
    "UNAVAILABLE": 11,
}
"""The exit status of a command answered with an error of that code (any other code: 1)."""

WAIT_ENDED = 12
"""``reservations create --wait``: the reservation failed, was cancelled or ended before it was bound."""
WAIT_TIMEOUT = 13
"""``reservations create --wait``: it was not bound within ``--timeout`` (it stays as it is)."""

_ENDPOINT = "/api/compute"
_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
SHED_RETRIES = 2
"""How many times a call the server shed under load is sent again (after its ``Retry-After``)."""
_MAX_RETRY_AFTER = 30.0  # longer than this, a shed call is reported rather than waited for


def _specs() -> list[type[GroupSpec[Any]]]:
    """The built-in groups, the reservations group, IAM's, bare metal's and VPS's, each once, by name."""
    found: dict[str, type[GroupSpec[Any]]] = {}
    specs: list[type[GroupSpec[Any]]] = [
        *BuiltinGroups.group_specs().values(),
        ReservationsGroup,
        *IamGroups.group_specs().values(),
        *MetalGroups.group_specs().values(),
        *VpsGroups.group_specs().values(),
    ]
    for spec in specs:
        found.setdefault(spec.name, spec)
    return [found[name] for name in sorted(found)]


# --- options from an input's fields -------------------------------------------------------------------------------


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


def _option(field: attrs.Attribute[Any], hint: Any) -> click.Option:
    flag = field.name.replace("_", "-")
    kind = _kind(hint)
    bare = _bare(hint)
    if kind == "flag":
        return click.Option([f"--{flag}/--no-{flag}", field.name], default=None, help=f"{field.name} (true/false)")
    if kind == "choice":
        values = [str(v) for v in typing.get_args(bare)]
        return click.Option([f"--{flag}", field.name], type=click.Choice(values), default=None)
    if kind == "list":
        return click.Option([f"--{flag}", field.name], multiple=True, default=None, help="repeat for each item")
    if kind == "map":
        return click.Option([f"--{flag}", field.name], multiple=True, default=None, help="key=value, repeatable")
    if kind == "json":
        return click.Option([f"--{flag}", field.name], default=None, help="a JSON object")
    kinds: dict[Any, click.ParamType[Any]] = {int: click.INT, float: click.FLOAT}
    return click.Option([f"--{flag}", field.name], type=kinds.get(bare, click.STRING), default=None)


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


# --- calling and printing -----------------------------------------------------------------------------------------


class _Failed(click.ClickException):
    """An error answer or an unreachable server: one line on stderr, and its exit status."""

    def __init__(
        self, code: str, message: str, details: dict[str, Any] | None = None, *, status: int | None = None
    ) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.details = details or {}
        self.status = EXIT_CODES.get(code, 1) if status is None else status

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)
        for line in _explain(self.code, self.details):
            click.echo(f"  {line}", err=True)


def _explain(code: str, details: Mapping[str, Any]) -> list[str]:
    """The lines that say why a placement or a quota refused (the rest of an error is in its message)."""
    lines = []
    if code == "NO_CAPACITY":
        excluded = details.get("excluded")
        if isinstance(excluded, dict) and excluded:
            labels = {"free": "free but too few for the shape asked"}
            counts = ", ".join(f"{labels.get(r, r)} {n}" for r, n in sorted(excluded.items()))
            lines.append(f"atoms left out, by reason: {counts}")
        if "earliest_start" in details:
            earliest = details["earliest_start"]
            lines.append(f"earliest start that fits: {earliest}" if earliest else "nothing fits within 30 days")
    elif code == "QUOTA_EXCEEDED":
        lines += [f"{key}: {_cell(value)}" for key, value in details.items()]
    elif code == "UNAVAILABLE" and details.get("reason") == "overloaded":
        lines.append(f"the server is overloaded and did not run the call (tried {details.get('attempts', 1)} times)")
    return lines


def call_path(connection: Connection, path: str, body: dict[str, Any], key: str | None = None) -> Any:
    """``POST {server}/api/compute/{path}``: the answer's ``data``, or ``_Failed`` with the error's code."""
    headers = {"content-type": "application/json", "accept": "application/json"}
    if connection.token:
        headers["authorization"] = f"Bearer {connection.token}"
    if key:
        headers["idempotency-key"] = key
    server = connection.server
    url = f"{server.rstrip('/')}{_ENDPOINT}/{path}"
    for attempt in range(1, SHED_RETRIES + 2):
        try:
            response = httpx.post(url, json=body, headers=headers, timeout=_TIMEOUT)
        except httpx.HTTPError as exc:
            raise _Failed("UNAVAILABLE", f"cannot reach {server} ({type(exc).__name__})") from None
        try:
            payload = response.json()
        except ValueError:
            payload = None
        delay = retry_delay(response.status_code, response.headers, payload)
        if delay is None or delay > _MAX_RETRY_AFTER or attempt > SHED_RETRIES:
            break
        time.sleep(delay * (1 + random.random() / 2))  # noqa: S311 - jitter, not a secret
    if isinstance(payload, dict) and response.status_code == 200 and "data" in payload:
        return payload["data"]
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        error = payload["error"]
        details = error.get("details")
        details = dict(details) if isinstance(details, dict) else None
        if details is not None and details.get("reason") == "overloaded":
            details["attempts"] = attempt
        raise _Failed(str(error.get("code", "INTERNAL")), str(error.get("message", "")), details)
    raise _Failed("UNAVAILABLE", f"the server answered HTTP {response.status_code} without an error envelope")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str | int | float | bool):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _print(data: Any, output: str) -> None:
    # Piped, a table keeps its values whole (a terminal's width otherwise, folding what does not fit).
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 250)
    if output == "json":
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    rows = None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list) and all(isinstance(i, dict) for i in v)]
        if len(lists) == 1:
            rows = lists[0]
    if rows is not None:
        # The fields with plain values; nested ones are for --output json.
        columns = [
            k
            for k in dict.fromkeys(k for row in rows for k in row)
            if all(not isinstance(row.get(k), dict | list) for row in rows)
        ]
        table = Table()
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(_cell(row.get(c)) for c in columns))
        console.print(table)
        rest = {k: v for k, v in data.items() if not isinstance(v, list) and v is not None}
        for key, value in rest.items():
            click.echo(f"{key}: {_cell(value)}")
        return
    if isinstance(data, dict):
        for key, value in data.items():
            click.echo(f"{key}: {_cell(value)}")
        return
    click.echo(_cell(data))


# --- the commands -------------------------------------------------------------------------------------------------


def _command(method: MethodDef[Any, Any]) -> click.Command:
    hints = typing.get_type_hints(method.input)
    fields = {f.name: (_kind(hints[f.name]), _option(f, hints[f.name])) for f in attrs.fields(method.input)}
    return _made(method.group, method.name, method.summary, method.mutates, fields)


def _made(
    group: str, name: str, summary: str, mutates: bool, fields: Mapping[str, tuple[str, click.Option]]
) -> click.Command:
    """The command of one method: an option per input field (its kind says how its value is sent), and the client's
    own options."""
    params: list[click.Parameter] = [option for _, option in fields.values()]
    params += [
        click.Option(["--json", "whole"], default=None, help="The whole input as JSON; options replace its fields."),
        click.Option(["--input", "input_file"], type=click.Path(dir_okay=False, path_type=Path), default=None),
        *_connection_options(),
        click.Option(["--output"], type=click.Choice(["table", "json"]), default="table", show_default=True),
    ]
    extra = _EXTRAS.get((group, name))
    if extra is not None:
        params += extra.params
    if mutates and "idempotency_key" not in fields:  # where the input has the field, it is sent as such
        params.append(click.Option(["--idempotency-key"], default=None, help="Retries with it do it once."))
    clash = {"whole", "input_file", "server", "token", "profile", "output"} & set(fields)
    clash |= {p.name for p in (extra.params if extra else ())} & set(fields)
    if clash:  # a declaration error, found when the commands are made rather than when one is used
        raise TypeError(f"{group}.{name}: input fields {sorted(clash)} clash with the client's options")

    def run(**given: Any) -> None:
        connection = _connect(given)
        extras = {p.name: given.pop(p.name) for p in (extra.params if extra else ()) if p.name}
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
        if extra is not None and extra.prepare is not None:
            extra.prepare(body, extras)
        key = None if "idempotency_key" in fields else given.get("idempotency_key")
        data = call_path(connection, f"{group}/{name}", body, key)
        if extra is not None:
            extra.finish(connection, data, given["output"], extras)
        else:
            _print(data, given["output"])

    return click.Command(name, params=params, callback=run, help=summary, short_help=summary, no_args_is_help=False)


# --- groups the server serves and this command does not know: from its OpenAPI document -----------------------------


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
        types: dict[str, click.ParamType[Any]] = {"integer": click.INT, "number": click.FLOAT}
        return "scalar", click.Option([f"--{flag}", field], type=types.get(kind, click.STRING), default=None, help=help)
    return "json", click.Option([f"--{flag}", field], default=None, help="a JSON value")


def served_groups(document: Mapping[str, Any], endpoint: str = _ENDPOINT) -> list[click.Group]:
    """A click group per API group of a server's OpenAPI document, a command per operation (for groups this command
    does not know: a host application's own modules)."""
    groups: dict[str, click.Group] = {}
    descriptions = {t.get("name"): t.get("description") for t in document.get("tags", []) if isinstance(t, dict)}
    for path, item in (document.get("paths") or {}).items():
        operation = item.get("post") if isinstance(item, dict) else None
        if not isinstance(operation, dict) or not str(path).startswith(endpoint + "/"):
            continue
        group, _, name = str(path)[len(endpoint) + 1 :].partition("/")
        if not group or not name or "/" in name:
            continue
        body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        schema = _resolved(body, document)
        found = schema.get("properties")
        properties: dict[str, Any] = found if isinstance(found, dict) else {}
        reserved = {"json", "input", "server", "token", "profile", "output"}
        fields = {
            field: _schema_option(field, _resolved(sub, document))
            for field, sub in properties.items()
            if re.fullmatch(r"[a-z][a-z0-9_]{0,63}", field) and field.replace("_", "-") not in reserved
        }
        summary = str(operation.get("summary") or "")
        if group not in groups:
            description = str(descriptions.get(group) or "").strip().split("\n")[0]
            groups[group] = click.Group(group, help=description, no_args_is_help=True)
        groups[group].add_command(_made(group, name, summary, bool(operation.get("x-mutates")), fields))
    return [groups[name] for name in sorted(groups)]


def _argv_connection(args: Sequence[str]) -> Connection | None:
    """The connection a command line names (``--server``, ``--token``, ``--profile``, as ``--x v`` or ``--x=v``),
    with the environment and saved profiles; ``None`` when they do not make one."""
    given: dict[str, str | None] = {"server": None, "token": None, "profile": None}
    for index, arg in enumerate(args):
        for name in given:
            if arg == f"--{name}" and index + 1 < len(args):
                given[name] = args[index + 1]
            elif arg.startswith(f"--{name}="):
                given[name] = arg.split("=", 1)[1]
    try:
        return resolve(server=given["server"], token=given["token"], profile=given["profile"], env=os.environ)
    except ProfileError:
        return None


def served_group(name: str, args: Sequence[str]) -> click.Group | None:
    """The group ``name`` as the server the command line points at serves it (from its OpenAPI document), or
    ``None`` when that server cannot be asked or has no such group."""
    connection = _argv_connection(args)
    if connection is None:
        return None
    try:
        response = httpx.get(
            f"{connection.server.rstrip('/')}{_ENDPOINT}/openapi.json",
            headers={"accept": "application/json"},
            timeout=httpx.Timeout(10.0, connect=3.0),
        )
        document = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    try:
        groups = served_groups(document)
    except (TypeError, AttributeError, ValueError):  # a document of another shape: no commands from it
        return None
    return next((group for group in groups if group.name == name), None)


def _load(text: str, source: str) -> dict[str, Any]:
    try:
        loaded = json.loads(text)
    except ValueError:
        raise click.UsageError(f"{source}: not JSON") from None
    if not isinstance(loaded, dict):
        raise click.UsageError(f"{source}: must be a JSON object")
    return loaded


# --- where calls go ------------------------------------------------------------------------------------------------


def _connection_options() -> list[click.Option]:
    return [
        click.Option(["--server"], default=None, help=f"The control plane's URL [default: {DEFAULT_SERVER}]."),
        click.Option(["--token"], default=None, help="The credential."),
        click.Option(["--profile"], default=None, help="A profile saved by `better-compute login`."),
    ]


def _connect(given: dict[str, Any]) -> Connection:
    """The connection for a command's ``--server``/``--token``/``--profile`` (popped), the environment and the
    saved profiles."""
    server, token, profile = given.pop("server"), given.pop("token"), given.pop("profile")
    try:
        return resolve(server=server, token=token, profile=profile, env=os.environ)
    except ProfileError as exc:
        raise click.UsageError(str(exc)) from None


# --- commands that do more than one call ---------------------------------------------------------------------------


@attrs.frozen
class _Extra:
    """What a method's command adds: its own options, and what it does with the answer instead of printing it."""

    params: tuple[click.Option, ...]
    finish: typing.Callable[[Connection, Any, str, dict[str, Any]], None]
    prepare: typing.Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    """Changes the request body from the command's own options, before the call."""


def _printed(connection: Connection, data: Any, output: str, extras: dict[str, Any]) -> None:
    _print(data, output)


def _local_image(body: dict[str, Any], extras: dict[str, Any]) -> None:
    """``images register --file PATH``: the file's SHA-256 and size, computed here, and its ``file://`` URL."""
    path: Path | None = extras["file"]
    if path is None:
        return
    if "url" in body:
        raise click.UsageError("--file: give the image by --file or by --url, not both")
    absolute = path.expanduser().resolve()
    digest = hashlib.sha256()
    size = 0
    try:
        with absolute.open("rb") as source:
            while chunk := source.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise click.UsageError(f"--file: cannot read {path} ({type(exc).__name__})") from None
    for field, value in (("sha256", digest.hexdigest()), ("size", size)):
        if field in body and body[field] != value:
            raise click.UsageError(f"--file: its {field} is {value}, not the {body[field]} given")
        body[field] = value
    body["url"] = absolute.as_uri()


def _join_token_created(connection: Connection, data: Any, output: str, extras: dict[str, Any]) -> None:
    if extras["script"]:
        script = data.get("install_script") if isinstance(data, dict) else None
        if not script:
            raise _Failed(
                "FAILED_PRECONDITION",
                "the server gave no install script: its deployment has no node CA and join service "
                f"(the token {data.get('id') if isinstance(data, dict) else ''} was made all the same)",
            )
        click.echo(script, nl=not script.endswith("\n"))
        return
    if output == "json" or not isinstance(data, dict):
        _print(data, output)
        return
    uses = data.get("uses_left")
    click.echo(
        f"Join token {data.get('id')} for pool {data.get('pool_id')}: {uses} use{'s' if uses != 1 else ''}, "
        f"until {data.get('expires_at')}."
    )
    click.echo("It is shown once, and the commands below hold it: keep them as secret as the token.")
    click.echo("")
    command = data.get("short_join_command") or data.get("join_command")
    click.echo("On the machine, as root, with bcd installed:")
    click.echo("")
    click.echo(f"    {command}")
    click.echo("")
    if data.get("install_script"):
        click.echo("To install bcd and its service, join and start in one go, make a token with --script and run")
        click.echo("what it prints on the machine as root (for example: ... --script | ssh root@host sh).")


def _wait_for_binding(connection: Connection, data: Any, output: str, extras: dict[str, Any]) -> None:
    if not extras["wait"] or not isinstance(data, dict):
        _print(data, output)
        return
    reservation_id = str(data.get("id"))
    timeout = float(extras["timeout"])
    deadline = time.monotonic() + timeout
    shown = 0
    interval = 0.5
    while True:
        history = data.get("history") or []
        for step in history[shown:]:  # every transition, even one that came and went between two looks
            reason = f" ({step['reason']})" if step.get("reason") else ""
            click.echo(f"{step.get('at')}  {reservation_id}: {step.get('state')}{reason}", err=True)
        shown = max(shown, len(history))
        state = data.get("state")
        if state in ("bound", "active"):
            _print(data, output)
            return
        if state in ("failed", "cancelled", "ended"):
            _print(data, output)
            raise _Failed(
                "",
                f"{reservation_id} is {state} and was never bound"
                + (f": {data['reason']}" if data.get("reason") else ""),
                status=WAIT_ENDED,
            )
        if time.monotonic() >= deadline:
            _print(data, output)
            raise _Failed(
                "",
                f"{reservation_id} is still {state} after {timeout:g} s (it stays; see: better-compute reservations "
                f"get --id {reservation_id})",
                status=WAIT_TIMEOUT,
            )
        time.sleep(min(interval, max(deadline - time.monotonic(), 0.0)))
        interval = min(interval * 1.5, 3.0)
        data = call_path(connection, "reservations/get", {"id": reservation_id})


_EXTRAS: dict[tuple[str, str], _Extra] = {
    ("images", "register"): _Extra(
        params=(
            click.Option(
                ["--file"],
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                default=None,
                help="A local image file: its SHA-256 and size are computed here and it is registered as a file:// "
                "URL (the daemon that boots it reads it at that path, from a directory it serves images from).",
            ),
        ),
        finish=_printed,
        prepare=_local_image,
    ),
    ("join-tokens", "create"): _Extra(
        params=(
            click.Option(
                ["--script"],
                is_flag=True,
                default=False,
                help="Print only the install script (run it on the machine as root: it installs bcd, joins, starts).",
            ),
        ),
        finish=_join_token_created,
    ),
    ("reservations", "create"): _Extra(
        params=(
            click.Option(
                ["--wait"],
                is_flag=True,
                default=False,
                help=f"Show its progress until it is bound (exit {WAIT_ENDED} if it fails or ends first, "
                f"{WAIT_TIMEOUT} after --timeout).",
            ),
            click.Option(
                ["--timeout"],
                type=click.FloatRange(min=0.0, max=86400.0),
                default=600.0,
                show_default=True,
                help="Seconds --wait waits.",
            ),
        ),
        finish=_wait_for_binding,
    ),
}


def _all_pages(connection: Connection, path: str, body: dict[str, Any], key: str, *, pages: int = 50) -> list[Any]:
    """Every item of a paged list (at most ``pages`` pages)."""
    items: list[Any] = []
    cursor = None
    for _ in range(pages):
        page = call_path(connection, path, {**body, **({"cursor": cursor} if cursor else {})})
        items += page.get(key, [])
        cursor = page.get("next_cursor")
        if not cursor:
            break
    return items


def _watch_command() -> click.Command:
    def watch(tenant: str, pool_id: str | None, interval: float, count: int, output: str, **given: Any) -> None:
        connection = _connect(given)
        body = {"tenant": tenant, **({"pool_id": pool_id} if pool_id else {})}

        def fetch() -> list[dict[str, Any]] | None:
            try:
                return _all_pages(connection, "nodes/list", body, "nodes")
            except _Failed as exc:
                if exc.code == "UNAVAILABLE":  # a live view outlasts a restart of the server
                    return None
                raise

        watch_nodes(fetch, interval=interval, count=count, output=output)

    return click.Command(
        "watch",
        params=[
            click.Option(["--tenant"], required=True, help="The tenant whose nodes to show."),
            click.Option(["--pool-id", "pool_id"], default=None, help="Only this pool's nodes."),
            click.Option(["--interval"], type=click.FloatRange(min=0.2), default=2.0, show_default=True),
            click.Option(
                ["--count"], type=click.IntRange(min=0), default=0, help="Stop after this many looks (0: never)."
            ),
            *_connection_options(),
            click.Option(["--output"], type=click.Choice(["table", "json"]), default="table", show_default=True),
        ],
        callback=watch,
        help="A live table of nodes: their state, session, last contact and desired-state generations. Piped (or "
        "with --output json), one line per node each time it changes.",
        short_help="A live table of nodes.",
    )


def _calendar_command() -> click.Command:
    def show(pool_id: str, days: int, start: str | None, output: str, **given: Any) -> None:
        connection = _connect(given)
        data = call_path(
            connection, "capacity/get", {"pool_id": pool_id, "days": days, **({"start": start} if start else {})}
        )
        if output == "json":
            _print(data, output)
            return
        Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120).print(capacity_calendar(data))

    return click.Command(
        "show",
        params=[
            click.Option(["--pool-id", "pool_id"], required=True),
            click.Option(["--days"], type=click.IntRange(min=1, max=31), default=7, show_default=True),
            click.Option(["--start"], default=None, help="The first day (ISO 8601; default now)."),
            *_connection_options(),
            click.Option(["--output"], type=click.Choice(["table", "json"]), default="table", show_default=True),
        ],
        callback=show,
        help="A pool's calendar: its GPUs now, and per day how much of them is booked.",
        short_help="A pool's calendar.",
    )


_OWN: dict[str, typing.Callable[[], click.Command]] = {"nodes": _watch_command, "capacity": _calendar_command}
"""Commands of a group that are not one method's: ``nodes watch``, ``capacity show``."""


def _tunnel_command() -> click.Command:
    def tunnel(resource_id: str, port: int, local: int, gateway: str | None, **given: Any) -> None:
        from ._tunnel import TunnelError, serve_tunnel, tunnel_call

        connection = _connect(given)
        try:
            path, body = tunnel_call(resource_id, port)
        except TunnelError as exc:
            raise click.UsageError(str(exc)) from None

        async def ask() -> Mapping[str, Any]:
            answer = await asyncio.to_thread(call_path, connection, path, body)
            if not isinstance(answer, dict):
                raise _Failed("INTERNAL", "the server answered something that is not a tunnel")
            return answer

        def ready(bound: int) -> None:
            click.echo(f"127.0.0.1:{bound} -> {resource_id}:{port} (Ctrl-C to stop)", err=True)

        def report(line: str) -> None:
            click.echo(line, err=True)

        try:
            asyncio.run(serve_tunnel(ask, local_port=local, gateway=gateway, ready=ready, report=report))
        except KeyboardInterrupt:
            click.echo("stopped", err=True)
        except OSError as exc:
            raise _Failed("", f"cannot listen on 127.0.0.1:{local}: {exc.strerror or exc}", status=1) from None

    return click.Command(
        "tunnel",
        params=[
            click.Argument(["resource_id"]),
            click.Option(["--port"], type=click.IntRange(1, 65535), required=True, help="The port to reach there."),
            click.Option(
                ["--local"], type=click.IntRange(0, 65535), required=True, help="The port to listen on, on 127.0.0.1."
            ),
            click.Option(
                ["--gateway"],
                default=None,
                help="Dial this host:port instead of the gateway the server names (its certificate is still checked).",
            ),
            *_connection_options(),
        ],
        callback=tunnel,
        help="Reach a port of a node (node_...) through the gateway from a port on 127.0.0.1: each local connection "
        "gets a tunnel of its own (nodes.tunnel; the node allows the port with bcd node --tunnel-local-port).",
        short_help="Reach a port of a node through the gateway.",
    )


# --- login, logout, completion -------------------------------------------------------------------------------------


def _login_command() -> click.Command:
    def login(server: str | None, token: str | None, profile: str | None) -> None:
        env = os.environ
        name = profile or env.get(PROFILE_ENV) or DEFAULT_PROFILE
        server = server or env.get(URL_ENV) or DEFAULT_SERVER
        if token == "-":  # noqa: S105 - "read it from stdin", not a credential
            token = sys.stdin.readline().strip()
        elif token is None:
            token = next((env[k] for k in TOKEN_ENVS if env.get(k)), None)
        if token is None:
            if not sys.stdin.isatty():
                raise click.UsageError("give the credential with --token (or --token - to read it from stdin)")
            token = str(click.prompt("Credential", hide_input=True)).strip()
        path = default_path(env)
        try:
            profiles = Profiles.load(path)
            connection = Connection(check_server(server), check_token(token))
        except ProfileError as exc:
            raise click.UsageError(str(exc)) from None
        who = call_path(connection, "system/whoami", {})  # an error here saves nothing
        try:
            profiles.put(name, connection.server, token)
        except ProfileError as exc:
            raise click.UsageError(str(exc)) from None
        except OSError as exc:
            raise click.ClickException(f"cannot write {path} ({type(exc).__name__})") from None
        click.echo(
            f"Logged in to {connection.server} as {who.get('principal_name')} ({who.get('principal_id')}, "
            f"tenant {who.get('tenant_id')})."
        )
        click.echo(f"Saved as profile {name!r} in {path} (only you can read it).")
        if name != DEFAULT_PROFILE:
            click.echo(f"Use it with --profile {name} or BETTERCOMPUTE_PROFILE={name}.")

    return click.Command(
        "login",
        params=[
            click.Option(["--server"], default=None, help=f"The control plane's URL [default: {DEFAULT_SERVER}]."),
            click.Option(
                ["--token"],
                default=None,
                help="The credential (- reads it from stdin; without it: BETTERCOMPUTE_TOKEN or TOKEN, else a prompt).",
            ),
            click.Option(["--profile"], default=None, help=f"The profile's name [default: {DEFAULT_PROFILE}]."),
        ],
        callback=login,
        help="Check a credential against a server and save both as a profile that every command then uses.",
        short_help="Save a server and credential.",
    )


def _logout_command() -> click.Command:
    def logout(profile: str | None) -> None:
        name = profile or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
        path = default_path(os.environ)
        try:
            removed = Profiles.load(path).remove(name)
        except ProfileError as exc:
            raise click.UsageError(str(exc)) from None
        if not removed:
            click.echo(f"No profile {name!r} in {path}; nothing to remove.")
            return
        click.echo(f"Removed profile {name!r} from {path}.")
        click.echo("The credential itself still works until it is revoked (better-compute credentials revoke).")

    return click.Command(
        "logout",
        params=[click.Option(["--profile"], default=None, help=f"The profile [default: {DEFAULT_PROFILE}].")],
        callback=logout,
        help="Forget a saved profile (the credential stays valid on the server).",
        short_help="Forget a saved profile.",
    )


def _completion_command(root: typing.Callable[[], click.Group]) -> click.Command:
    def completion(shell: str) -> None:
        kind = shell_completion.get_completion_class(shell)
        assert kind is not None  # the choice allows only those click knows
        click.echo(kind(root(), {}, "better-compute", COMPLETE_VAR).source())

    return click.Command(
        "completion",
        params=[click.Argument(["shell"], type=click.Choice(["bash", "zsh", "fish"]))],
        callback=completion,
        help='Print the shell\'s completion script; for bash: eval "$(better-compute completion bash)" in ~/.bashrc.',
        short_help="Print a shell completion script.",
    )


def client_root(own: Mapping[str, str]) -> click.Group:
    """Every client command under one ``better-compute`` group (``own``: the server commands' names and help, there
    for completion: they run elsewhere)."""
    root = click.Group("better-compute", help="Better Compute: a control plane for GPU fleets.")
    for group in client_groups(set(own)):
        root.add_command(group)
    for command in (_login_command(), _logout_command(), _tunnel_command(), _completion_command(lambda: root)):
        root.add_command(command)
    for name, summary in own.items():
        root.add_command(
            click.Command(
                name,
                help=summary,
                params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
                context_settings={"ignore_unknown_options": True},
            )
        )
    return root


def client_groups(taken: set[str]) -> list[click.Group]:
    """A click group per API group (its name not in ``taken``), a command per method."""
    groups = []
    for spec in _specs():
        if spec.name in taken:
            continue
        group = click.Group(spec.name, help=(spec.__doc__ or "").strip().split("\n")[0], no_args_is_help=True)
        for method in spec.methods.values():
            group.add_command(_command(method))
        if spec.name in _OWN:
            group.add_command(_OWN[spec.name]())
        groups.append(group)
    return groups


def group_names() -> list[str]:
    """The API groups that have client commands."""
    return [spec.name for spec in _specs()]


def run_client(command: click.Command, args: Sequence[str]) -> int:
    """Run one client command; its exit status (``EXIT_CODES`` for an error answer, 2 for a usage error)."""
    try:
        command.main(args=list(args), prog_name=f"better-compute {command.name}", standalone_mode=False)
    except _Failed as exc:
        exc.show()
        return exc.status
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        return 1
    return 0
