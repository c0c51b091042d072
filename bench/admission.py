"""Admission: ``reservations.create`` over HTTP against one api process, next to pgbench running the same
statements, and the time of one placement as the fleet grows.

(1) HTTP. One ``better-compute serve --roles api --no-migrate`` process (uvicorn, the store's default pool of 10
    connections, so the default in-flight cap of 9 requests, the LISTEN/NOTIFY notifier: what an operator runs) over
    the bench's schema. The caller is a tenant admin (``compute.admin`` bound on the tenant) with its own
    credential; the embedded IAM caches the credential and the grants, but its decision on the draft reads the
    draft's projection row (a resource given by id is decided on its recorded tenant and pool), so a request costs
    the database transaction 1 (``Reservations.begin``, one statement), that read, and transaction 2 (one call of
    ``bc_admit_reservation``). Every request asks for ``--gpus`` GPUs (1) of one pool for an hour from now, without
    an idempotency key (``--with-key`` adds runs with a fresh ``Idempotency-Key`` on every request, whose answer
    ``idempotency.finish`` then stores: a fourth statement). The pool is a fleet seeded directly in SQL as the
    inventory controller leaves it (``--nodes`` adopted nodes, 8 available GPU atoms each), with one ended booking
    per atom from last week, as a pool in use has, so that the placer's statements are planned on a bookings table
    of a realistic size. Every run starts on the pool emptied of what the run before booked, after ``--warmup``
    seconds of the same load, and books far less than the pool holds (checked).

    The load comes from a client in a separate process (there is no ``ab``, ``wrk`` or ``oha`` here): uvloop, one
    HTTP/1.1 keep-alive connection per concurrent caller, the request's bytes made once, the answer read by its
    length. Saturation: ``--connections`` callers each sending its next request as soon as the last is answered,
    for ``--seconds``, giving reservations/s (only ``200`` answers count; any other is reported). Then half that
    rate, requests leaving on a fixed schedule whatever the answers (an open loop), each latency taken from when the
    schedule said to send it, so a stall is not hidden by the client waiting for it. Beside each run: the CPU of
    the api process and of the client over the window, how busy the machine's two cores were, and what PostgreSQL
    counted in ``pg_stat_user_functions`` (``track_functions = pl`` in the api's sessions, through ``PGOPTIONS``):
    ``bc_place`` calls per admission (more than one when concurrent admissions collide on the same atoms and
    place again) and the average time of one.

(2) pgbench, same run, same pool, same statements (imported from the packages, bound, prepared), as many clients
    as the api's in-flight cap, the same warm-up and length: transaction 1 (the store's ``_BEGIN`` with the api's
    parameters), then transaction 2 (``SELECT bc_admit_reservation(...)`` with the jsonb ``PgReservations.admit``
    builds: the caller's principal, the action, a decision id, the event type, the controller's work kind and
    shard, the notifier's channel, so its two ``pg_notify`` are sent too), each reservation under a fresh id
    (``\\set`` random). Runs: the two transactions (the baseline), with the IAM's projection read between them (what
    the api sends), the same with one client (no contention), and with ``--with-key`` the key's statements.
    pgbench cannot bind a NULL, so the absent key is bound as ``'null'`` through ``NULLIF``; the id is a 19-digit
    number rather than ``rsv_`` and 16 hex digits; the window is fixed when the run starts rather than at each
    request's ``now``. After each run every counted call must have placed its reservation. The ratio HTTP/pgbench
    is what Python, uvicorn, the dispatcher, the IAM, the codec and psycopg cost on top of PostgreSQL doing the
    same work; on two cores both share the machine with PostgreSQL.

(3) Placement. For each of ``--sizes`` (100, 1,000, 10,000 nodes x 8 GPUs), alone in the tables (its fleet seeded
    with its history, timed, then taken away): the time of one ``bc_place(...)`` call for ``--gpus`` GPUs over an
    hour, and of a whole ``bc_admit_reservation`` (transaction 2; a draft inserted by ``_BEGIN`` first in the same
    transaction, rolled back after, so the pool stays as it was), the median of ``--calls`` calls each (fewer, at
    least 5, when they take over 20 s), from this process over psycopg, so a local round trip (``SELECT 1``,
    printed) is in each figure. On the empty pool, then with 50 % of its atoms booked over the window two ways:
    "front", the first half of the nodes in the placer's order, which is where its best fit puts reservations that
    share a window (a pool filled by this placer looks like this); and "spread", every other node. The growth factor
    is the largest size's time over the smallest's.

Aims (issue 13), printed beside the figures: >= 1,000 reservations/s over HTTP, >= 0.8 x pgbench, p99 <= 50 ms at
half load, placement growing <= 1.5 x from 100 to 10,000 nodes.

    python bench/admission.py            # BETTERCOMPUTE_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/test
    python bench/admission.py --with-key --profile --seconds 10
    python bench/admission.py --json      # the figures as one JSON object on stdout (bench/run.py reads it)

``--profile`` also runs a saturation run against an api process under cProfile (slower, so not the figures above)
and prints where its wall time went. Takes about 5 minutes with the defaults, most of it placing on 10,000 nodes
half booked at the front (seconds a call). Uses (and drops) the schema ``bc_bench_admission``.

This file runs the parts and reports: ``_admission_setup`` (the schema, the tenant admin, the fleets, small helpers),
``_admission_http`` (1) with its load client ``_admission_client`` (a process of its own), ``_admission_pgbench`` (2)
and ``_admission_placement`` (3).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import tempfile
from pathlib import Path

import attrs

from bench import _admission_setup as base
from bench._admission_http import Api, HttpRun, bench_http, profile_api
from bench._admission_pgbench import PgbenchRun, pgbench_runs
from bench._admission_placement import Placement, bench_placement
from bench._admission_setup import GPUS_PER_NODE, URL, drop_schema, pgbench_binary, prepare, say
from bettercompute import Options
from bettercompute._assembly import effective_max_in_flight
from bettercompute_store_pg import PgStore

SECONDS_DEFAULT = 5
WARMUP_DEFAULT = 2
CONNECTIONS_DEFAULT = 32
HTTP_NODES_DEFAULT = 4000
SIZES_DEFAULT = "100,1000,10000"
CALLS_DEFAULT = 30
AIM_RATE = 1000.0
AIM_RATIO = 0.8
AIM_P99_MS = 50.0
AIM_GROWTH = 1.5


# --- main -------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Results:
    cap: int
    http: list[tuple[HttpRun, HttpRun]]  # (saturation, half load): without a key, then with one
    pgbench: list[PgbenchRun] | None  # None: no pgbench here
    placement: list[Placement]
    round_trip_ms: float
    profile: str | None


def verdict(ok: bool, text: str) -> str:
    return f"{'met' if ok else 'MISSED'}: {text}"


def report_http(results: Results, args: argparse.Namespace) -> None:
    print(
        f"(1) reservations.create over HTTP: one api process (serve --roles api, in-flight cap {results.cap}), a "
        f"tenant admin, {args.gpus} GPU(s) for an hour each, a pool of {args.nodes:,} nodes x {GPUS_PER_NODE} GPUs "
        f"emptied before each run, {args.seconds} s per run after {args.warmup} s of warm-up"
    )
    print(
        f"  {'run':<34} {'res/s':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'api CPU':>8} {'client':>7}"
        f" {'busy':>5} {'places/adm':>10} {'place ms':>8}  errors"
    )
    for pair in results.http:
        for run in pair:
            print(
                f"  {run.label:<34} {run.rate:6.0f} {run.ms(0.5):7.1f} {run.ms(0.99):7.1f} {run.ms(1.0):7.1f}"
                f" {100 * run.api_cpu:7.0f}% {100 * run.client_cpu:6.0f}% {100 * run.busy:4.0f}%"
                f" {run.placing.per_admission:10.2f} {run.placing.place_ms:8.2f}  {run.failed or 'none'}"
            )
    print(
        f"  ({args.connections} connections at saturation; at half load requests leave on a fixed schedule and "
        "latency counts from the scheduled time; CPU in % of one core; busy: both cores, all processes; "
        "places/adm: bc_place calls per admission, place ms: the average one, both over warm-up and run)"
    )


def report_pgbench(results: Results, args: argparse.Namespace) -> None:
    if results.pgbench is None:
        print("(2) pgbench not found (on PATH or /usr/lib/postgresql/*/bin): no baseline, no ratio")
        return
    print(
        f"(2) pgbench on the same pool, the store's statements (bound, prepared), {args.seconds} s per run; "
        "avg ms per statement"
    )
    plain = results.http[0][0].rate
    keyed = results.http[1][0].rate if len(results.http) > 1 else None
    for run in results.pgbench:
        keyed_run = run.label.startswith("with key")
        http = keyed if keyed_run else plain
        ratio = f"HTTP / pgbench {http / run.tps:5.2f}" if http is not None and run.clients == results.cap else ""
        steps = ", ".join(f"{name} {ms:.1f}" for name, ms in run.statements)
        print(f"  {run.label:<32} {run.clients:>2} clients {run.tps:7.0f} res/s ({run.latency_ms:6.1f} ms)  {ratio}")
        print(f"  {'':<32} {steps}; places/adm {run.placing.per_admission:.2f}, place ms {run.placing.place_ms:.2f}")


def report_aims(results: Results) -> None:
    saturated, paced = results.http[0]
    print("aims (issue 13):")
    print(
        f"  {verdict(saturated.rate >= AIM_RATE, f'>= {AIM_RATE:,.0f} reservations/s')}: {saturated.rate:.0f}, "
        f"{saturated.rate / AIM_RATE:.2f} x the aim"
    )
    if results.pgbench:
        for run in results.pgbench[:2]:
            ratio = saturated.rate / run.tps
            print(f"  {verdict(ratio >= AIM_RATIO, f'>= {AIM_RATIO} x pgbench')}: {ratio:.2f} x ({run.label})")
    p99 = paced.ms(0.99)
    print(f"  {verdict(p99 <= AIM_P99_MS, f'p99 <= {AIM_P99_MS:.0f} ms at half load')}: {p99:.1f} ms")


def report_placement(results: Results, args: argparse.Namespace) -> None:
    print(
        f"(3) placement, {args.gpus} GPU(s) for an hour: median ms of up to {args.calls} calls from this process "
        f"(a bare round trip, SELECT 1, is {results.round_trip_ms:.2f} ms)"
    )
    names = {"empty": "empty", "front": "50% booked, front", "spread": "50% booked, spread"}
    print(f"  {'nodes':>6}  {'pool':<19} {'bc_place':>9} {'admission':>10} {'candidates':>11} {'calls':>6}")
    for p in results.placement:
        print(
            f"  {p.nodes:>6}  {names[p.layout]:<19} {p.place_ms:9.2f} {p.admit_ms:10.2f} {p.candidates:11d}"
            f" {p.calls:6d}"
        )
    sizes = sorted({p.nodes for p in results.placement})
    if len(sizes) < 2:
        return
    low, high = sizes[0], sizes[-1]
    by = {(p.nodes, p.layout): p for p in results.placement}
    print(f"  growth {low:,} -> {high:,} nodes (aim <= {AIM_GROWTH} x):")
    for layout in ("empty", "front", "spread"):
        place = by[(high, layout)].place_ms / by[(low, layout)].place_ms
        admit = by[(high, layout)].admit_ms / by[(low, layout)].admit_ms
        print(
            f"    {names[layout]:<19} bc_place {place:7.2f} x, admission {admit:7.2f} x   "
            f"{verdict(max(place, admit) <= AIM_GROWTH, f'<= {AIM_GROWTH} x')}"
        )


def key_of(label: str) -> str:
    """A run's label as a JSON key: ``"tx 1 + IAM read + tx 2"`` -> ``"tx_1_iam_read_tx_2"``."""
    return "_".join(re.findall(r"[a-z0-9]+", label.lower()))


