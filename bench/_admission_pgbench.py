"""(2) of ``bench/admission.py``: pgbench running the statements the api sends (imported from the packages, bound,
prepared) on the same pool, as many clients as the api's in-flight cap: the baseline the HTTP figures are set against.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import attrs

from bench import _admission_setup as base
from bench._admission_setup import (
    ACTION,
    HORIZON,
    HOUR,
    URL,
    Placing,
    Setup,
    connect,
    counting_env,
    function_calls,
    one_line,
    pgbench_binary,
    placing_since,
    reset_runs,
)
from bettercompute._runtime.shards import SHARDS
from bettercompute._runtime.workers import SINKS_POKE, WORK_CHANNEL
from bettercompute.modules.reservations import RESERVATION_KIND, event_type
from bettercompute_iam._pg import IamTables
from bettercompute_store_pg import PgNotifier, PgStore
from bettercompute_store_pg._idempotency import _FINISH
from bettercompute_store_pg.modules.reservations._repository import _BEGIN


@attrs.frozen(kw_only=True)
class PgbenchRun:
    """One pgbench run: reservations/s, average latency, and each statement's average latency (ms)."""

    label: str
    clients: int
    tps: float
    latency_ms: float
    statements: list[tuple[str, float]]
    placing: Placing


def admit_argument(setup: Setup, *, with_key: bool) -> dict[str, Any]:
    """The jsonb ``PgReservations.admit`` builds for a create like the HTTP runs' (id and shard set per call)."""
    notifier = PgNotifier(URL, schema=base.SCHEMA)
    return {
        "id": "",
        "share": float(1),
        "model": None,
        "min_memory_mib": None,
        "one_node": False,
        "nvlink": False,
        "mig_profile": None,
        "now": dt.datetime.now(dt.UTC).isoformat(),
        "horizon": f"{int(HORIZON.total_seconds())} seconds",
        "actor": setup.principal,
        "action": ACTION,
        "decision_id": uuid.uuid4().hex,
        "event_type": event_type("placed"),
        "work_kind": RESERVATION_KIND,
        "work_shard": 0,
        "work_channel": notifier.channel_name(WORK_CHANNEL),
        "sinks_poke": SINKS_POKE,
        "idempotency_identity": setup.principal if with_key else None,
        "idempotency_key": "" if with_key else None,
    }


def projection_read() -> str:
    """The IAM's read of a resource's projection row (its decision on the draft, by id), as the api sends it."""
    query = IamTables(PgStore(URL, schema=base.SCHEMA))._projected.query
    return " ".join(query.replace("%(type)s", "'reservation'").replace("%(id)s", "CAST(:n AS text)").split())


def pgbench_script(*, with_key: bool, iam_read: bool) -> tuple[str, list[str]]:
    """Transaction 1 (``_BEGIN``), with ``iam_read`` the IAM's read of the draft's projection row, transaction 2
    (the admission), and with a key the answer stored; each statement its own implicit transaction, as the api
    runs them. ``:n`` is the reservation's id (and its key), fresh per call. The script, and its statements' names."""
    begin = one_line(
        _BEGIN,
        {
            ":id": "CAST(:n AS text)",
            ":key": "NULLIF(CAST(:key AS text), 'null')",
            ":ttl": "CAST(:ttl AS interval)",
        },
    )
    merge = "'id', CAST(:n AS text), 'work_shard', CAST(:shard AS integer)"
    if with_key:
        merge += ", 'idempotency_key', CAST(:n AS text)"
    admit = f'SELECT "{base.SCHEMA}".bc_admit_reservation(CAST(:p AS jsonb) || jsonb_build_object({merge})) AS out'
    lines = ["\\set n random(1000000000000000000, 9000000000000000000)", f"\\set shard :n % {SHARDS}"]
    if with_key:
        lines.append("\\set key :n")
    statements = [("transaction 1", begin)]
    if iam_read:
        statements.append(("IAM projection read", projection_read()))
    statements.append(("transaction 2", admit))
    if with_key:
        statements.append(("idempotency finish", one_line(_FINISH, {":key": "CAST(:n AS text)"})))
    return "\n".join([*lines, *(f"{sql};" for _, sql in statements)]) + "\n", [name for name, _ in statements]


