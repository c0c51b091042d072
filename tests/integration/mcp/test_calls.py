"""Tool calls an agent gets wrong or repeats: a retry with the same idempotency key acts once, and arguments that do
not fit the schema (or a tool that does not exist) answer an error envelope with the right code, never a trace."""

from __future__ import annotations

from typing import Any

import mcp
import pytest

from bettercompute_cli._mcp import ComputeMcp, InProcess

from .conftest import Fleet, envelope

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_the_same_idempotency_key_twice_creates_one_object(fleet: Fleet, database_url: str) -> None:
    t = fleet.t
    reserve = {"tenant": t.acme, "pool_id": fleet.pool, "gpus": 1, "duration": "PT1H", "idempotency_key": "rsv-1"}
    pool = {"tenant": t.acme, "name": "cpus", "idempotency_key": "pool-1"}  # the key is the tool's own argument
    async with mcp.Client(ComputeMcp(InProcess(t.compute), credential=t.alice)) as alice:
        first = envelope(await alice.call_tool("reservations_create", reserve))["data"]
        again = envelope(await alice.call_tool("reservations_create", reserve))["data"]
        made = envelope(await alice.call_tool("pools_create", pool))["data"]
        replayed = envelope(await alice.call_tool("pools_create", pool))["data"]
        other = envelope(await alice.call_tool("pools_create", {**pool, "name": "other"}))
    assert again["id"] == first["id"] and replayed == made
    assert other["error"]["code"] == "CONFLICT"  # the same key with other arguments
    assert fleet.rows(database_url, "SELECT count(*) FROM {s}.reservations") == [(1,)]
    assert fleet.rows(database_url, "SELECT count(*) FROM {s}.pools WHERE name IN ('cpus', 'other')") == [(1,)]
    audited = fleet.rows(database_url, "SELECT count(*) FROM {s}.audit WHERE action = 'compute:pools:create'")
    assert audited == [(2,)]  # the fixture's pool and this one


@pytest.mark.parametrize(
    ("tool", "arguments", "code"),
    [
        ("pools_create", {"tenant": "{acme}", "name": 7}, "INVALID_INPUT"),
        ("pools_create", {"tenant": "{acme}", "name": "a\x00b"}, "INVALID_INPUT"),
        ("pools_create", {"tenant": "{acme}"}, "INVALID_INPUT"),  # no name
        ("pools_create", {"tenant": "{acme}", "name": "x", "colour": "red"}, "INVALID_INPUT"),
        ("pools_create", {"tenant": "{acme}", "name": "x", "idempotency_key": "has a space"}, "INVALID_INPUT"),
        ("pools_create", {"tenant": "{acme}", "name": "x", "idempotency_key": 12}, "INVALID_INPUT"),
        ("pools_list", {"tenant": "{acme}", "idempotency_key": "k"}, "INVALID_INPUT"),  # reads take no key
        (
            "reservations_create",
            {"tenant": "{acme}", "pool_id": "{pool}", "gpus": "two", "duration": "PT1H"},
            "INVALID_INPUT",
        ),
        (
            "reservations_create",
            {"tenant": "{acme}", "pool_id": "{pool}", "gpus": 1, "duration": [{"a": None}]},
            "INVALID_INPUT",
        ),
        ("pools_get", {"id": "pool_nope"}, "NOT_FOUND"),
        ("pools_drop", {"id": "x"}, "NOT_FOUND"),  # no such tool
        ("pools/create", {}, "NOT_FOUND"),
        ("x" * 5000, {}, "NOT_FOUND"),
    ],
)
async def test_arguments_that_do_not_fit_answer_an_envelope(
    fleet: Fleet, database_url: str, tool: str, arguments: dict[str, Any], code: str
) -> None:
    fill = {"{acme}": fleet.t.acme, "{pool}": fleet.pool}
    given = {k: fill.get(v, v) if isinstance(v, str) else v for k, v in arguments.items()}
    async with mcp.Client(ComputeMcp(InProcess(fleet.t.compute), credential=fleet.t.alice)) as alice:
        result = await alice.call_tool(tool, given)
    answer = envelope(result)
    assert result.is_error and answer["error"]["code"] == code, answer
    assert set(answer["error"]) == {"code", "message", "details", "retryable"}
    assert "Traceback" not in answer["error"]["message"] and "SELECT" not in answer["error"]["message"]
    assert len(answer["error"]["message"]) < 400  # an unknown tool's name is not echoed whole
    assert fleet.rows(database_url, "SELECT count(*) FROM {s}.pools") == [(1,)]  # nothing was made


async def test_a_bad_or_missing_credential_is_unauthenticated(fleet: Fleet) -> None:
    for credential in (None, "bcak_nope.nope"):
        async with mcp.Client(ComputeMcp(InProcess(fleet.t.compute), credential=credential)) as stranger:
            answer = envelope(await stranger.call_tool("pools_list", {"tenant": fleet.t.acme}))
        assert answer["error"]["code"] == "UNAUTHENTICATED"
