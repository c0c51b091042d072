"""How a client command prints an answer: a table for a list of objects (with the answer's other fields as
``key: value`` lines), ``key: value`` lines for an object, the value itself otherwise, or the whole answer as JSON
with ``--output json``; and the lines that explain an error's details."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import click
from rich.console import Console
from rich.table import Table

__all__ = ["cell", "explain", "print_answer"]


def cell(value: Any) -> str:
    """A value as one table cell or one ``key: value`` line: plain values as they are, others as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str | int | float | bool):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def print_answer(data: Any, output: str) -> None:
    """Print an answer's ``data`` on stdout, as ``output`` (``table`` or ``json``) asks."""
    if output == "json":
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    rows = _rows(data)
    if rows is not None:
        _print_table(rows)
        rest = {k: v for k, v in data.items() if not isinstance(v, list) and v is not None}
        for key, value in rest.items():
            click.echo(f"{key}: {cell(value)}")
        return
    if isinstance(data, dict):
        for key, value in data.items():
            click.echo(f"{key}: {cell(value)}")
        return
    click.echo(cell(data))


def _rows(data: Any) -> list[dict[str, Any]] | None:
    """The one list of objects in an answer (a page of a list method), or ``None``."""
    if not isinstance(data, dict):
        return None
    lists = [v for v in data.values() if isinstance(v, list) and all(isinstance(i, dict) for i in v)]
    return lists[0] if len(lists) == 1 else None


def _print_table(rows: list[dict[str, Any]]) -> None:
    # Piped, a table keeps its values whole (a terminal's width otherwise, folding what does not fit).
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 250)
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
        table.add_row(*(cell(row.get(c)) for c in columns))
    console.print(table)


def explain(code: str, details: Mapping[str, Any]) -> list[str]:
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
        lines += [f"{key}: {cell(value)}" for key, value in details.items()]
    elif code == "UNAVAILABLE" and details.get("reason") == "overloaded":
        lines.append(f"the server is overloaded and did not run the call (tried {details.get('attempts', 1)} times)")
    return lines
