"""``serve`` processes with ``lease_ttl_seconds`` and the LISTEN/NOTIFY notifier, observed in the database.

A worker process LISTENs on its schema's ``work`` channel over a connection of its own; PostgreSQL shows that
connection in ``pg_stat_activity`` with ``LISTEN "<schema>.work"`` as its last statement. Shard cycles run every
third of the lease TTL (with jitter down to 80 % of it), unless a notifier poke wakes them sooner: the takeover test
uses that gap to tell a poke from a poll.
"""

from __future__ import annotations

import datetime as dt
import signal
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from bettercompute._runtime.shards import SHARDS
from tests._timing import deadline

from .conftest import Running, StartCli, free_port, run_cli

pytestmark = pytest.mark.pg

EVERY = set(range(SHARDS))


def _query(url: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _shards(url: str, schema: str) -> dict[str, set[int]]:
    """Holder -> the controllers shards whose live lease it holds."""
    rows = _query(
        url,
        f"""SELECT holder, name FROM "{schema}".leases
        WHERE name LIKE 'controllers/shard:%%' AND expires_at > now()""",
    )
    held: dict[str, set[int]] = {}
    for holder, name in rows:
        held.setdefault(str(holder), set()).add(int(str(name).rpartition(":")[2]))
    return held


def _worker(url: str, schema: str, instance: str) -> tuple[str, dt.datetime] | None:
    """The live membership row of ``instance``: its worker id and when it expires."""
    rows = _query(
        url,
        f'SELECT id, max(expires_at) FROM "{schema}".workers WHERE instance = %s AND expires_at > now() GROUP BY id',
        instance,
    )
    if not rows:
        return None
    worker_id, expires_at = rows[0]
    assert isinstance(expires_at, dt.datetime)
    return str(worker_id), expires_at


def _listeners(url: str, schema: str, application_name: str | None = None) -> int:
    """Connections whose last statement was LISTEN on the schema's work channel (of ``application_name``)."""
    sql = """SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND query = 'LISTEN ' || quote_ident(%s || '.work')"""
    params: list[object] = [schema]
    if application_name is not None:
        sql += " AND application_name = %s"
        params.append(application_name)
    [(count,)] = _query(url, sql, *params)
    assert isinstance(count, int)
    return count


def _wait(predicate: Callable[[], bool], within: float, what: str, *processes: Running) -> None:
    ends = time.monotonic() + deadline(within)
    while not predicate():
        for running in processes:
            code = running.process.poll()
            assert code is None, f"exited {code} while waiting for {what}:\n{running.stderr}"
        assert time.monotonic() < ends, f"not within {within} s: {what}"
        time.sleep(0.05)


def _serve(env: dict[str, str], start_cli: StartCli, instance: str, *args: str) -> Running:
    running = start_cli(
        {**env, "BETTERCOMPUTE_INSTANCE": instance},
        *args,
        "serve",
        "--roles",
        "controllers",
        "--no-migrate",
        "--port",
        str(free_port()),
    )
    running.wait_for("running controllers", in_stderr=True)
    return running


def _stop(running: Running) -> None:
    assert running.stop(signal.SIGTERM) == 0, running.stderr
    assert "Traceback" not in running.stderr


def _migrate(env: dict[str, str]) -> None:
    migrated = run_cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr


def test_lease_ttl_seconds_sets_how_far_ahead_leases_and_membership_expire(
    cli_env: dict[str, str], database_url: str, start_cli: StartCli, tmp_path: Path
) -> None:
    url, schema = database_url, cli_env["BETTERCOMPUTE_SCHEMA"]
    _migrate(cli_env)
    config = tmp_path / "bettercompute.toml"
    config.write_text("lease_ttl_seconds = 3\n")
    worker = _serve(cli_env, start_cli, "ttl-3", "--config", str(config))
    _wait(lambda: _worker(url, schema, "ttl-3") is not None, 30, "a membership row", worker)
    found = _worker(url, schema, "ttl-3")
    assert found is not None
    worker_id = found[0]
    _wait(lambda: _shards(url, schema) == {worker_id: EVERY}, 30, "every shard held", worker)

    # Every lease and the membership row expire at most 3 s ahead (the default TTL is 15 s).
    [(soonest, latest, first_expiry)] = _query(
        url,
        f"""SELECT min(expires_at - now()), max(expires_at - now()), max(expires_at) FROM "{schema}".leases
        WHERE holder = %s""",
        worker_id,
    )
    assert isinstance(soonest, dt.timedelta) and isinstance(latest, dt.timedelta)
    assert dt.timedelta(0) < soonest <= latest <= dt.timedelta(seconds=3)
    [(row_ahead,)] = _query(url, f'SELECT max(expires_at - now()) FROM "{schema}".workers WHERE id = %s', worker_id)
    assert isinstance(row_ahead, dt.timedelta)
    assert dt.timedelta(0) < row_ahead <= dt.timedelta(seconds=3)

    # Renewed every third of it: past the first expiry, the same worker still holds every shard, renewed.
    assert isinstance(first_expiry, dt.datetime)

    def renewed_past_first_expiry() -> bool:
        [(now, oldest)] = _query(
            url, f'SELECT now(), min(expires_at) FROM "{schema}".leases WHERE holder = %s', worker_id
        )
        assert isinstance(now, dt.datetime)
        return now > first_expiry and isinstance(oldest, dt.datetime) and oldest > first_expiry

    _wait(renewed_past_first_expiry, 20, "the leases renewed past their first expiry", worker)
    _wait(lambda: _shards(url, schema) == {worker_id: EVERY}, 10, "every shard still held", worker)
    _stop(worker)


def test_a_worker_leaving_pokes_the_other_to_take_its_shards_before_its_next_cycle(
    cli_env: dict[str, str], database_url: str, start_cli: StartCli
) -> None:
    # Lease TTL 90 s: a shard cycle every 30 s, and never sooner than 24 s after the last one unless a poke comes.
    url, schema = database_url, cli_env["BETTERCOMPUTE_SCHEMA"]
    env = {**cli_env, "BETTERCOMPUTE_LEASE_TTL_SECONDS": "90"}
    _migrate(env)
    first = _serve(env, start_cli, "poke-a")
    _wait(lambda: _worker(url, schema, "poke-a") is not None, 30, "the first membership row", first)
    found = _worker(url, schema, "poke-a")
    assert found is not None
    first_id = found[0]
    _wait(lambda: _shards(url, schema) == {first_id: EVERY}, 30, "every shard held by the first worker", first)
    _wait(lambda: _listeners(url, schema) == 1, 30, "the first worker listening", first)

    second = _serve(env, start_cli, "poke-b")
    # The second worker has joined (its first shard cycle ran, taking no shard: the first one held them all) and
    # listens for pokes.
    _wait(lambda: _worker(url, schema, "poke-b") is not None, 30, "the second membership row", first, second)
    _wait(lambda: _listeners(url, schema) == 2, 30, "the second worker listening", first, second)
    found = _worker(url, schema, "poke-b")
    assert found is not None
    second_id, joined_expiry = found  # its last shard cycle ran at joined_expiry - 90 s

    _stop(first)  # it hands its shards back, leaves, then pokes
    _wait(lambda: _shards(url, schema) == {second_id: EVERY}, 40, "every shard held by the second worker", second)
    [(taken_expiry,)] = _query(url, f'SELECT max(expires_at) FROM "{schema}".leases WHERE holder = %s', second_id)
    assert isinstance(taken_expiry, dt.datetime)
    # The shards were taken in a cycle that ran well before the earliest one the TTL schedules (24 s): a poke woke it.
    assert taken_expiry - joined_expiry < dt.timedelta(seconds=15), (taken_expiry, joined_expiry)
    _stop(second)


def test_behind_pgbouncer_the_notifier_listens_only_over_notify_url(
    cli_env: dict[str, str], database_url: str, start_cli: StartCli
) -> None:
    # PgBouncer itself is not needed to see which connection LISTENs: the direct URL is marked by its
    # application_name, and the database URL (which pgbouncer = true says is pooled) is the plain one.
    url, schema = database_url, cli_env["BETTERCOMPUTE_SCHEMA"]
    _migrate(cli_env)
    pooled = {**cli_env, "BETTERCOMPUTE_PGBOUNCER": "true"}

    polling = _serve(pooled, start_cli, "pooled")
    _wait(lambda: _worker(url, schema, "pooled") is not None, 30, "a membership row", polling)
    assert "notify_url is not set: no LISTEN/NOTIFY" in polling.stderr
    assert "polling" in polling.stderr
    time.sleep(1)  # the listener would have connected by now
    assert _listeners(url, schema) == 0
    _stop(polling)

    marker = f"notify_{schema}"
    parts = urlsplit(url)
    query = "&".join(q for q in (parts.query, f"application_name={marker}") if q)
    direct = urlunsplit(parts._replace(query=query))
    poked = _serve({**pooled, "BETTERCOMPUTE_NOTIFY_URL": direct}, start_cli, "direct")
    _wait(lambda: _listeners(url, schema, marker) == 1, 30, "a LISTEN over notify_url", poked)
    assert "woken by LISTEN/NOTIFY pokes over notify_url" in poked.stderr
    _stop(poked)
    _wait(lambda: _listeners(url, schema) == 0, 10, "the listening connection closed")
