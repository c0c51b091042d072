"""The gateway's ``Call`` RPC (a module's gateway methods, here the bare-metal module's) over real mutual TLS: the
control plane checks the certificate and its role before the module sees the call, and every refusal is the
project's error envelope."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

import bettercompute_proto as wire
from bettercompute_daemon.identity import NodeKey
from bettercompute_metal import MetalModule

from .conftest import Wire, envelope

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@pytest.fixture
def modules() -> Sequence[Any]:
    return [MetalModule()]


async def _call(gw: Wire, method: str, input_json: str, **tls: Any) -> tuple[Status, dict[str, Any]]:
    channel = gw.channel(**tls)
    try:
        await wire.NodeStub(channel).call(wire.CallRequest(method=method, input_json=input_json))
    except GRPCError as error:
        return error.status, envelope(error)
    finally:
        channel.close()
    raise AssertionError(f"{method} was answered")


async def test_calls_are_refused_by_certificate_role_and_input(gw: Wire) -> None:
    joined = await gw.join()
    # No certificate on a method that needs one; a node's certificate on a site's method.
    status, error = await _call(gw, "site.sync", '{"agent": "a"}')
    assert (status, error["code"], error["details"]["reason"]) == (
        Status.UNAUTHENTICATED,
        "UNAUTHENTICATED",
        "no_certificate",
    )
    status, error = await _call(gw, "site.sync", '{"agent": "a"}', joined=joined)
    assert (error["code"], error["details"]["reason"]) == ("ACCESS_DENIED", "role")
    # An unknown method, input that is no JSON object, a NUL inside it.
    status, error = await _call(gw, "site.nope", "{}", joined=joined)
    assert error["code"] == "NOT_FOUND"
    for bad in ("[]", "not json", '{"agent": "a\\u0000"}', '{"agent": 1e999}', '{"agent": NaN}', "[" * 100_000):
        status, error = await _call(gw, "site.sync", bad, joined=joined)
        assert error["code"] == "INVALID_INPUT", bad
    # A malformed site token on the open join: refused without saying more.
    status, error = await _call(gw, "site.join", json.dumps({"token": "bcst_x.y", "csr_pem": NodeKey().csr_pem()}))
    assert (error["code"], error["details"]["reason"]) == ("UNAUTHENTICATED", "invalid_token")


async def test_a_ramdisk_certificate_past_its_two_hours_is_refused(gw: Wire) -> None:
    key = NodeKey()
    ca = gw.fleet.services.joins.ca
    issued = await ca.issue(key.csr_pem(), node_id="mch_0123456789abcdef", role="ramdisk")
    assert issued.not_after - issued.not_before <= dt.timedelta(hours=2, minutes=1)
    tls: dict[str, Any] = {"cert_pem": issued.certificate_pem + issued.chain_pem, "key_pem": key.private_key_pem()}
    # Within its life the control plane takes it (the machine is unknown, so there is nothing to do).
    channel = gw.channel(**tls)
    try:
        reply = await wire.NodeStub(channel).call(wire.CallRequest(method="ramdisk.task", input_json="{}"))
    finally:
        channel.close()
    assert json.loads(reply.output_json)["done"] is True
    gw.fleet.clock.advance(dt.timedelta(hours=2, minutes=2))
    status, error = await _call(gw, "ramdisk.task", "{}", **tls)
    assert (status, error["details"]["reason"]) == (Status.UNAUTHENTICATED, "certificate_expired")
