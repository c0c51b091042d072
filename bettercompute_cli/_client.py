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
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import click
import httpx
from rich.console import Console
from rich.table import Table

from bettercompute._runtime.registry import GroupSpec, MethodDef
from bettercompute.modules.builtin import BuiltinGroups
from bettercompute.modules.capacity import ReservationsGroup
from bettercompute_iam import IamGroups

__all__ = ["EXIT_CODES", "client_groups", "group_names", "run_client"]

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

DEFAULT_SERVER = "http://127.0.0.1:3000"
_ENDPOINT = "/api/compute"
_TIMEOUT = httpx.Timeout(60.0, connect=5.0)


def _specs() -> list[type[GroupSpec[Any]]]:
    """The built-in groups, the reservations group and IAM's, each once, by name."""
    found: dict[str, type[GroupSpec[Any]]] = {}
    specs: list[type[GroupSpec[Any]]] = [
        *BuiltinGroups.group_specs().values(),
        ReservationsGroup,
        *IamGroups.group_specs().values(),
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

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = EXIT_CODES.get(code, 1)

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


def _call(server: str, token: str | None, method: MethodDef[Any, Any], body: dict[str, Any], key: str | None) -> Any:
    headers = {"content-type": "application/json", "accept": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    if key:
        headers["idempotency-key"] = key
    url = f"{server.rstrip('/')}{_ENDPOINT}/{method.group}/{method.name}"
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=_TIMEOUT)
    except httpx.HTTPError as exc:
        raise _Failed("UNAVAILABLE", f"cannot reach {server} ({type(exc).__name__})") from None
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict) and response.status_code == 200 and "data" in payload:
        return payload["data"]
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        error = payload["error"]
        raise _Failed(str(error.get("code", "INTERNAL")), str(error.get("message", "")))
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
    fields = {f.name: (f, _kind(hints[f.name])) for f in attrs.fields(method.input)}
    params: list[click.Parameter] = [_option(f, hints[f.name]) for f, _ in fields.values()]
    params += [
        click.Option(["--json", "whole"], default=None, help="The whole input as JSON; options replace its fields."),
        click.Option(["--input", "input_file"], type=click.Path(dir_okay=False, path_type=Path), default=None),
        click.Option(["--server"], envvar="BETTERCOMPUTE_URL", default=DEFAULT_SERVER, show_default=True),
        click.Option(["--token"], envvar=["BETTERCOMPUTE_TOKEN", "TOKEN"], default=None, help="The credential."),
        click.Option(["--output"], type=click.Choice(["table", "json"]), default="table", show_default=True),
    ]
    if method.mutates and "idempotency_key" not in fields:  # where the input has the field, it is sent as such
        params.append(click.Option(["--idempotency-key"], default=None, help="Retries with it do it once."))
    clash = {"whole", "input_file", "server", "token", "output"} & set(fields)
    if clash:  # a declaration error, found when the commands are made rather than when one is used
        raise TypeError(f"{method.group}.{method.name}: input fields {sorted(clash)} clash with the client's options")

    def run(**given: Any) -> None:
        body: dict[str, Any] = {}
        input_file, whole = given.pop("input_file"), given.pop("whole")
        if input_file is not None:
            try:
                body.update(_load(input_file.read_text(encoding="utf-8"), "--input"))
            except (OSError, UnicodeDecodeError) as exc:
                raise click.UsageError(f"--input: cannot read {input_file} ({type(exc).__name__})") from None
        if whole is not None:
            body.update(_load(whole, "--json"))
        for name, (_, kind) in fields.items():
            raw = given.get(name)
            if raw is None or (kind in ("list", "map") and not raw):
                continue
            body[name] = _value(kind, raw, name)
        key = None if "idempotency_key" in fields else given.get("idempotency_key")
        data = _call(given["server"], given["token"], method, body, key)
        _print(data, given["output"])

    return click.Command(
        method.name, params=params, callback=run, help=method.summary, short_help=method.summary, no_args_is_help=False
    )


def _load(text: str, source: str) -> dict[str, Any]:
    try:
        loaded = json.loads(text)
    except ValueError:
        raise click.UsageError(f"{source}: not JSON") from None
    if not isinstance(loaded, dict):
        raise click.UsageError(f"{source}: must be a JSON object")
    return loaded


def client_groups(taken: set[str]) -> list[click.Group]:
    """A click group per API group (its name not in ``taken``), a command per method."""
    groups = []
    for spec in _specs():
        if spec.name in taken:
            continue
        group = click.Group(spec.name, help=(spec.__doc__ or "").strip().split("\n")[0], no_args_is_help=True)
        for method in spec.methods.values():
            group.add_command(_command(method))
        groups.append(group)
    return groups


def group_names() -> list[str]:
    """The API groups that have client commands."""
    return [spec.name for spec in _specs()]


def run_client(group: click.Group, args: Sequence[str]) -> int:
    """Run one client command; its exit status (``EXIT_CODES`` for an error answer, 2 for a usage error)."""
    try:
        group.main(args=list(args), prog_name=f"better-compute {group.name}", standalone_mode=False)
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
