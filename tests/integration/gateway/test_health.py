"""The gateway's health as a load balancer sees it, asked with the standard stubs of the ``grpcio-health-checking``
package (a client this project did not write) over TLS, without a client certificate: SERVING; NOT_SERVING while
draining, when its sessions are closed with ``draining`` and new ones refused; NOT_SERVING while PostgreSQL cannot
be reached, and SERVING again once it can."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import anyio
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bettercompute_gateway import Gateway, GatewayOptions, create_gateway
from bettercompute_store_pg import PgStore
from tests._timing import deadline

from ..core.test_database_outage import _free_port, proxied_url, tcp_proxy
from .conftest import Wire, gateway_tls, hello, session_request
from .test_gateway import refused, start

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@asynccontextmanager
async def health_stub(port: int, bundle_pem: str) -> AsyncIterator[health_pb2_grpc.HealthStub]:
    credentials = grpc.ssl_channel_credentials(root_certificates=bundle_pem.encode())
    async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
        yield health_pb2_grpc.HealthStub(channel)


async def status(stub: health_pb2_grpc.HealthStub, service: str = "") -> int:
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=deadline(5))
    return int(reply.status)


async def test_serving_then_draining_closes_sessions_and_refuses_new_ones(gw: Wire) -> None:
    joined = await gw.join()
    async with health_stub(gw.port, gw.trust_bundle_pem) as stub:
        assert await status(stub) == SERVING
        assert await status(stub, "bcnode.v1.Node") == SERVING
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await status(stub, "no.such.Service")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == SERVING

        channel = gw.channel(joined)
        try:
            async with session_request(channel) as stream:
                await start(stream, joined.node_id)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(lambda: gw.gateway.drain(period=0.5))
                    with anyio.fail_after(deadline(5)):
                        assert (await watch.read()).status == NOT_SERVING  # Watch hears the change
                    frame = await stream.recv_message()
                    assert frame is not None and frame.close is not None and frame.close.reason == "draining"
                    await stream.end()
        finally:
            channel.close()
        watch.cancel()
        assert await status(stub) == NOT_SERVING
        # A daemon arriving now is told to go elsewhere; the other calls are still answered.
        channel = gw.channel(joined)
        try:
            async with session_request(channel) as stream:
                await stream.send_request()
                await stream.send_message(hello(joined.node_id))
                reason, error = await refused(stream)
            assert reason == "draining" and error.status.name == "UNAVAILABLE"
        finally:
            channel.close()
        assert (await gw.join("SN-0002")).node_id


async def test_not_serving_while_the_database_is_away(gw: Wire, database_url: str) -> None:
    parts = urlsplit(database_url)
    assert parts.hostname and parts.port
    port = _free_port()
    store = PgStore(proxied_url(database_url, port), schema=gw.fleet.store.schema, pool_size=2)
    tls = await gateway_tls(gw.fleet, "gw-proxied")
    options = GatewayOptions(name="gw-proxied", liveness_flush_interval=0.2)
    gateway: Gateway | None = None
    try:
        async with tcp_proxy(port, parts.hostname, parts.port):
            await store.open()
            gateway = create_gateway(gw.fleet.services, store, tls, options)
            listening = await gateway.start("127.0.0.1", 0)
            async with health_stub(listening, tls.trust_bundle_pem) as stub:
                await _until(stub, SERVING)
        # The proxy is gone: every connection to the database is cut and new ones are refused.
        async with health_stub(listening, tls.trust_bundle_pem) as stub:
            await _until(stub, NOT_SERVING)
            async with tcp_proxy(port, parts.hostname, parts.port):
                await _until(stub, SERVING)
    finally:
        if gateway is not None:
            await gateway.close()
        await store.close()


async def _until(stub: health_pb2_grpc.HealthStub, wanted: int) -> None:
    with anyio.fail_after(deadline(20)):
        while await status(stub) != wanted:  # noqa: ASYNC110 - polls the gateway, as a balancer does
            await anyio.sleep(0.1)
