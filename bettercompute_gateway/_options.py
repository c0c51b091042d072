"""How a gateway runs: ``GatewayOptions``."""

from __future__ import annotations

import attrs

from ._tunnels import TunnelOptions

__all__ = ["GatewayOptions"]


@attrs.frozen(kw_only=True)
class GatewayOptions:
    """How a gateway runs. grpclib's own defaults are unsafe for thousands of daemons (no message size limit, 4 MiB
    windows per connection and stream, a listen backlog of 100, keepalive after two hours), so each is set here.

    Args:
        name: This gateway's name (sessions record which gateway holds them).
        heartbeat_interval: How often daemons beat (sent in ``Welcome``); three intervals of silence end a session.
        liveness_flush_interval: How often liveness is written (one statement for all sessions heard from).
        hello_timeout: How long a new session may take to send ``Hello``.
        send_timeout: How long a frame may wait for a slow daemon to read before its session is closed (``slow``).
        max_message_bytes: The largest message taken (its length prefix is checked before it is read).
        connection_window_bytes: HTTP/2 flow-control window per connection.
        stream_window_bytes: HTTP/2 flow-control window per stream.
        backlog: The listen backlog (a reconnect storm arrives at once).
        keepalive: How often the gateway pings an idle connection (and drops one that does not answer).
        max_streams_per_connection: How many calls one connection may have open at once (HTTP/2's
            ``MAX_CONCURRENT_STREAMS``; h2's default is 100); more are refused by HTTP/2 itself.
        drain_period: Over how long ``drain`` spreads the closing of its sessions, so that the daemons reconnect
            elsewhere a few at a time rather than all at once.
        desired_sweep_interval: How often every session's desired-state generation is compared with the nodes' (a
            backstop; changes are otherwise read each flush, and at once on a notifier poke).
        gc_young_threshold: When the gateway starts, the process's first garbage-collector threshold is raised to
            at least this (a setting of the whole process; ``None`` leaves it). With Python's 700, the flush loop's
            lists of every session set off young collections that moved them to the old generation, whose full
            collections (over about 170 objects a session, every 30 s or so) took 11 of the gateway's 42 % of a core
            at 15,000 sessions (``bench/gateway.py``).
        tunnels: The limits on tunnels (``TunnelOptions``: streams and bandwidth per tenant, the node's time to
            answer, how often open tunnels are re-checked).
    """

    name: str = "gateway"
    heartbeat_interval: float = 10.0
    liveness_flush_interval: float = 1.0
    hello_timeout: float = 10.0
    send_timeout: float = 10.0
    max_message_bytes: int = 1024 * 1024
    connection_window_bytes: int = 1024 * 1024
    stream_window_bytes: int = 256 * 1024
    backlog: int = 4096
    keepalive: float = 60.0
    max_streams_per_connection: int = 8
    drain_period: float = 30.0
    desired_sweep_interval: float = 60.0
    gc_young_threshold: int | None = 50_000
    tunnels: TunnelOptions = attrs.field(factory=TunnelOptions)