def figures(results: Results, args: argparse.Namespace) -> dict[str, float | int | str | None]:
    """The results as flat named figures (``--json``): rates per second, times in ms, CPU and busy in %."""
    out: dict[str, float | int | str | None] = {"in_flight_cap": results.cap, "http_seconds": args.seconds}
    for pair in results.http:
        tag = "with_key" if pair[0].label.endswith("with key") else "no_key"
        for kind, run in zip(("saturation", "half_load"), pair, strict=True):
            prefix = f"http_{kind}_{tag}"
            out[f"{prefix}_per_s"] = round(run.rate, 1)
            out[f"{prefix}_p50_ms"] = round(run.ms(0.5), 2)
            out[f"{prefix}_p99_ms"] = round(run.ms(0.99), 2)
            out[f"{prefix}_api_cpu_percent"] = round(100 * run.api_cpu, 1)
            out[f"{prefix}_machine_busy_percent"] = round(100 * run.busy, 1)
            out[f"{prefix}_errors"] = sum(run.failed.values())
    if results.http:
        saturated, paced = results.http[0]
        out["http_saturation_per_s"] = round(saturated.rate, 1)
        out["http_saturation_p99_ms"] = round(saturated.ms(0.99), 2)
        out["http_half_load_p99_ms"] = round(paced.ms(0.99), 2)
        out["http_half_load_per_s"] = round(paced.rate, 1)
    for pg in results.pgbench or ():
        prefix = f"pgbench_{key_of(pg.label)}_{pg.clients}c"
        out[f"{prefix}_per_s"] = round(pg.tps, 1)
        out[f"{prefix}_latency_ms"] = round(pg.latency_ms, 2)
        if results.http and pg.clients == results.cap and not pg.label.startswith("with key"):
            out[f"{prefix}_ratio_http"] = round(results.http[0][0].rate / pg.tps, 3)
    if results.placement:
        out["placement_round_trip_ms"] = round(results.round_trip_ms, 3)
    for placement in results.placement:
        prefix = f"placement_{placement.nodes}_{placement.layout}"
        out[f"{prefix}_place_ms"] = round(placement.place_ms, 3)
        out[f"{prefix}_admit_ms"] = round(placement.admit_ms, 3)
        out[f"{prefix}_calls"] = placement.calls
    sizes = sorted({p.nodes for p in results.placement})
    if len(sizes) >= 2:
        by = {(p.nodes, p.layout): p for p in results.placement}
        for layout in ("empty", "front", "spread"):
            low, high = by[(sizes[0], layout)], by[(sizes[-1], layout)]
            out[f"placement_growth_{layout}_place"] = round(high.place_ms / low.place_ms, 3)
            out[f"placement_growth_{layout}_admit"] = round(high.admit_ms / low.admit_ms, 3)
    return out