def pgbench_variables(setup: Setup, *, with_key: bool, gpus: int, start: dt.datetime) -> dict[str, str]:
    """The parameters as the api binds them (the window fixed at ``start``; no key is ``'null'``)."""
    answer = {"output": {"id": "rsv_pgbench", "state": "placed"}}
    variables = {
        "pool_id": setup.pool,
        "pool_tenants": "{" + setup.tenant + "}",
        "tenant": setup.tenant,
        "gpus": str(gpus),
        "constraints": "{}",
        "start_at": start.isoformat(),
        "end_at": (start + HOUR).isoformat(),
        "labels": "{}",
        "created_by": setup.principal,
        "now": start.isoformat(),
        "identity": setup.principal,
        "request_hash": "0" * 64,
        "attempt": uuid.uuid4().hex,
        "ttl": "24 hours",
        "p": json.dumps(admit_argument(setup, with_key=with_key)),
        "result": json.dumps(answer),
    }
    if not with_key:
        variables["key"] = "null"  # with a key, the script sets it per call
    return variables


def bench_pgbench(
    setup: Setup, args: argparse.Namespace, *, clients: int, with_key: bool, iam_read: bool, label: str
) -> PgbenchRun:
    binary = pgbench_binary()
    assert binary is not None
    reset_runs(setup.pool)
    variables = pgbench_variables(setup, with_key=with_key, gpus=args.gpus, start=dt.datetime.now(dt.UTC))
    defines = [arg for name, value in variables.items() for arg in ("-D", f"{name}={value}")]
    text, names = pgbench_script(with_key=with_key, iam_read=iam_read)
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "admission.sql"
        script.write_text(text)
        command = [binary, "-n", "-M", "prepared", "-r", *defines, "-f", str(script), "-c", str(clients)]
        command += ["-j", str(min(2, clients)), "-T"]
        # A warm-up run first, as the HTTP runs have: the measured run starts on a pool as booked as theirs.
        counted = function_calls()
        if args.warmup > 0:
            subprocess.run([*command, str(args.warmup), URL], capture_output=True, check=False, env=counting_env())
        with connect() as conn:
            row = conn.execute(f"SELECT count(*) FROM \"{base.SCHEMA}\".reservations WHERE state = 'placed'").fetchone()
            before = int(row[0]) if row else 0
        result = subprocess.run(
            [*command, str(args.seconds), URL], capture_output=True, text=True, check=False, env=counting_env()
        )
        placing = placing_since(counted)
    tps = re.search(r"tps = ([0-9.]+)", result.stdout)
    latency = re.search(r"latency average = ([0-9.]+) ms", result.stdout)
    processed = re.search(r"number of transactions actually processed: ([0-9]+)", result.stdout)
    if result.returncode != 0 or tps is None or latency is None or processed is None:
        raise SystemExit(f"pgbench failed:\n{result.stdout}\n{result.stderr}")
    # Per-statement averages (-r): the lines after the \set ones, in script order.
    timed = re.findall(r"^\s+([0-9.]+)\s+[0-9]+\s+(?!\\)\S", result.stdout, flags=re.MULTILINE)
    statements = list(zip(names, (float(t) for t in timed[-len(names) :]), strict=True))
    with connect() as conn:
        row = conn.execute(
            f"SELECT count(*) FILTER (WHERE state = 'placed'), count(*) FILTER (WHERE state NOT IN ('placed', 'draft'))"
            f' FROM "{base.SCHEMA}".reservations'
        ).fetchone()
    assert row is not None
    placed, other = int(row[0]), int(row[1])
    transactions = int(processed.group(1))
    # Each call must have placed its reservation; a client stopped by -T may have placed one more (or left a draft).
    if not transactions <= placed - before <= transactions + clients or other:
        raise SystemExit(f"pgbench: {transactions} calls, {placed} reservations placed, {other} in another state")
    return PgbenchRun(
        label=label,
        clients=clients,
        tps=float(tps.group(1)),
        latency_ms=float(latency.group(1)),
        statements=statements,
        placing=placing,
    )


def pgbench_runs(setup: Setup, args: argparse.Namespace, cap: int) -> list[PgbenchRun]:
    """The baseline (transactions 1 and 2), then what the api really sends (with the IAM's read), one client
    alone, and with ``--with-key`` the key's statements."""
    runs = [
        bench_pgbench(setup, args, clients=cap, with_key=False, iam_read=False, label="tx 1 + tx 2"),
        bench_pgbench(setup, args, clients=cap, with_key=False, iam_read=True, label="tx 1 + IAM read + tx 2"),
        bench_pgbench(setup, args, clients=1, with_key=False, iam_read=True, label="the same, 1 client"),
    ]
    if args.with_key:
        runs.append(
            bench_pgbench(setup, args, clients=cap, with_key=True, iam_read=True, label="with key: + IAM read + finish")
        )
    return runs
