"""Every benchmark in one command, and one table of what they measured: each figure beside its baseline from the same
run (pgbench on the same SQL wherever there is one), their ratio, and the machine it ran on.

Each bench below runs as a subprocess with ``--json`` (one JSON object of figures on its stdout, its progress on
stderr), one after the other, at sizes chosen so that the whole run takes about 10 minutes on this 2-core machine;
``--quick`` runs them small, to try the command. A bench that fails is a row saying so with the last line of its
stderr, the other rows still print, and the command exits 1. ``bench/shedding.py`` is run when it exists.

The header says what the machine was and how busy it was while the benches ran: the two cores are shared with other
people's work, and a figure taken on a busy machine is lower (or slower) than on a quiet one, so read the ratios,
which are taken side by side, before the absolute figures.

    make bench                                   # every bench, prints the table
    python bench/run.py --only worker,claims     # some of them (names: the files' stems)
    python bench/run.py --quick                  # small sizes, a few minutes
    python bench/run.py --write                  # also write the table into bench/RESULTS.md

``BETTERCOMPUTE_DATABASE_URL`` is handed to every bench (default postgresql://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
START_MARKER = "<!-- bench-table:start -->"
END_MARKER = "<!-- bench-table:end -->"
# The docs site includes the table (docs/benchmarks.md) as the snippet section between these two lines.
SNIPPET_START = "<!-- --8<-- [start:table] -->"
SNIPPET_END = "<!-- --8<-- [end:table] -->"
URL = os.environ.get("BETTERCOMPUTE_DATABASE_URL", "").strip() or "postgresql://postgres@127.0.0.1:5432/test"
TIMEOUT = 1800.0  # seconds any one bench may take before it counts as failed

Figures = Mapping[str, Any]


@attrs.frozen(kw_only=True)
class Row:
    """One line of the table. ``value`` and ``baseline`` are numbers (or None: not measured); ``unit`` is said once,
    in the measure's name; ``baseline_is`` says what the baseline is."""

    measure: str
    value: float | None
    baseline: float | None = None
    baseline_is: str = ""
    notes: str = ""
    failed: bool = False

    @property
    def ratio(self) -> float | None:
        if self.value is None or self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline


