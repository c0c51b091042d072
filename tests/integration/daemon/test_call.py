"""The ``Call`` client against a loopback grpclib server with TLS: outputs come back as objects, refusals as their
envelope's code and reason, and a client certificate held in memory is presented."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpclib.client import Channel
from grpclib.const import Status

import bettercompute_proto as wire
from bettercompute_daemon._agent import DaemonError
from bettercompute_daemon._call import CallError, GatewayUnreachable, call, client_context
from bettercompute_daemon.identity import NodeKey

from ._plane import TRUST_DOMAIN, FakeCa, Running, start, stop

pytestmark = pytest.mark.anyio


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Running]:
    running = await start(tmp_path)
    try:
        yield running
    finally:
        await stop(running)


def channel(plane: Running, **kwargs: str | bytes) -> Channel:
    return Channel("127.0.0.1", plane.port, ssl=client_context(plane.plane.ca.pem, **kwargs))  # type: ignore[arg-type]


async def test_an_output_comes_back_as_an_object(plane: Running) -> None:
    open_channel = channel(plane)
    try:
        assert await call(open_channel, "echo", {"a": [1, "\u00e9"], "b": None}) == {"echo": {"a": [1, "é"], "b": None}}
        stub = wire.NodeStub(open_channel)
        assert await call(stub, "whoami", {}) == {"spiffe_id": None}  # no client certificate
    finally:
        open_channel.close()


async def test_a_refusal_is_its_envelope(plane: Running) -> None:
    open_channel = channel(plane)
    try:
        with pytest.raises(CallError) as raised:
            await call(open_channel, "refuse", {})
        error = raised.value
        assert (error.method, error.status, error.code, error.message, error.reason, error.retryable) == (
            "refuse",
            Status.PERMISSION_DENIED,
            "ACCESS_DENIED",
            "not for you",
            "wrong_role",
            False,
        )
        assert str(error) == "refuse was refused: not for you (ACCESS_DENIED, wrong_role)"
        with pytest.raises(CallError) as raised:  # no envelope: the status stands for the code
            await call(open_channel, "refuse_plainly", {})
        assert (raised.value.code, raised.value.message, raised.value.details) == (
            "UNIMPLEMENTED",
            "no such method",
            {},
        )
        with pytest.raises(DaemonError, match="not a JSON object"):
            await call(open_channel, "not_an_object", {})
    finally:
        open_channel.close()


async def test_a_client_certificate_in_memory_is_presented(plane: Running) -> None:
    key = NodeKey()
    spiffe_id = f"spiffe://{TRUST_DOMAIN}/ramdisk/mach_x"
    certificate = plane.plane.ca.sign_csr(key.csr_pem(), spiffe_id)
    mutual = channel(plane, certificate_pem=certificate, key_pem=key.private_key_pem())
    try:
        assert await call(mutual, "whoami", {}) == {"spiffe_id": spiffe_id}
    finally:
        mutual.close()
    with pytest.raises(ValueError, match="goes with its key"):
        client_context(plane.plane.ca.pem, certificate_pem=certificate)


async def test_a_gateway_not_trusted_is_unreachable(plane: Running) -> None:
    untrusting = Channel("127.0.0.1", plane.port, ssl=client_context(FakeCa.make().pem))
    try:
        with pytest.raises(GatewayUnreachable, match="could not be reached"):
            await call(untrusting, "echo", {}, wait=5)
    finally:
        untrusting.close()
    assert plane.plane.calls == []


async def test_no_answer_is_unreachable(plane: Running) -> None:
    await stop(plane)
    closed = channel(plane)
    try:
        with pytest.raises(GatewayUnreachable):
            await call(closed, "echo", {}, wait=5)
    finally:
        closed.close()
