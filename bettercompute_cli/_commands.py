"""The client commands that are not one method's: ``nodes watch`` and ``capacity show`` (each several calls, shown
as a live table or a calendar), ``tunnel``, ``login`` (a call, then a saved profile), ``logout`` and ``completion``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

import click
from click import shell_completion
from rich.console import Console

from ._call import Failed, all_pages, call_path, connect, connection_options
from ._constants import COMPLETE_VAR
from ._output import print_answer
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
)
from ._views import capacity_calendar, watch_nodes

__all__ = ["IN_GROUPS", "top_commands"]


def _output_option() -> click.Option:
    return click.Option(["--output"], type=click.Choice(["table", "json"]), default="table", show_default=True)


def _watch_command() -> click.Command:
    def watch(tenant: str, pool_id: str | None, interval: float, count: int, output: str, **given: Any) -> None:
        connection = connect(given)
        body = {"tenant": tenant, **({"pool_id": pool_id} if pool_id else {})}

        def fetch() -> list[dict[str, Any]] | None:
            try:
                return all_pages(connection, "nodes/list", body, "nodes")
            except Failed as exc:
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
            *connection_options(),
            _output_option(),
        ],
        callback=watch,
        help="A live table of nodes: their state, session, last contact and desired-state generations. Piped (or "
        "with --output json), one line per node each time it changes.",
        short_help="A live table of nodes.",
    )


def _calendar_command() -> click.Command:
    def show(pool_id: str, days: int, start: str | None, output: str, **given: Any) -> None:
        connection = connect(given)
        data = call_path(
            connection, "capacity/get", {"pool_id": pool_id, "days": days, **({"start": start} if start else {})}
        )
        if output == "json":
            print_answer(data, output)
            return
        Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120).print(capacity_calendar(data))

    return click.Command(
        "show",
        params=[
            click.Option(["--pool-id", "pool_id"], required=True),
            click.Option(["--days"], type=click.IntRange(min=1, max=31), default=7, show_default=True),
            click.Option(["--start"], default=None, help="The first day (ISO 8601; default now)."),
            *connection_options(),
            _output_option(),
        ],
        callback=show,
        help="A pool's calendar: its GPUs now, and per day how much of them is booked.",
        short_help="A pool's calendar.",
    )


_AUDIT_FILTERS = ("tenant", "actor", "action", "resource_type", "resource_id", "since", "until")


def _export_command() -> click.Command:
    def export(page_size: int, **given: Any) -> None:
        connection = connect(given)
        body = {name: given[name] for name in _AUDIT_FILTERS if given.get(name) is not None}
        cursor = None
        while True:  # every page, however many: an export is the whole log that matches
            page = call_path(
                connection, "audit/list", {**body, "limit": page_size, **({"cursor": cursor} if cursor else {})}
            )
            for entry in page.get("entries", []):
                click.echo(json.dumps(entry, separators=(",", ":"), ensure_ascii=True, sort_keys=True))
            cursor = page.get("next_cursor")
            if not cursor:
                return

    return click.Command(
        "export",
        params=[
            *(click.Option([f"--{name.replace('_', '-')}", name], default=None) for name in _AUDIT_FILTERS),
            click.Option(
                ["--page-size", "page_size"], type=click.IntRange(min=1, max=1000), default=500, show_default=True
            ),
            *connection_options(),
        ],
        callback=export,
        help="The audit rows that match, oldest first, as JSON lines on stdout (one object a line, ASCII, keys "
        "sorted), for a SIEM: every page of audit.list, followed to the end. Without --tenant, every row (root scope "
        "only).",
        short_help="Audit rows as JSON lines.",
    )


IN_GROUPS: Mapping[str, Callable[[], click.Command]] = {
    "nodes": _watch_command,
    "capacity": _calendar_command,
    "audit": _export_command,
}
"""Commands of a group that are not one method's: ``nodes watch``, ``capacity show``, ``audit export``."""


def _tunnel_command() -> click.Command:
    def tunnel(resource_id: str, port: int, local: int, gateway: str | None, **given: Any) -> None:
        from ._tunnel import TunnelError, serve_tunnel, tunnel_call  # grpclib and the wire code: only for this

        connection = connect(given)
        try:
            path, body = tunnel_call(resource_id, port)
        except TunnelError as exc:
            raise click.UsageError(str(exc)) from None

        async def ask() -> Mapping[str, Any]:
            answer = await asyncio.to_thread(call_path, connection, path, body)
            if not isinstance(answer, dict):
                raise Failed("INTERNAL", "the server answered something that is not a tunnel")
            return answer

        def ready(bound: int) -> None:
            click.echo(f"127.0.0.1:{bound} -> {resource_id}:{port} (Ctrl-C to stop)", err=True)

        def report(line: str) -> None:
            click.echo(line, err=True)

        async def until_stopped() -> None:
            # Ctrl-C (and SIGTERM) through the loop's own wake-up. With asyncio.run's plain handler, a signal the
            # kernel hands to the thread asking for a tunnel left the idle loop asleep, never told.
            loop, task = asyncio.get_running_loop(), asyncio.current_task()
            assert task is not None
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:  # started in the background: it keeps ignoring it
                    loop.add_signal_handler(sig, task.cancel)
            await serve_tunnel(ask, local_port=local, gateway=gateway, ready=ready, report=report)

        try:
            asyncio.run(until_stopped())
        except (KeyboardInterrupt, asyncio.CancelledError):
            click.echo("stopped", err=True)
        except OSError as exc:
            raise Failed("", f"cannot listen on 127.0.0.1:{local}: {exc.strerror or exc}", status=1) from None

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
            *connection_options(),
        ],
        callback=tunnel,
        help="Reach a port of a node (node_...) through the gateway from a port on 127.0.0.1: each local connection "
        "gets a tunnel of its own (nodes.tunnel; the node allows the port with bcd node --tunnel-local-port).",
        short_help="Reach a port of a node through the gateway.",
    )


# --- login, logout, completion -------------------------------------------------------------------------------------


def _login_token(token: str | None) -> str:
    """The credential ``login`` checks: ``--token`` (``-``: a line of stdin), the environment, else a prompt."""
    if token == "-":  # noqa: S105 - "read it from stdin", not a credential
        return sys.stdin.readline().strip()
    if token is not None:
        return token
    found = next((os.environ[k] for k in TOKEN_ENVS if os.environ.get(k)), None)
    if found is not None:
        return found
    if not sys.stdin.isatty():
        raise click.UsageError("give the credential with --token (or --token - to read it from stdin)")
    return str(click.prompt("Credential", hide_input=True)).strip()


def _login_command() -> click.Command:
    def login(server: str | None, token: str | None, profile: str | None) -> None:
        env = os.environ
        name = profile or env.get(PROFILE_ENV) or DEFAULT_PROFILE
        server = server or env.get(URL_ENV) or DEFAULT_SERVER
        token = _login_token(token)
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


def _completion_command(root: Callable[[], click.Group]) -> click.Command:
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


def top_commands(root: Callable[[], click.Group]) -> list[click.Command]:
    """``login``, ``logout``, ``tunnel`` and ``completion`` (``root``: the group whose commands it completes)."""
    return [_login_command(), _logout_command(), _tunnel_command(), _completion_command(root)]