def number(value: float | None) -> str:
    """A figure as the table shows it: three significant digits or whole, thousands separated."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def get(figures: Figures, key: str) -> float | None:
    value = figures.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested JSON (gateway.py's and fleet.py's figures) as one level, keys joined with ``_``; a one-item list is its
    item (fleet.py prints one object per fleet size)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            name = f"{prefix}_{key}" if prefix else str(key)
            if isinstance(inner, dict | list) and inner:
                out.update(flatten(inner, name))
            else:
                out[name] = inner
        return out
    if isinstance(value, list):
        return {f"{prefix}_{n}" if prefix else str(n): v for n, v in enumerate(value)}
    return {prefix or "value": value}


# --- what each bench's figures become ---------------------------------------------------------------------------


def admission_rows(f: Figures) -> list[Row]:
    cap = int(get(f, "in_flight_cap") or 0)
    rows: list[Row] = []
    if "http_saturation_per_s" in f:
        baseline = get(f, f"pgbench_tx_1_iam_read_tx_2_{cap}c_per_s")
        bare = get(f, f"pgbench_tx_1_tx_2_{cap}c_per_s")
        rate = get(f, "http_saturation_per_s")
        rows.append(
            Row(
                measure="admissions/s, reservations.create over HTTP, saturated",
                value=rate,
                baseline=baseline,
                baseline_is=f"pgbench, the same statements with the IAM read, {cap} clients",
                notes=f"one api process; without the IAM read pgbench does {number(bare)}/s "
                f"(ratio {number(rate / bare if rate and bare else None)}); machine busy "
                f"{number(get(f, 'http_saturation_no_key_machine_busy_percent'))} %",
            )
        )
        solo = get(f, "pgbench_the_same_1_client_1c_latency_ms")
        rows.append(
            Row(
                measure="admission p99 ms at half load",
                value=get(f, "http_half_load_p99_ms"),
                baseline=solo,
                baseline_is="pgbench, the same statements, 1 client: its average ms, not a p99",
                notes=f"open loop at {number(get(f, 'http_half_load_per_s'))}/s; p50 "
                f"{number(get(f, 'http_half_load_no_key_p50_ms'))} ms; saturated p99 "
                f"{number(get(f, 'http_saturation_p99_ms'))} ms (aim: 50 ms)",
            )
        )
    sizes = sorted({int(m.group(1)) for k in f if (m := re.fullmatch(r"placement_(\d+)_empty_place_ms", k))})
    smallest = sizes[0] if sizes else 0
    for nodes in sizes:
        base = get(f, f"placement_{smallest}_empty_place_ms") if nodes != smallest else None
        rows.append(
            Row(
                measure=f"placement ms at {nodes:,} nodes (bc_place, empty pool)",
                value=get(f, f"placement_{nodes}_empty_place_ms"),
                baseline=base,
                baseline_is=f"the same at {smallest:,} nodes; the ratio is the growth, aim <= 1.5" if base else "",
                notes=f"half booked: front {number(get(f, f'placement_{nodes}_front_place_ms'))} ms, spread "
                f"{number(get(f, f'placement_{nodes}_spread_place_ms'))} ms; whole admission (empty) "
                f"{number(get(f, f'placement_{nodes}_empty_admit_ms'))} ms; a round trip is "
                f"{number(get(f, 'placement_round_trip_ms'))} ms",
            )
        )
    return rows


def gateway_rows(f: Figures) -> list[Row]:
    held = get(f, "sessions_held_gateway")
    cpu = get(f, "gateway_cpu_percent")
    per_minute = None if held is None or cpu is None or not held else cpu / 100 * 60_000 / held
    return [
        Row(
            measure="sessions held by one gateway",
            value=held,
            baseline=get(f, "sessions_asked"),
            baseline_is="sessions opened (simulated nodes over mutual TLS)",
            notes=f"{number(get(f, 'open_handshakes_per_s'))} handshakes/s while opening; "
            f"{number(get(f, 'liveness_writes_per_s'))} liveness writes/s",
        ),
        Row(
            measure="gateway CPU per session, ms a minute",
            value=per_minute,
            baseline=1.0,
            baseline_is="aim (issue 11): 25 % of a core for 15,000 sessions",
            notes=f"{number(cpu)} % of one core in steady state, {number(get(f, 'heartbeat_s'))} s heartbeats; "
            f"machine busy {number(get(f, 'machine_busy_percent_of_all_cores'))} %; the once-a-second flush is "
            "a fixed cost, so fewer sessions make each one dearer",
        ),
        Row(
            measure="gateway CPU per session with signed reports, ms a minute",
            value=get(f, "with_signed_reports_gateway_cpu_ms_per_session_minute"),
            baseline=per_minute,
            baseline_is="the same sessions without them (the row above); aim (issue 30) <= 1.10",
            notes=f"an inventory section signed by the node key every sixth heartbeat "
            f"({number(get(f, 'with_signed_reports_reports_per_session_minute'))} a node a minute, "
            f"{number(get(f, 'with_signed_reports_reports_per_s'))}/s), its signature checked by the gateway and the "
            f"section written with it; machine busy "
            f"{number(get(f, 'with_signed_reports_machine_busy_percent_of_all_cores'))} %",
        ),
        Row(
            measure="gateway RSS per session, KB",
            value=get(f, "rss_per_session_kb"),
            baseline=100.0,
            baseline_is="aim (issue 11): 100 KB",
            notes=f"{number(get(f, 'rss_held_mb'))} MB held - {number(get(f, 'rss_idle_mb'))} MB idle",
        ),
    ]


def claims_rows(f: Figures) -> list[Row]:
    rows = []
    for batch in (1, 10):
        if f"batch{batch}_store_items_per_s" not in f:
            continue
        rows.append(
            Row(
                measure=f"queue claims/s, PgStore, batch {batch} (claim + complete)",
                value=get(f, f"batch{batch}_store_items_per_s"),
                baseline=get(f, f"batch{batch}_pgbench_items_per_s"),
                baseline_is=f"pgbench, the same SQL, {int(get(f, 'claimers') or 0)} clients",
                notes=f"{int(get(f, 'claimers') or 0)} concurrent claimers",
            )
        )
    return rows


def worker_rows(f: Figures) -> list[Row]:
    rows = []
    for processes in (1, 2, 3):
        prefix = f"workers{processes}"
        if f"{prefix}_items_per_s" not in f:
            continue
        rows.append(
            Row(
                measure=f"worker scaling: {processes} process{'es' if processes > 1 else ''}, items/s",
                value=get(f, f"{prefix}_items_per_s"),
                baseline=get(f, f"{prefix}_pgbench_items_per_s"),
                baseline_is=f"pgbench, the workers' claim and fenced completes, {processes} "
                f"client{'s' if processes > 1 else ''}",
                notes=f"{number(get(f, f'{prefix}_ratio_one_worker'))} x one worker; shards "
                f"{f.get(f'{prefix}_shards')}; no-op reconciler",
            )
        )
    how, baseline = "poked", "polled"
    if f"webhook_{how}_p99_ms" in f:
        rows.append(
            Row(
                measure="event -> webhook p99 ms (PgNotifier)",
                value=get(f, f"webhook_{how}_p99_ms"),
                baseline=get(f, f"webhook_{baseline}_p99_ms"),
                baseline_is=f"the same without a notifier, polling every {number(get(f, 'webhook_poll_interval_s'))} s",
                notes=f"p50 {number(get(f, f'webhook_{how}_p50_ms'))} ms (polled "
                f"{number(get(f, f'webhook_{baseline}_p50_ms'))}); {int(get(f, f'webhook_{how}_received') or 0)}/"
                f"{int(get(f, f'webhook_{how}_published') or 0)} received, signatures checked",
            )
        )
    return rows


def joins_rows(f: Figures) -> list[Row]:
    callers = int(get(f, "callers") or 0)
    return [
        Row(
            measure=f"joins/s, {callers} callers, a token each",
            value=get(f, "own_token_joins_per_s"),
            baseline=get(f, "own_token_pgbench_whole_join_tps"),
            baseline_is=f"pgbench, the whole join's SQL, {callers} clients",
            notes=f"p99 {number(get(f, 'own_token_p99_ms'))} ms; {number(get(f, 'own_token_cpu_us_per_join'))} µs "
            f"CPU a join (cryptography included, which pgbench does not do); one shared token: "
            f"{number(get(f, 'shared_token_joins_per_s'))}/s vs pgbench "
            f"{number(get(f, 'shared_token_pgbench_whole_join_tps'))}",
        ),
        Row(
            measure=f"joins/s from a keyless gateway, {callers} callers",
            value=get(f, "internal_joins_per_s"),
            baseline=get(f, "own_token_joins_per_s"),
            baseline_is="the same joins in process (the row above); aim ≥ 0.8",
            notes=f"JoinService behind the internal channel (gRPC, mutual TLS, loopback), the gateway a process of "
            f"its own; p99 {number(get(f, 'internal_p99_ms'))} ms; CPU a join: api "
            f"{number(get(f, 'internal_api_cpu_us_per_join'))} µs, gateway "
            f"{number(get(f, 'internal_gateway_cpu_us_per_join'))} µs",
        ),
    ]


def iam_rows(f: Figures) -> list[Row]:
    callers = int(get(f, "callers") or 0)
    return [
        Row(
            measure="IAM authenticate, uncached, /s",
            value=get(f, "b_authenticate_uncached_1_select_per_s"),
            baseline=get(f, "pgbench_credential_lookup_per_s"),
            baseline_is=f"pgbench, the credential lookup, {callers} clients",
            notes=f"cached: {number(get(f, 'a_authenticate_cached_per_s'))}/s",
        ),
        Row(
            measure="IAM require, uncached, /s",
            value=get(f, "d_require_uncached_1_select_per_s"),
            baseline=get(f, "pgbench_grants_query_per_s"),
            baseline_is=f"pgbench, the grants query, {callers} clients",
            notes=f"cached: {number(get(f, 'c_require_grants_cached_per_s'))}/s",
        ),
    ]


def fleet_rows(f: Figures) -> list[Row]:
    nodes = int(get(f, "nodes") or 0)
    rows = [
        Row(
            measure=f"fleet of {nodes:,} simulated nodes: seconds until all adopted",
            value=get(f, "adoption_seconds_to_adopted"),
            notes=f"2 gateways, 1 worker, 2 bcd sim; {int(get(f, 'adoption_adopted') or 0)} adopted; steady state "
            f"{number(get(f, 'steady_control_plane_ms_per_node_minute'))} ms CPU per node a minute",
        )
    ]
    if "placed_to_bound_p50_ms" in f:
        rows.append(
            Row(
                measure="placed -> bound p50 ms (reservation on a connected bcd sim node)",
                value=get(f, "placed_to_bound_p50_ms"),
                notes=f"min {number(get(f, 'placed_to_bound_min_ms'))} ms, p99 "
                f"{number(get(f, 'placed_to_bound_p99_ms'))} ms, max "
                f"{number(get(f, 'placed_to_bound_max_ms'))} ms; {int(get(f, 'placed_to_bound_bound') or 0)}/"
                f"{int(get(f, 'placed_to_bound_reservations') or 0)} bound; state polled every "
                f"{number(get(f, 'placed_to_bound_poll_ms'))} ms; no baseline (no SQL equivalent)",
            )
        )
    return rows


def shedding_rows(f: Figures) -> list[Row]:
    return [
        Row(
            measure="admitted p99 ms under overload (shedding)",
            value=get(f, "loaded_admitted_p99_ms"),
            baseline=get(f, "unloaded_p99_ms"),
            baseline_is="p99 unloaded",
            notes=f"{number(get(f, 'admitted_rps'))} admitted/s; shed share {number(get(f, 'shed_share'))}",
        )
    ]


@attrs.frozen(kw_only=True)
class Bench:
    name: str
    full: Sequence[str]  # arguments besides --json
    quick: Sequence[str]
    rows: Callable[[Figures], list[Row]]
    optional: bool = False  # the file may not exist (yet): then it is left out, not failed

    @property
    def path(self) -> Path:
        return HERE / f"{self.name}.py"


BENCHES = (
    Bench(
        name="admission",
        full=["--seconds", "10"],  # --sizes defaults to 100,1000,10000
        quick=["--seconds", "2", "--warmup", "1", "--nodes", "1000", "--sizes", "100,1000", "--calls", "5"],
        rows=admission_rows,
    ),
    Bench(name="claims", full=[], quick=[], rows=claims_rows),
    Bench(name="worker", full=[], quick=[], rows=worker_rows),
    Bench(name="joins", full=[], quick=["--joins", "80", "--callers", "4", "--seconds", "1"], rows=joins_rows),
    Bench(name="iam", full=[], quick=[], rows=iam_rows),
    Bench(
        name="gateway",
        full=["--sessions", "1000", "--reports-every", "6"],
        quick=["--sessions", "100", "--window", "5", "--settle", "3", "--reports-every", "6"],
        rows=gateway_rows,
    ),
    Bench(
        name="fleet",
        full=["--nodes", "100", "--settle", "5", "--window", "10", "--reservations", "30"],
        quick=["--nodes", "20", "--settle", "2", "--window", "3", "--reservations", "10"],
        rows=fleet_rows,
    ),
    Bench(name="shedding", full=[], quick=[], rows=shedding_rows, optional=True),
)


# --- running ----------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Outcome:
    bench: str
    seconds: float
    busy_percent: float | None
    rows: list[Row]
    error: str | None = None


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, every core."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def parse_figures(stdout: str) -> Any:
    """The bench's JSON: all of stdout, or else its last line that parses."""
    with contextlib.suppress(ValueError):
        return json.loads(stdout)
    for line in reversed(stdout.strip().splitlines()):
        with contextlib.suppress(ValueError):
            return json.loads(line)
    raise ValueError("no JSON on stdout")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run_bench(bench: Bench, quick: bool, log_folder: Path | None) -> Outcome:
    command = [sys.executable, str(bench.path), *(bench.quick if quick else bench.full), "--json"]
    say(f"{bench.name}: {' '.join(command[1:])}")
    busy_start, total_start = machine_ticks()
    started = time.monotonic()
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
            cwd=ROOT,
            env={**os.environ, "BETTERCOMPUTE_DATABASE_URL": URL},
        )
        stdout, stderr, code = result.stdout, result.stderr, result.returncode
    except subprocess.TimeoutExpired as timed_out:
        stdout, code = "", -1
        stderr = (timed_out.stderr.decode(errors="replace") if isinstance(timed_out.stderr, bytes) else "") + (
            f"\ntimed out after {TIMEOUT:.0f} s"
        )
    seconds = time.monotonic() - started
    busy_end, total_end = machine_ticks()
    busy = 100 * (busy_end - busy_start) / max(1, total_end - total_start)
    if log_folder is not None:
        (log_folder / f"{bench.name}.stderr").write_text(stderr)
        (log_folder / f"{bench.name}.json").write_text(stdout)
    say(f"{bench.name}: exit {code} after {seconds:.0f} s, machine busy {busy:.0f} %")
    error = None
    rows: list[Row] = []
    if code != 0:
        error = f"exit {code}: {last_line(stderr)}"
    else:
        try:
            rows = bench.rows(flatten(parse_figures(stdout)))
        except Exception as failed:  # a figure missing or malformed: the bench's row says so, the others print
            error = f"its figures could not be read ({type(failed).__name__}: {failed})"
    if error is not None:
        rows = [Row(measure=f"{bench.name}.py", value=None, notes=f"FAILED: {error}", failed=True)]
    return Outcome(bench=bench.name, seconds=seconds, busy_percent=busy, rows=rows, error=error)


