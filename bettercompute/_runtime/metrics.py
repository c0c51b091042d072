"""Prometheus metrics: one ``CollectorRegistry`` per control plane, never the process-wide default one.

Several control planes may share a process (the tests run many), so every metric object is made here, per control
plane, and reaches the code that records through the composition (``ModuleContext.metrics``, ``GatewayOptions``),
never through a global. Recording is an in-memory increment or observation; nothing here runs a statement. The
database pool's usage is read when a scrape collects, from counters the store keeps in memory anyway.

Every label is bounded: a registered method's ``group.method``, an error code, a registered work kind, a fixed
outcome. No label ever carries a tenant id, a node id, a key or a path as sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics", "http_method_label"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The text exposition format's content type, as prometheus-client names it (``text/plain; version=...``)."""

# Seconds. HTTP calls are mostly a few milliseconds; a claim's wait ranges from nothing to the poll interval and, when
# workers lag, to minutes; a webhook goes out within a second or so, and its retries back off for hours.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0, 86400.0)

OTHER = "other"
"""The ``method`` label of every request that names no registered method (and is not a fixed path)."""

_FIXED_PATHS = {"/healthz": "healthz", "/readyz": "readyz", "/metrics": "metrics"}


def http_method_label(path: str, endpoint: str, known: Callable[[str, str], bool]) -> str:
    """The bounded ``method`` label of a request path: ``group.method`` when ``known(group, method)`` says it is
    registered, ``healthz``, ``readyz``, ``metrics`` or ``openapi`` for those paths, else ``other``.

    Anything a client can make up collapses into ``other``, so no request can add a series.
    """
    fixed = _FIXED_PATHS.get(path)
    if fixed is not None:
        return fixed
    prefix = endpoint + "/"
    if not path.startswith(prefix):
        return OTHER
    rest = path[len(prefix) :]
    if rest == "openapi.json":
        return "openapi"
    group, slash, name = rest.partition("/")
    if slash and known(group, name):
        return f"{group}.{name}"
    return OTHER


PoolStats = Mapping[str, int]
"""What a store with a pool reports (``pool_stats()``): ``in_use``, ``idle`` and ``max`` connections."""


class _PoolCollector(Collector):
    """``bettercompute_db_pool_connections{state}`` and ``bettercompute_db_pool_max``, read at scrape time from the
    store's in-memory counters (no statement); nothing when the store has no pool or has not been given one."""

    def __init__(self) -> None:
        self.source: Callable[[], PoolStats | None] | None = None

    def collect(self) -> Iterable[Metric]:
        connections = GaugeMetricFamily(
            "bettercompute_db_pool_connections",
            "PostgreSQL connections of this process's pool, by state (in_use: handed out, idle: open and free).",
            labels=["state"],
        )
        maximum = GaugeMetricFamily(
            "bettercompute_db_pool_max", "The most connections this process's pool opens at once."
        )
        stats = None
        if self.source is not None:
            try:
                stats = self.source()
            except Exception:  # a scrape reports what it can; the pool's numbers are only missing this once
                stats = None
        if stats is not None:
            connections.add_metric(["in_use"], stats.get("in_use", 0))
            connections.add_metric(["idle"], stats.get("idle", 0))
            maximum.add_metric([], stats.get("max", 0))
        yield connections
        yield maximum