def report(results: Results, args: argparse.Namespace) -> None:
    if results.http:
        report_http(results, args)
        report_pgbench(results, args)
        report_aims(results)
    if results.placement:
        report_placement(results, args)
    if results.profile is not None:
        print("the api process under cProfile (a saturation run without a key; slower than unprofiled):")
        print(results.profile)


def run(args: argparse.Namespace) -> Results:
    cap = effective_max_in_flight(Options(store=PgStore(URL, schema=base.SCHEMA)))  # what serve's default pool gives
    with tempfile.TemporaryDirectory(prefix="bc-bench-admission-") as tmp:
        say("migrating and seeding")
        setup = prepare(args, Path(tmp))
        http: list[tuple[HttpRun, HttpRun]] = []
        pgbench: list[PgbenchRun] | None = None
        profile = None
        if not args.skip_http:
            api = Api.start(setup, profile=None)
            try:
                for with_key in (False, True) if args.with_key else (False,):
                    say(f"HTTP, {'with' if with_key else 'without'} a key")
                    http.append(bench_http(api, setup, args, with_key=with_key))
            finally:
                api.stop()
            if pgbench_binary() is not None:
                say("pgbench")
                pgbench = pgbench_runs(setup, args, cap)
            if args.profile:
                say("HTTP under cProfile")
                profile = profile_api(setup, args)
        placement, round_trip = ([], 0.0) if args.skip_placement else bench_placement(setup, args)
    return Results(cap=cap, http=http, pgbench=pgbench, placement=placement, round_trip_ms=round_trip, profile=profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=SECONDS_DEFAULT, help="each measured run (default 5)")
    parser.add_argument(
        "--warmup", type=int, default=WARMUP_DEFAULT, help="seconds before each measured run, both sides (default 2)"
    )
    parser.add_argument(
        "--connections", type=int, default=CONNECTIONS_DEFAULT, help="callers at saturation (default 32)"
    )
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per reservation (default 1)")
    parser.add_argument(
        "--nodes", type=int, default=HTTP_NODES_DEFAULT, help=f"nodes of the HTTP runs' pool ({HTTP_NODES_DEFAULT})"
    )
    parser.add_argument("--sizes", default=SIZES_DEFAULT, help=f"placement pools, nodes ({SIZES_DEFAULT})")
    parser.add_argument("--calls", type=int, default=CALLS_DEFAULT, help="timed placements per pool and layout (30)")
    parser.add_argument("--with-key", action="store_true", help="also run with an Idempotency-Key on every request")
    parser.add_argument("--profile", action="store_true", help="also profile the api process (cProfile)")
    parser.add_argument("--skip-http", action="store_true", help="placement only")
    parser.add_argument("--skip-placement", action="store_true", help="HTTP and pgbench only")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    try:
        args.sizes = [int(n) for n in args.sizes.split(",")]
    except ValueError:
        parser.error("--sizes: comma-separated whole numbers")
    if (
        args.seconds < 1
        or args.warmup < 0
        or args.connections < 1
        or not 1 <= args.gpus <= GPUS_PER_NODE
        or args.calls < 1
    ):
        parser.error(
            f"need --seconds >= 1, --warmup >= 0, --connections >= 1, --calls >= 1 and 1 <= --gpus <= {GPUS_PER_NODE}"
        )
    if args.seconds != int(args.seconds):
        parser.error("--seconds: whole seconds (pgbench takes whole seconds)")
    args.seconds = int(args.seconds)
    drop_schema()
    try:
        results = run(args)
    finally:
        with contextlib.suppress(Exception):
            drop_schema()
    if args.json:
        print(json.dumps(figures(results, args)))
    else:
        report(results, args)


if __name__ == "__main__":
    main()
