"""``better-compute tunnel <resource-id> --port 22 --local 2222``: a local port that reaches a port of a node (or, once
the VPS module has ``instances.tunnel``, of an instance) through the gateway (``docs/tunnels.md``).

It listens on ``127.0.0.1:<local>`` only. Each accepted connection asks the control plane for a fresh tunnel (its
one-time ticket, the gateway's address and the CA bundle that gateway's certificate chains to), opens one ``Tunnel``
stream to that gateway over TLS verified against that bundle (no client certificate: the ticket is the credential),
and carries bytes both ways until either side ends. Ctrl-C stops listening and ends the open tunnels.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError

import bettercompute_proto as wire

__all__ = ["TUNNEL_METHODS", "TunnelError", "carry", "serve_tunnel", "tunnel_call"]

TUNNEL_METHODS: dict[str, tuple[str, str]] = {
    "node_": ("nodes/tunnel", "node_id"),
    "inst_": ("instances/tunnel", "id"),
}
"""The method that opens a tunnel to a resource, by the prefix of its id, and the input field naming it (the VPS
module names an instance ``id`` in its inputs, as ``instances.get`` does). Every such method takes ``port`` too and
answers ``{tunnel_id, ticket, gateway, ca_pem, expires_at}``; a module that adds one adds its prefix here."""
_CHUNK = 64 * 1024  # the most data a tunnel frame carries


class TunnelError(Exception):
    """A tunnel could not be made: one line for the user."""


def tunnel_call(resource_id: str, port: int) -> tuple[str, dict[str, Any]]:
    """The API path and input that open a tunnel to ``port`` of ``resource_id``.

    Raises:
        TunnelError: no method opens tunnels to resources of that kind.
    """
    for prefix, (path, field) in TUNNEL_METHODS.items():
        if resource_id.startswith(prefix):
            return path, {field: resource_id, "port": port}
    kinds = ", ".join(f"{p}..." for p in TUNNEL_METHODS)
    raise TunnelError(f"cannot tunnel to {resource_id!r}: give the id of one of {kinds}")


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise TunnelError(f"the gateway address must be host:port, not {address!r}")
    return host.strip("[]"), int(port)


def _context(ca_pem: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    return context


async def carry(
    opened: Mapping[str, Any],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    gateway: str | None = None,
) -> str:
    """Carry one local connection through the tunnel ``opened`` (a tunnel method's answer) until either side ends;
    why it ended (the gateway's ``close_reason``, or ``client_closed`` when the local side ended first).

    Args:
        gateway: ``host:port`` to dial instead of the answer's (a gateway reached another way from here); its
            certificate is still verified against the answer's ``ca_pem``, for that host name.

    Raises:
        TunnelError: the gateway could not be reached or refused the ticket (with its reason).
    """
    host, port = _split(gateway or str(opened["gateway"]))
    channel = Channel(host, port, ssl=_context(str(opened["ca_pem"])))
    try:
        async with channel.request(
            f"/{wire.SERVICE}/Tunnel", Cardinality.STREAM_STREAM, wire.TunnelFrame, wire.TunnelFrame
        ) as stream:
            await stream.send_request()
            await stream.send_message(wire.TunnelFrame(ticket=str(opened["ticket"])))
            reason = await _pump(stream, reader, writer)
            with contextlib.suppress(Exception):
                await stream.end()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    while await stream.recv_message() is not None:
                        pass
            try:
                await stream.recv_trailing_metadata()
            except GRPCError as exc:
                raise TunnelError(f"the gateway refused the tunnel: {_refusal(exc)}") from None
            return reason
    except (OSError, ssl.SSLError, StreamTerminatedError, TimeoutError) as exc:
        raise TunnelError(f"the gateway {host}:{port} could not be reached ({type(exc).__name__})") from None
    finally:
        channel.close()


async def _pump(stream: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    async def outward() -> str:  # the local connection -> the gateway
        while data := await reader.read(_CHUNK):
            await stream.send_message(wire.TunnelFrame(data=data))
        await stream.send_message(wire.TunnelFrame(close_reason="client_closed"))
        return "client_closed"

    async def inward() -> str:  # the gateway -> the local connection
        while (frame := await stream.recv_message()) is not None:
            if frame.close_reason:
                return str(frame.close_reason)
            if frame.data:
                writer.write(frame.data)
                await writer.drain()
        return "gateway_ended"

    sending = asyncio.create_task(outward())
    receiving = asyncio.create_task(inward())
    try:
        done, _ = await asyncio.wait({sending, receiving}, return_when=asyncio.FIRST_COMPLETED)
        if receiving in done:
            sending.cancel()
            return receiving.result() if not receiving.exception() else "gateway_ended"
        with contextlib.suppress(Exception):  # the gateway answers our close with its own
            async with asyncio.timeout(2.0):
                return await receiving
        return "client_closed"
    finally:
        for task in (sending, receiving):
            task.cancel()
        await asyncio.gather(sending, receiving, return_exceptions=True)


def _refusal(error: GRPCError) -> str:
    try:
        body = json.loads(error.message or "")["error"]
        reason = body.get("details", {}).get("reason")
        return f"{body['message']} ({body['code']}{', ' + reason if reason else ''})"
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"{error.status.name}: {error.message or 'no message'}"


async def serve_tunnel(
    ask: Callable[[], Awaitable[Mapping[str, Any]]],
    *,
    local_port: int,
    gateway: str | None = None,
    ready: Callable[[int], None] = lambda port: None,
    report: Callable[[str], None] = lambda line: None,
) -> None:
    """Listen on ``127.0.0.1:<local_port>`` (``0``: any free port, given to ``ready``) until cancelled; each
    connection asks for a fresh tunnel (``ask``: the tunnel method's answer) and is carried through it.

    Raises:
        OSError: the local port cannot be listened on.
    """
    open_connections: set[asyncio.Task[None]] = set()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            open_connections.add(task)
        try:
            opened = await ask()
            reason = await carry(opened, reader, writer, gateway=gateway)
            report(f"tunnel {opened.get('tunnel_id')} closed: {reason}")
        except TunnelError as exc:
            report(str(exc))
        except Exception as exc:  # an answer refused by the control plane, and the like: one line, go on listening
            report(f"no tunnel: {exc}")
        finally:
            writer.close()
            if task is not None:
                open_connections.discard(task)

    server = await asyncio.start_server(one, "127.0.0.1", local_port)
    try:
        ready(int(server.sockets[0].getsockname()[1]))
        await asyncio.Event().wait()
    finally:
        server.close()
        for task in list(open_connections):
            task.cancel()
        await asyncio.gather(*open_connections, return_exceptions=True)