# --- the machine ------------------------------------------------------------------------------------------------


def command_output(argv: Sequence[str]) -> str | None:
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def pgbench_version() -> str:
    binary = shutil.which("pgbench") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))), None)
    if binary is None:
        return "not installed"
    return command_output([str(binary), "--version"]) or "unknown"


def postgres_version() -> str:
    try:
        import psycopg

        with psycopg.connect(URL, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            return f"PostgreSQL {row[0]}" if row else "unknown"
    except Exception as failed:  # the header says so; the benches will fail on their own
        return f"unreachable ({type(failed).__name__})"


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = "unknown"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    commit = command_output(["git", "rev-parse", "--short", "HEAD"]) or "unknown"
    if command_output(["git", "status", "--porcelain", "--untracked-files=no"]):
        commit += " (with uncommitted changes)"
    return {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "RAM": ram,
        "kernel": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "PostgreSQL": postgres_version(),
        "pgbench": pgbench_version(),
        "git commit": commit,
    }


# --- the table --------------------------------------------------------------------------------------------------


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(rows: Sequence[Row]) -> str:
    lines = ["| measure | value | baseline (what it is) | value / baseline | notes |", "|---|---:|---|---:|---|"]
    for row in rows:
        value = "FAILED" if row.failed else number(row.value)
        baseline = f"{number(row.baseline)} ({row.baseline_is})" if row.baseline is not None else "-"
        lines.append(f"| {cell(row.measure)} | {value} | {cell(baseline)} | {number(row.ratio)} | {cell(row.notes)} |")
    return "\n".join(lines)


def render(header: Mapping[str, str], outcomes: Sequence[Outcome], *, quick: bool) -> str:
    """The header (machine, run) as a list, then the one table."""
    lines = [f"- {name}: {value}" for name, value in header.items()]
    if quick:
        lines.append("- sizes: `--quick` (small; not the figures to quote)")
    per_bench = ", ".join(
        f"{o.bench} {o.seconds:.0f} s / {'-' if o.busy_percent is None else f'{o.busy_percent:.0f}'} %"
        for o in outcomes
    )
    lines.append(f"- each bench's time and the machine's busy share meanwhile: {per_bench}")
    rows = [row for outcome in outcomes for row in outcome.rows]
    return "\n".join(lines) + "\n\n" + render_table(rows) + "\n"


def replace_between_markers(text: str, block: str) -> str:
    """``text`` with what lies between ``START_MARKER`` and ``END_MARKER`` replaced by ``block`` (markers kept)."""
    start = text.find(START_MARKER)
    end = text.find(END_MARKER)
    if start < 0 or end < start:
        raise ValueError(f"no {START_MARKER} ... {END_MARKER} in the text")
    return text[: start + len(START_MARKER)] + "\n" + block.strip("\n") + "\n" + text[end:]


def results_page(table: str) -> str:
    return (
        "# Benchmark results\n\n"
        "Written by `python bench/run.py --write` (`make bench` prints the same table without writing it). Each "
        "measure is beside its baseline from the same run; the ratio is value / baseline. What each bench measures, "
        "and how, is in its file's docstring; [README.md](README.md) explains the figures and gives detailed runs.\n\n"
        f"{SNIPPET_START}\n{START_MARKER}\n{table.strip()}\n{END_MARKER}\n{SNIPPET_END}\n\n"
        "Run it again: `make bench` (about 10 minutes on 2 cores), `python bench/run.py --only worker,claims` for "
        "some benches, `python bench/run.py --quick` to try it, and `--write` to update this page.\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    names = [b.name for b in BENCHES]
    parser.add_argument("--only", help=f"comma-separated benches to run ({', '.join(names)})")
    parser.add_argument("--quick", action="store_true", help="small sizes, to try the command (a few minutes)")
    parser.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    parser.add_argument("--logs", type=Path, help="a folder to keep each bench's stdout and stderr in")
    parser.add_argument("--note", help="a line for the header: what else the machine was doing, say")
    args = parser.parse_args()
    chosen = list(BENCHES)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"--only: unknown {', '.join(unknown)} (known: {', '.join(names)})")
        chosen = [b for b in BENCHES if b.name in wanted]
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)

    started = dt.datetime.now(dt.UTC)
    header = machine()
    load_start = load_average()
    busy_start, total_start = machine_ticks()
    children_start = resource.getrusage(resource.RUSAGE_CHILDREN)
    outcomes = []
    for bench in chosen:
        if not bench.path.exists():
            if bench.optional:
                say(f"{bench.name}: {bench.path.name} is not there; left out")
                continue
            outcomes.append(
                Outcome(
                    bench=bench.name,
                    seconds=0.0,
                    busy_percent=None,
                    rows=[Row(measure=f"{bench.name}.py", value=None, notes="FAILED: no such file", failed=True)],
                    error="no such file",
                )
            )
            continue
        outcomes.append(run_bench(bench, args.quick, args.logs))
    busy_end, total_end = machine_ticks()
    children_end = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = (dt.datetime.now(dt.UTC) - started).total_seconds()
    ours = (children_end.ru_utime + children_end.ru_stime) - (children_start.ru_utime + children_start.ru_stime)
    cores = os.cpu_count() or 1
    header["date"] = f"{started:%Y-%m-%d %H:%M} UTC, {wall / 60:.0f} minutes"
    header["machine busy during the run"] = (
        f"{100 * (busy_end - busy_start) / max(1, total_end - total_start):.0f} % of {cores} cores, of which the "
        f"bench processes {100 * ours / max(1.0, wall * cores):.0f} % (PostgreSQL's own work and other people's "
        f"processes are the rest); 1-minute load {load_start:.1f} at the start, {load_average():.1f} at the end"
    )
    if args.note:
        header["note"] = args.note
    table = render(header, outcomes, quick=args.quick)
    print(table)
    if args.write:
        # Only the table is replaced when the page has one, so what else was written there stays.
        old = RESULTS.read_text() if RESULTS.exists() else ""
        RESULTS.write_text(replace_between_markers(old, table) if START_MARKER in old else results_page(table))
        say(f"wrote the table in {RESULTS.relative_to(ROOT)}")
    return 1 if any(o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