class Metrics:
    """The metrics of one control plane (``compute.metrics``), in their own registry (``registry``).

    Attributes are the metric objects the parts of the control plane record on; ``render()`` is the exposition.
    """

    def __init__(self) -> None:
        registry = self.registry = CollectorRegistry(auto_describe=True)
        self._api(registry)
        self._workers(registry)
        self._gateway(registry)
        self._sinks(registry)
        self.facts_refused = Counter(
            "bettercompute_node_facts_refused",
            "Facts a node should have signed that the control plane refused where it used them, by fact "
            "(command_result, inventory_section, desired_ack) and reason (unsigned, unknown_signer, revoked_signer, "
            "bad_signature).",
            ["fact", "reason"],
            registry=registry,
        )
        self._pool = _PoolCollector()
        registry.register(self._pool)
        for role in ("shard", "singleton"):
            self.leases_held.labels(role)
            self.leases_acquired.labels(role)
            self.leases_lost.labels(role)

    def _api(self, registry: CollectorRegistry) -> None:
        """The HTTP front's and admission's metrics."""
        self.http_requests = Counter(
            "bettercompute_http_requests",
            "HTTP requests answered, by method (group.method, or healthz/readyz/metrics/openapi/other) and code "
            "(OK or the error code).",
            ["method", "code"],
            registry=registry,
        )
        self.http_duration = Histogram(
            "bettercompute_http_request_duration_seconds",
            "Time from a request's arrival (its body read) to its response being handed to the server.",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.admissions = Counter(
            "bettercompute_admissions",
            "Reservation admissions: placed, no_capacity (reason: the NO_CAPACITY reason code) or quota_exceeded.",
            ["resource", "outcome", "reason"],
            registry=registry,
        )

    def _workers(self, registry: CollectorRegistry) -> None:
        """The work queue's and the leases' metrics."""
        self.queue_depth = Gauge(
            "bettercompute_queue_depth",
            "Work items due and not running (ready and due, or claimed with the claim run out), per kind; sampled "
            "from the database by worker processes every few seconds.",
            ["kind"],
            registry=registry,
        )
        self.queue_claim_duration = Histogram(
            "bettercompute_queue_claim_duration_seconds",
            "How long a claimed work item had been due before this process claimed it (database clock).",
            ["kind"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.queue_claimed = Counter(
            "bettercompute_queue_claimed", "Work items this process claimed, per kind.", ["kind"], registry=registry
        )
        self.leases_held = Gauge(
            "bettercompute_leases_held",
            "Leases this process holds now: shard leases of the sharded roles, singleton leases of jobs.",
            ["kind"],
            registry=registry,
        )
        self.leases_acquired = Counter(
            "bettercompute_leases_acquired", "Leases this process took.", ["kind"], registry=registry
        )
        self.leases_lost = Counter(
            "bettercompute_leases_lost",
            "Leases this process held that could not be renewed (expired, taken over); a release is not a loss.",
            ["kind"],
            registry=registry,
        )

    def _gateway(self, registry: CollectorRegistry) -> None:
        """The gateway's metrics (zero in a process that serves no gateway)."""
        self.gateway_sessions = Gauge(
            "bettercompute_gateway_sessions", "Daemon sessions open on this process's gateway.", registry=registry
        )
        self.gateway_handshakes = Counter(
            "bettercompute_gateway_handshakes",
            "Session handshakes on this process's gateway, by outcome (ok, or the error code that refused it).",
            ["outcome"],
            registry=registry,
        )
        self.gateway_revocations_applied = Counter(
            "bettercompute_gateway_revocations_applied",
            "Certificate revocations this process's gateway applied (sessions it closed for them included).",
            registry=registry,
        )
        self.gateway_tunnels = Gauge(
            "bettercompute_gateway_tunnels", "Tunnels open through this process's gateway.", registry=registry
        )
        self.gateway_tunnel_bytes = Counter(
            "bettercompute_gateway_tunnel_bytes",
            "Bytes carried by this process's gateway's tunnels, by direction (up: client to node; down).",
            ["direction"],
            registry=registry,
        )

    def _sinks(self, registry: CollectorRegistry) -> None:
        """The webhook sender's metrics."""
        self.webhook_delivery_lag = Histogram(
            "bettercompute_webhook_delivery_lag_seconds",
            "From an event's commit to its webhook's successful delivery, retries included.",
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self.webhook_dead_letters = Counter(
            "bettercompute_webhook_dead_letters",
            "Webhook deliveries given up after their last attempt.",
            registry=registry,
        )

    def watch_pool(self, source: Callable[[], PoolStats | None]) -> None:
        """Report the pool's usage from ``source`` (called at each scrape; it must not block)."""
        self._pool.source = source

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)
