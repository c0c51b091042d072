"""What the client commands draw in a terminal: the live table of ``nodes watch`` and the calendar of ``capacity
show``. Both work on the answers' JSON (``nodes.list``, ``capacity.get``), so they draw what any server sends."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

__all__ = ["capacity_calendar", "watch_nodes"]

_BAR = 30


def _when(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _ago(value: Any, now: dt.datetime) -> str:
    seen = _when(value)
    if seen is None:
        return "never"
    seconds = max((now - seen).total_seconds(), 0.0)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.0f}h ago"


def _flags(node: Mapping[str, Any]) -> str:
    flags = [name for name in ("cordoned", "draining") if node.get(name)]
    if node.get("desired_state_pending"):
        flags.append("pending")
    return ",".join(flags)


def _row(node: Mapping[str, Any], now: dt.datetime) -> list[str]:
    return [
        str(node.get("id", "")),
        str(node.get("pool_id", "")),
        str(node.get("state", "")),
        str(node.get("state_reason") or ""),
        str(node.get("session_epoch", "")),
        _ago(node.get("last_seen_at"), now),
        f"{node.get('observed_generation', '')}/{node.get('desired_generation', '')}",
        _flags(node),
    ]


_COLUMNS = ["node", "pool", "state", "reason", "session", "last seen", "acked/desired", "flags"]
_WIDTHS = [8, 22, 22, 12, 12, 7, 9, 13, 0]
"""Of a line of the piped output: the time, then the columns (ids are 22 characters)."""


def _line(cells: Sequence[str]) -> str:
    return " ".join(f"{cell:<{width}}" for cell, width in zip(cells, _WIDTHS, strict=True)).rstrip()


def _table(nodes: Sequence[Mapping[str, Any]], now: dt.datetime, note: str | None) -> RenderableType:
    table = Table(title=f"nodes at {now:%H:%M:%S} UTC ({len(nodes)})", title_justify="left")
    for column in _COLUMNS:
        table.add_column(column, overflow="fold")
    for node in nodes:
        table.add_row(*_row(node, now))
    return Group(table, Text(note, style="yellow")) if note else table


def _key(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes a node's line worth printing again (its last contact alone does not)."""
    return tuple(
        json.dumps(node.get(k), sort_keys=True)
        for k in (
            "pool_id",
            "state",
            "state_reason",
            "session_epoch",
            "observed_generation",
            "desired_generation",
            "cordoned",
            "draining",
            "retired_at",
        )
    )


def watch_nodes(
    fetch: Callable[[], list[dict[str, Any]] | None],
    *,
    interval: float,
    count: int,
    output: str,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Look at the nodes every ``interval`` seconds (``count`` times; 0: until interrupted). On a terminal with the
    table output: one table, redrawn. Otherwise: a line (or a JSON object) per node whenever it is new or changed.
    ``fetch`` gives ``None`` when the server cannot be reached right now: the watch says so and goes on."""
    looks = 0
    live = sys.stdout.isatty() and output == "table"
    last: dict[str, tuple[Any, ...]] = {}
    unreachable = False

    def once() -> tuple[list[dict[str, Any]], str | None]:
        nonlocal unreachable
        nodes = fetch()
        if nodes is None:
            if not unreachable and not live:
                click.echo("the server cannot be reached; still trying", err=True)
            unreachable = True
            return [], "the server cannot be reached; still trying"
        if unreachable and not live:
            click.echo("the server answers again", err=True)
        unreachable = False
        return nodes, None

    try:
        if live:
            console = Console()
            with Live(console=console, auto_refresh=False) as screen:
                while True:
                    nodes, note = once()
                    screen.update(_table(nodes, dt.datetime.now(dt.UTC), note), refresh=True)
                    looks += 1
                    if count and looks >= count:
                        return
                    sleep(interval)
        if output == "table":
            click.echo(_line(["time", *_COLUMNS]))
        while True:
            nodes, _ = once()
            now = dt.datetime.now(dt.UTC)
            for node in nodes:
                node_id = str(node.get("id"))
                key = _key(node)
                if last.get(node_id) == key:
                    continue
                last[node_id] = key
                if output == "json":
                    click.echo(json.dumps({"at": now.isoformat(), "node": node}, ensure_ascii=False))
                else:
                    click.echo(_line([f"{now:%H:%M:%S}", *_row(node, now)]))
            looks += 1
            if count and looks >= count:
                return
            sleep(interval)
    except KeyboardInterrupt:
        return


def capacity_calendar(data: Mapping[str, Any]) -> RenderableType:
    """A pool's GPUs now, then a bar per UTC day of the window: the GPU-hours booked as a share of what the pool's
    available GPUs give that day (the first and last days are clipped to the window), then the same per model."""
    start, end = _when(data.get("start")), _when(data.get("end"))
    available = float(data.get("available") or 0)
    unavailable = data.get("unavailable") or {}
    head = Text()
    head.append(f"pool {data.get('pool_id')}", style="bold")
    head.append(f"  at {data.get('at')}\n")
    head.append(
        f"{data.get('atoms')} atoms: {data.get('available')} available, {data.get('free')} free, "
        f"{data.get('booked')} booked now ({data.get('booked_gpus')} GPUs)"
    )
    if unavailable:
        head.append("; unavailable: " + ", ".join(f"{k} {v}" for k, v in sorted(unavailable.items())))
    days = Table(title="booked per day (UTC), as a share of the available atoms' hours", title_justify="left")
    for column, justify in (("day", "left"), ("booked", "left"), ("GPU-hours", "right"), ("share", "right")):
        days.add_column(column, justify=justify)  # type: ignore[arg-type]
    for day in data.get("days") or []:
        begins = _when(day.get("day"))
        if begins is None:
            continue
        hours = 24.0
        if start is not None and end is not None:
            hours = max((min(begins + dt.timedelta(days=1), end) - max(begins, start)).total_seconds() / 3600, 0.0)
        booked = float(day.get("gpu_hours") or 0)
        share = booked / (available * hours) if available and hours else 0.0
        filled = min(round(share * _BAR), _BAR)
        bar = Text("█" * filled, style="green") + Text("░" * (_BAR - filled), style="dim")
        days.add_row(f"{begins:%a %Y-%m-%d}", bar, f"{booked:.1f}", f"{share:.0%}")
    models = Table(title="per model", title_justify="left")
    for column in ("model", "atoms", "available", "free", "booked now", "GPU-hours in window"):
        models.add_column(column)
    for model in data.get("models") or []:
        models.add_row(
            str(model.get("model")),
            str(model.get("atoms")),
            str(model.get("available")),
            str(model.get("free")),
            str(model.get("booked")),
            f"{float(model.get('gpu_hours') or 0):.1f}",
        )
    return Group(head, Text(""), days, Text(""), models)
