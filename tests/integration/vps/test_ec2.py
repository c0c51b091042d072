"""The EC2 adapter against moto's server (a real process on loopback): the life of a VM, idempotent launch under
throttling and lost answers, and how failures reach the workflow."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import anyio
import pytest

from bettercompute_vps import (
    CLIENT_TOKEN_TAG,
    PROVIDER_AUTH_FAILED,
    PROVIDER_IMAGE_NOT_FOUND,
    PROVIDER_INVALID,
    PROVIDER_NOT_FOUND,
    PROVIDER_THROTTLED,
    PROVIDER_UNAVAILABLE,
    Ec2Adapter,
    LaunchRequest,
    ProviderError,
    ProviderInstance,
    compose_user_data,
)
from tests._timing import deadline

from ._moto import SECRET_ACCESS_KEY, MotoServer, free_port, start_moto
from .conftest import ec2_adapter

pytestmark = pytest.mark.anyio

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0ZXN0a2V5YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE platform@bc"
UNKNOWN_ID = "i-0123456789abcdef0"


TOKEN = "inst_01-launch-1"


def _request(image: str, token: str = TOKEN, instance_type: str = "t3.micro") -> LaunchRequest:
    return LaunchRequest(
        client_token=token,
        instance_type=instance_type,
        image=image,
        user_data=compose_user_data("#!/bin/sh\necho hi\n", [KEY], "vm-1"),
        name="vm-1",
        tags={"bettercompute:instance": "inst_01", "bettercompute:tenant": "ten_01"},
    )


async def _wait_for(adapter: Ec2Adapter, provider_id: str, state: str) -> ProviderInstance:
    with anyio.fail_after(deadline(20)):
        while True:
            current = await adapter.describe(provider_id)
            if current is not None and current.state == state:
                return current
            await anyio.sleep(0.1)


async def test_a_vm_lives_launch_stop_resize_start_terminate(ec2: Ec2Adapter, moto_ami: str) -> None:
    launched = await ec2.launch(_request(moto_ami))
    assert re.fullmatch(r"i-[0-9a-f]+", launched.id)
    assert launched.instance_type == "t3.micro"
    assert launched.client_token == "inst_01-launch-1"

    running = await _wait_for(ec2, launched.id, "running")
    assert running.private_ip is not None and running.public_ip is not None

    with pytest.raises(ProviderError) as caught:
        await ec2.resize(launched.id, "t3.large")
    assert caught.value.code == PROVIDER_INVALID and "stopped" in caught.value.message

    await ec2.stop(launched.id)
    await _wait_for(ec2, launched.id, "stopped")
    await ec2.stop(launched.id)  # stopping a stopped VM is fine
    await ec2.resize(launched.id, "t3.large")
    await ec2.start(launched.id)
    started = await _wait_for(ec2, launched.id, "running")
    assert started.instance_type == "t3.large"
    assert started.private_ip == running.private_ip

    await ec2.terminate(launched.id)
    await _wait_for(ec2, launched.id, "terminated")
    await ec2.terminate(launched.id)  # again: a no-op


async def test_the_user_data_and_tags_reach_the_vm(ec2: Ec2Adapter, moto_ami: str, moto_ec2_server: MotoServer) -> None:
    request = _request(moto_ami)
    launched = await ec2.launch(request)
    client = moto_ec2_server.ec2_client()
    try:
        attribute = client.describe_instance_attribute(InstanceId=launched.id, Attribute="userData")
        described = client.describe_instances(InstanceIds=[launched.id])["Reservations"][0]["Instances"][0]
    finally:
        client.close()
    assert base64.b64decode(attribute["UserData"]["Value"]).decode() == request.user_data
    tags = {tag["Key"]: tag["Value"] for tag in described.get("Tags", [])}
    assert tags == {
        "Name": "vm-1",
        CLIENT_TOKEN_TAG: "inst_01-launch-1",
        "bettercompute:instance": "inst_01",
        "bettercompute:tenant": "ten_01",
    }


async def test_unknown_ids_describe_as_none_and_terminate_as_nothing(ec2: Ec2Adapter) -> None:
    assert await ec2.describe(UNKNOWN_ID) is None
    assert await ec2.find("never-used") is None
    await ec2.terminate(UNKNOWN_ID)
    for call in (ec2.start, ec2.stop):
        with pytest.raises(ProviderError) as caught:
            await call(UNKNOWN_ID)
        assert caught.value.code == PROVIDER_NOT_FOUND
        assert caught.value.provider_code == "InvalidInstanceID.NotFound"
        assert not caught.value.retryable
    with pytest.raises(ProviderError) as caught:
        await ec2.describe("not-an-id")
    assert caught.value.code == PROVIDER_INVALID


async def test_a_retried_launch_with_the_same_token_gives_the_same_vm(
    ec2: Ec2Adapter, moto_ami: str, moto_ec2_server: MotoServer
) -> None:
    first = await ec2.launch(_request(moto_ami))
    again = await ec2.launch(_request(moto_ami))
    assert again.id == first.id
    found = await ec2.find("inst_01-launch-1")
    assert found is not None and found.id == again.id
    assert moto_ec2_server.instance_count() == 1
    other = await ec2.launch(_request(moto_ami, token="inst_01-launch-2"))
    assert other.id != first.id
    assert moto_ec2_server.instance_count() == 2


async def test_a_terminated_vm_is_still_the_answer_for_its_token(ec2: Ec2Adapter, moto_ami: str) -> None:
    first = await ec2.launch(_request(moto_ami))
    await ec2.terminate(first.id)
    again = await ec2.launch(_request(moto_ami))
    assert again.id == first.id
    assert again.state in ("shutting-down", "terminated")


async def test_an_unknown_image_is_image_not_found(ec2: Ec2Adapter, moto_ec2: str, moto_ec2_server: MotoServer) -> None:
    with pytest.raises(ProviderError) as caught:
        await ec2.launch(_request("ami-0123456789abcdef0"))
    assert caught.value.code == PROVIDER_IMAGE_NOT_FOUND
    assert caught.value.provider_code is not None and caught.value.provider_code.startswith("InvalidAMIID.")
    assert not caught.value.retryable
    assert moto_ec2_server.instance_count() == 0


async def test_wrong_credentials_are_auth_failed_and_the_secret_is_never_shown(
    tmp_path: Path, moto_ec2_server: MotoServer
) -> None:
    # A server of its own: this one checks every signature, and knows no access key at all.
    server = start_moto(tmp_path / "moto-auth.log", env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        adapter = ec2_adapter(server.url)
        try:
            for call in (adapter.describe(UNKNOWN_ID), adapter.launch(_request(moto_ec2_server.usable_ami()))):
                with pytest.raises(ProviderError) as caught:
                    await call
                assert caught.value.code == PROVIDER_AUTH_FAILED
                assert caught.value.provider_code == "AuthFailure"
                assert not caught.value.retryable
                for text in (caught.value.message, str(caught.value), repr(caught.value), repr(adapter)):
                    assert SECRET_ACCESS_KEY not in text
        finally:
            await adapter.aclose()
    finally:
        server.stop()
    assert SECRET_ACCESS_KEY not in server.log_file.read_text()


async def test_no_server_is_unavailable_and_retryable() -> None:
    adapter = ec2_adapter(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(ProviderError) as caught:
            await adapter.describe(UNKNOWN_ID)
    finally:
        await adapter.aclose()
    assert caught.value.code == PROVIDER_UNAVAILABLE and caught.value.retryable
    assert SECRET_ACCESS_KEY not in caught.value.message


# -- a faulty network in front of moto ---------------------------------------------------------------------------

THROTTLED_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code>'
    b"<Message>Request limit exceeded.</Message></Error></Errors>"
    b"<RequestID>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</RequestID></Response>"
)

Fault = Literal["throttle", "drop", "hold"]


class FaultyProxy:
    """An HTTP proxy in front of moto, one request per connection, that spoils the first RunInstances.

    ``throttle``: answers it 503 with EC2's ``RequestLimitExceeded`` error, moto never sees it. ``drop``: forwards it,
    reads moto's answer (the VM now exists), and closes the client's connection without a byte of it. ``hold``:
    forwards it, reads moto's answer, sets ``held`` and sits on the answer until ``release()`` (then sends it) or
    until the client goes away (then sets ``client_gone``): a call in flight for as long as a test needs.
    """

    def __init__(self, upstream: str, fault: Fault) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.fault = fault
        self.run_instances_seen = 0
        self.held = asyncio.Event()
        self.client_gone = asyncio.Event()
        self._released = asyncio.Event()

    def release(self) -> None:
        """Let a held answer go (and any later one: only the first RunInstances is ever held)."""
        self._released.set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            body = await reader.readexactly(int(length.group(1)) if length else 0)
            spoil = b"Action=RunInstances" in body and self.run_instances_seen == 0
            if b"Action=RunInstances" in body:
                self.run_instances_seen += 1
            if spoil and self.fault == "throttle":
                writer.write(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/xml;charset=UTF-8\r\n"
                    + f"Content-Length: {len(THROTTLED_BODY)}\r\nConnection: close\r\n\r\n".encode()
                    + THROTTLED_BODY
                )
                await writer.drain()
                return
            answer = await self._forward(head, body)
            if spoil and self.fault == "drop":  # moto has done the launch, the client hears nothing
                writer.transport.abort()
                return
            if spoil and not await self._hold(reader):
                return
            writer.write(answer)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _hold(self, reader: asyncio.StreamReader) -> bool:
        """Wait for ``release()`` (``True``: answer now) or for the client to close its connection (``False``)."""
        self.held.set()

        async def until_gone() -> None:
            # The client sent its one request and only reads from now on: a read ends only when it goes away.
            with contextlib.suppress(ConnectionError):
                await reader.read(1)

        gone = asyncio.ensure_future(until_gone())
        released = asyncio.ensure_future(self._released.wait())
        try:
            await asyncio.wait({gone, released}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (gone, released):
                task.cancel()
        if released.done() and not released.cancelled():
            return True
        self.client_gone.set()
        return False

    async def _forward(self, head: bytes, body: bytes) -> bytes:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        try:
            lines = [line for line in head.split(b"\r\n") if line and not line.lower().startswith(b"connection:")]
            upstream_writer.write(b"\r\n".join([*lines, b"Connection: close", b"", b""]) + body)
            await upstream_writer.drain()
            answer = await upstream_reader.read()
        finally:
            upstream_writer.close()
        answer_head, _, answer_body = answer.partition(b"\r\n\r\n")
        lines = [line for line in answer_head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
        return b"\r\n".join([*lines, b"Connection: close", b"", b""]) + answer_body


@contextlib.asynccontextmanager
async def faulty_proxy(upstream: str, fault: Fault) -> AsyncIterator[tuple[str, FaultyProxy]]:
    proxy = FaultyProxy(upstream, fault)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", proxy
    finally:
        proxy.release()  # a held answer must not keep its connection open past the test
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("fault", "code", "launched_before_retry"),
    [("throttle", PROVIDER_THROTTLED, 0), ("drop", PROVIDER_UNAVAILABLE, 1)],
)
async def test_a_failed_launch_retried_with_its_token_makes_exactly_one_vm(
    moto_ec2: str, moto_ami: str, moto_ec2_server: MotoServer, fault: Fault, code: str, launched_before_retry: int
) -> None:
    async with faulty_proxy(moto_ec2, fault) as (url, proxy):
        adapter = ec2_adapter(url, read_timeout=10)
        try:
            with pytest.raises(ProviderError) as caught:
                await adapter.launch(_request(moto_ami))
            assert caught.value.code == code
            assert caught.value.retryable
            if fault == "throttle":
                assert caught.value.provider_code == "RequestLimitExceeded"
                assert caught.value.status == 503
            assert moto_ec2_server.instance_count() == launched_before_retry

            retried = await adapter.launch(_request(moto_ami))
            assert moto_ec2_server.instance_count() == 1
            found = await adapter.find("inst_01-launch-1")
            assert found is not None and found.id == retried.id
            # After a lost answer the retry found the VM by its token and did not ask EC2 for another one.
            assert proxy.run_instances_seen == (1 if fault == "drop" else 2)
        finally:
            await adapter.aclose()
