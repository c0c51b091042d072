"""Client commands: ``better-compute <group> <method> [--field value ...]`` for every method of the built-in groups,
made from the catalog generated from their declarations (``_catalog``), so a method declared once is a command too;
and for the groups a server serves that this command does not know, from that server's OpenAPI document.

A method's options come from its input's fields (``_argv``). The server and the credential come from ``--server``
and ``--token``, else ``BETTERCOMPUTE_URL`` and ``BETTERCOMPUTE_TOKEN`` (or ``TOKEN``, as ``better-compute dev``
prints it), else a profile saved by ``login`` (``_call``). The answer is a table (or ``key: value`` lines) by default,
or the answer's ``data`` as JSON with ``--output json`` (``_output``). An error is one line on stderr,
``error: CODE: message``, and the exit status says which code (``EXIT_CODES``; 1 for any other, 2 for a usage error).
Some methods' commands do more than one call (``_extras``); some commands are no method's (``_commands``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click
import httpx

from ._argv import Fields, catalog_fields, operation_fields, request_body, whole_input_options
from ._call import Failed, argv_connection, call_path, connect, connection_options
from ._catalog import load
from ._commands import IN_GROUPS, top_commands
from ._constants import ENDPOINT
from ._extras import EXTRAS
from ._output import print_answer

__all__ = ["client_groups", "client_root", "run_client", "served_group", "served_groups"]

_OWN_OPTIONS = frozenset({"whole", "input_file", "server", "token", "profile", "output"})


def _made(group: str, name: str, summary: str, mutates: bool, fields: Fields) -> click.Command:
    """The command of one method: an option per input field (its kind says how its value is sent), and the client's
    own options."""
    extra = EXTRAS.get((group, name))
    extra_params = extra.params if extra is not None else ()
    params: list[click.Parameter] = [option for _, option in fields.values()]
    params += [
        *whole_input_options(),
        *connection_options(),
        click.Option(["--output"], type=click.Choice(["table", "json"]), default="table", show_default=True),
        *extra_params,
    ]
    if mutates and "idempotency_key" not in fields:  # where the input has the field, it is sent as such
        params.append(click.Option(["--idempotency-key"], default=None, help="Retries with it do it once."))
    clash = (_OWN_OPTIONS | {p.name for p in extra_params}) & set(fields)
    if clash:  # a declaration error, found when the commands are made rather than when one is used
        raise TypeError(f"{group}.{name}: input fields {sorted(clash)} clash with the client's options")

    def run(**given: Any) -> None:
        connection = connect(given)
        extras = {p.name: given.pop(p.name) for p in extra_params if p.name}
        body = request_body(given, fields)
        if extra is not None and extra.prepare is not None:
            extra.prepare(body, extras)
        key = None if "idempotency_key" in fields else given.get("idempotency_key")
        data = call_path(connection, f"{group}/{name}", body, key)
        if extra is not None:
            extra.finish(connection, data, given["output"], extras)
        else:
            print_answer(data, given["output"])

    return click.Command(name, params=params, callback=run, help=summary, short_help=summary, no_args_is_help=False)


def client_groups(taken: set[str]) -> list[click.Group]:
    """A click group per API group of the catalog (its name not in ``taken``), a command per method."""
    groups = []
    for entry in load()["groups"]:
        name = entry["name"]
        if name in taken:
            continue
        group = click.Group(name, help=entry["help"], no_args_is_help=True)
        for method in entry["methods"]:
            fields = catalog_fields(method["fields"])
            group.add_command(_made(name, method["name"], method["summary"], method["mutates"], fields))
        if name in IN_GROUPS:
            group.add_command(IN_GROUPS[name]())
        groups.append(group)
    return groups


def client_root(own: Mapping[str, str]) -> click.Group:
    """Every client command under one ``better-compute`` group (``own``: the server commands' names and help, there
    for completion: they run elsewhere)."""
    root = click.Group("better-compute", help="Better Compute: a control plane for GPU fleets.")
    for group in client_groups(set(own)):
        root.add_command(group)
    for command in top_commands(lambda: root):
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


# --- groups the server serves and this command does not know: from its OpenAPI document -----------------------------


def served_groups(document: Mapping[str, Any], endpoint: str = ENDPOINT) -> list[click.Group]:
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
        fields = operation_fields(operation, document)
        summary = str(operation.get("summary") or "")
        if group not in groups:
            description = str(descriptions.get(group) or "").strip().split("\n")[0]
            groups[group] = click.Group(group, help=description, no_args_is_help=True)
        groups[group].add_command(_made(group, name, summary, bool(operation.get("x-mutates")), fields))
    return [groups[name] for name in sorted(groups)]


def served_group(name: str, args: Sequence[str]) -> click.Group | None:
    """The group ``name`` as the server the command line points at serves it (from its OpenAPI document), or
    ``None`` when that server cannot be asked or has no such group."""
    connection = argv_connection(args)
    if connection is None:
        return None
    try:
        response = httpx.get(
            f"{connection.server.rstrip('/')}{ENDPOINT}/openapi.json",
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


def run_client(command: click.Command, args: Sequence[str]) -> int:
    """Run one client command; its exit status (``EXIT_CODES`` for an error answer, 2 for a usage error)."""
    try:
        command.main(args=list(args), prog_name=f"better-compute {command.name}", standalone_mode=False)
    except Failed as exc:
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
