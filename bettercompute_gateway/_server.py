"""grpclib's server as the gateway runs it: its options for thousands of daemons, HTTP/2's stream limit lowered, and
its connections kept so that closing the gateway closes them too."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from grpclib.config import Configuration
from grpclib.protocol import H2Protocol
from grpclib.server import Handler as ConnectionHandler
from grpclib.server import Server
from h2.settings import SettingCodes

from ._options import GatewayOptions

__all__ = ["GatewayServer", "listen"]


class _Tracked(H2Protocol):
    """grpclib's protocol for one connection, which keeps its transport in the server's set while it is open and
    lowers HTTP/2's stream limit. One class for every connection: a class made per connection cost each session a
    type object and its closures (about 2 KB, and more work for the garbage collector)."""

    def __init__(self, *args: Any, transports: set[asyncio.BaseTransport], max_streams: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._transports = transports
        self._max_streams = max_streams
        self.kept: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.kept = transport
        self._transports.add(transport)
        super().connection_made(transport)
        # h2 allows 100 concurrent streams per connection; a daemon needs a few.
        self.connection._connection.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: self._max_streams})
        self.connection.flush()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.kept is not None:
            self._transports.discard(self.kept)
        super().connection_lost(exc)


class GatewayServer(Server):
    """grpclib's server, keeping its connections so that closing the gateway closes them too (grpclib stops
    listening and cancels handlers, but leaves the connections to the clients)."""

    def __init__(self, handlers: list[Any], *, config: Configuration, max_streams: int) -> None:
        super().__init__(handlers, config=config)
        self._transports: set[asyncio.BaseTransport] = set()
        self._max_streams = max_streams

    def _protocol_factory(self) -> H2Protocol:
        # grpclib's own factory (a handler per connection), with the transport kept when the connection is made.
        self.__gc_step__()
        handler = ConnectionHandler(self._mapping, self._codec, self._status_details_codec, self.__dispatch__)
        self._handlers.add(handler)
        return _Tracked(
            handler, self._config, self._h2_config, transports=self._transports, max_streams=self._max_streams
        )

    def drop_connections(self) -> None:
        # Aborted, not closed: a close waits for the write buffer to drain, which a client that stopped reading
        # never lets happen (the socket would outlive the gateway).
        for transport in list(self._transports):
            if isinstance(transport, asyncio.WriteTransport):
                transport.abort()
            else:
                transport.close()
        self._transports.clear()


async def listen(
    handlers: list[Any], options: GatewayOptions, host: str, port: int, context: ssl.SSLContext
) -> tuple[GatewayServer, int]:
    """Serve ``handlers`` (objects with grpclib's ``__mapping__``) on ``host:port`` over TLS; the server, and the
    port it bound (``port`` 0: any free one)."""
    config = Configuration(
        http2_connection_window_size=options.connection_window_bytes,
        http2_stream_window_size=options.stream_window_bytes,
        _keepalive_time=options.keepalive,
        _keepalive_timeout=min(20.0, options.keepalive),
    )
    server = GatewayServer(handlers, config=config, max_streams=options.max_streams_per_connection)
    await server.start(host, port, ssl=context, backlog=options.backlog)
    # grpclib does not say which port it bound. Its listening server is asyncio's, or uvloop's (which is no
    # ``asyncio.Server``): either has ``sockets``.
    sockets = getattr(server._server, "sockets", None) or ()
    return server, int(sockets[0].getsockname()[1]) if sockets else port
