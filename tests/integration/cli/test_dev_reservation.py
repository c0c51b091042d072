"""Reserving GPUs of ``better-compute dev``'s simulated node as a user does, with the body of the command dev prints,
over HTTP against the real process: the reservation is placed at once, bound once the node acknowledged the desired
state that carries it, active from its start, and ended at its end by the controller, which then takes it out of the
node's desired state again. dev runs on the real clock, so the reservation is short and every wait polls with room
to spare for a loaded machine."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests._timing import deadline

from .conftest import DevPlane, StartCli, dev_with_gateway

IN_SESSION = "A simulated node with 8 fake GPUs is in session: "
DURATION = "PT8S"
"""Long enough for the controller to bind it on its five-second recheck even if the wake-up on the node's
acknowledgement were lost, short enough to watch it end."""
SLACK = 20.0
"""How long past its due time a step may take before the test gives up."""


def _until(
    fetch: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool], within: float, what: str
) -> dict[str, Any]:
    ends = time.monotonic() + deadline(within)
    while not done(seen := fetch()):
        assert time.monotonic() < ends, f"not within {within:.0f} s: {what}; last seen {seen}"
        time.sleep(0.1)
    return seen


def _refused(plane: DevPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The error of a call that must fail."""
    response = httpx.post(
        f"http://127.0.0.1:{plane.port}/api/compute/{path}", headers=plane.headers, json=body, timeout=deadline(10)
    )
    assert response.status_code != 200, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def _allocations(url: str, schema: str, node_id: str) -> dict[str, list[str]]:
    """Reservation id -> GPU UUIDs, as the node's desired state carries them now."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f'SELECT desired_state FROM "{schema}".nodes WHERE id = %s', (node_id,)).fetchone()
    assert row is not None
    return {a["id"]: list(a["gpus"]) for a in row[0].get("allocations") or ()}


def _at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def test_dev_reserves_gpus_of_its_node_which_bind_activate_and_end(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path, database_url: str
) -> None:
    schema = cli_env["BETTERCOMPUTE_SCHEMA"]
    plane = dev_with_gateway(cli_env, start_cli, tmp_path)
    dev, call, root = plane.dev, plane.call, plane.root_tenant
    dev.wait_for(IN_SESSION, timeout=60)
    node_id = dev.stdout.split(IN_SESSION, 1)[1].split(",", 1)[0]

    # The printed command books the node's pool, in the tenant dev's credential belongs to.
    printed = re.search(r"/api/compute/reservations/create -d '(\{[^']*\})'", dev.stdout)
    assert printed is not None, dev.stdout
    body = json.loads(printed[1])
    [pool] = call("pools/list", {"tenant": root})["pools"]
    assert body == {"tenant": root, "pool_id": pool["id"], "gpus": 1, "duration": "PT1H"}

    def node() -> dict[str, Any]:
        return call("nodes/get", {"id": node_id})

    adopted = _until(node, lambda n: n["state"] == "adopted" and not n["desired_state_pending"], 30, "the node adopted")
    before = adopted["desired_generation"]

    # More GPUs than the node has: nothing fits, ever, and the answer says what was weighed.
    error = _refused(plane, "reservations/create", {**body, "gpus": 9})
    assert error["code"] == "NO_CAPACITY", error
    assert error["details"] == {"gpus": 9, "excluded": {"free": 8}, "earliest_start": None}

    created = call("reservations/create", {**body, "gpus": 2, "duration": DURATION})
    reservation_id = created["id"]
    assert created["state"] == "placed" and created["pool_id"] == pool["id"]
    [placed] = created["placement"]
    assert placed["node_id"] == node_id and len(placed["atoms"]) == 2
    end_at = _at(created["end_at"])
    assert end_at - _at(created["start_at"]) == dt.timedelta(seconds=8)
    # Booked now: the two are left out of a request that cannot fit.
    error = _refused(plane, "reservations/create", {**body, "gpus": 9})
    assert error["code"] == "NO_CAPACITY" and error["details"]["excluded"] == {"booked": 2, "free": 6}, error

    def reservation() -> dict[str, Any]:
        return call("reservations/get", {"id": reservation_id})

    _until(reservation, lambda r: r["state"] in ("bound", "active"), SLACK, "the reservation bound")
    active = _until(reservation, lambda r: r["state"] == "active", SLACK, "the reservation active")
    assert [h["state"] for h in active["history"]] == ["placed", "bound", "active"]
    # Bound means acknowledged: the node took a newer desired state, carrying the reservation's GPUs.
    seen = node()
    assert seen["desired_generation"] > before and seen["observed_generation"] > before, seen
    assert _allocations(database_url, schema, node_id) == {reservation_id: placed["atoms"]}
    listed = call("reservations/list", {"tenant": root, "pool_id": pool["id"]})["reservations"]
    assert [(r["id"], r["state"]) for r in listed] == [(reservation_id, "active")]

    # The controller comes back at end_at by itself and ends it.
    left = (end_at - dt.datetime.now(dt.UTC)).total_seconds()
    ended = _until(reservation, lambda r: r["state"] == "ended", max(left, 0) + SLACK, "the reservation ended")
    assert [h["state"] for h in ended["history"]] == ["placed", "bound", "active", "ended"]
    assert ended["reason"] == "end_reached" and _at(ended["history"][-1]["at"]) >= end_at
    # ... and takes it out of the node's desired state, which the node acknowledges.
    _until(
        node,
        lambda n: n["desired_generation"] > seen["desired_generation"] and not n["desired_state_pending"],
        SLACK,
        "the node acknowledged a desired state without the reservation",
    )
    assert _allocations(database_url, schema, node_id) == {}
    listed = call("reservations/list", {"tenant": root, "state": "ended"})["reservations"]
    assert [r["id"] for r in listed] == [reservation_id]

    assert dev.stop() == 0
    assert "Traceback" not in dev.stderr
