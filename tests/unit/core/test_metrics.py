"""``/metrics`` and the HTTP request metrics, through ``httpx.ASGITransport`` (no server, no database), and the small
pieces of logic that keep the metrics' labels bounded."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bettercompute import BetterCompute
from bettercompute._runtime.http import Request, Response, error_response, response_code
from bettercompute._runtime.metrics import Metrics, http_method_label
from bettercompute.errors import NotFoundError, UnavailableError
from bettercompute.modules.reservations._service import no_capacity_reason
from bettercompute.modules.webhooks._service import committed_at, event_body

from ._echo import EchoModule
from .conftest import MEMBER, ROOT, make_compute

URL = "/api/compute"


@pytest.fixture
def compute() -> BetterCompute:
    return make_compute(modules=[EchoModule()])


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _requests(compute: BetterCompute, method: str, code: str) -> float:
    value = compute.metrics.registry.get_sample_value(
        "bettercompute_http_requests_total", {"method": method, "code": code}
    )
    return value or 0.0


@pytest.mark.anyio
async def test_requests_are_counted_by_method_and_code_and_metrics_serves_them(
    compute: BetterCompute, http: httpx.AsyncClient
) -> None:
    auth = {"authorization": f"Bearer {MEMBER}"}
    assert (await http.post(f"{URL}/echo/say", headers=auth, json={"tenant": "acme", "text": "hi"})).status_code == 200
    assert (await http.post(f"{URL}/echo/say", headers=auth, json={"tenant": "evil", "text": "x"})).status_code == 403
    assert (await http.post(f"{URL}/echo/say", json={"tenant": "acme", "text": "x"})).status_code == 401
    assert (
        await http.post(f"{URL}/echo/fail", headers={"authorization": f"Bearer {ROOT}"}, json={})
    ).status_code == 500
    assert (await http.post(f"{URL}/echo/acme-made-up", headers=auth, json={})).status_code == 404
    assert (await http.get(f"{URL}/echo/say", headers=auth)).status_code == 405
    assert (await http.get("/healthz")).status_code == 200

    response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    samples = _samples(response.text)
    counted = {
        (dict(labels)["method"], dict(labels)["code"]): value
        for (name, labels), value in samples.items()
        if name == "bettercompute_http_requests_total"
    }
    assert counted == {
        ("echo.say", "OK"): 1,
        ("echo.say", "ACCESS_DENIED"): 1,
        ("echo.say", "UNAUTHENTICATED"): 1,
        ("echo.say", "INVALID_INPUT"): 1,  # the 405
        ("echo.fail", "INTERNAL"): 1,
        ("other", "NOT_FOUND"): 1,
        ("healthz", "OK"): 1,
    }
    assert samples[("bettercompute_http_request_duration_seconds_count", frozenset({("method", "echo.say")}))] == 4
    # The pool is reported from the store's counters, though the database was never reached.
    assert samples[("bettercompute_db_pool_max", frozenset())] > 0
    assert samples[("bettercompute_db_pool_connections", frozenset({("state", "in_use")}))] == 0
    # The scrape itself is counted afterwards.
    assert _requests(compute, "metrics", "OK") == 1


@pytest.mark.anyio
async def test_a_shed_or_unavailable_answer_counts_as_unavailable(
    compute: BetterCompute, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def shed(request: Request) -> Response:
        return error_response(
            UnavailableError("busy", details={"retry_after_seconds": 1}), headers={"retry-after": "1"}
        )

    monkeypatch.setattr(compute._http, "handle", shed)
    response = await http.post(f"{URL}/echo/say", json={"tenant": "acme", "text": "x"})
    assert response.status_code == 503
    assert _requests(compute, "echo.say", "UNAVAILABLE") == 1


@pytest.mark.anyio
async def test_readyz_with_the_database_away_counts_as_unavailable(
    compute: BetterCompute, http: httpx.AsyncClient
) -> None:
    assert (await http.get("/readyz")).status_code == 503
    assert _requests(compute, "readyz", "UNAVAILABLE") == 1


@pytest.mark.anyio
async def test_metrics_never_answers_with_a_traceback(
    compute: BetterCompute, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> bytes:
        raise RuntimeError("a collector failed")

    monkeypatch.setattr(compute.metrics, "render", broken)
    response = await http.get("/metrics")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "INTERNAL"
    assert "Traceback" not in response.text and "collector" not in response.text
    assert (await http.post("/metrics")).status_code == 405


@pytest.mark.anyio
async def test_a_pool_source_that_fails_leaves_the_pool_out_of_that_scrape(compute: BetterCompute) -> None:
    def failing() -> dict[str, int]:
        raise RuntimeError("no pool")

    compute.metrics.watch_pool(failing)
    samples = _samples(compute.metrics.render().decode())
    assert not [key for key in samples if key[0].startswith("bettercompute_db_pool")]


def test_each_control_plane_has_a_registry_of_its_own() -> None:
    first, second = make_compute(), make_compute()
    assert first.metrics.registry is not second.metrics.registry
    first.metrics.webhook_dead_letters.inc()
    assert first.metrics.registry.get_sample_value("bettercompute_webhook_dead_letters_total") == 1
    assert second.metrics.registry.get_sample_value("bettercompute_webhook_dead_letters_total") == 0
    assert first.context.metrics is first.metrics
    # Every metric family the operations guide lists is there before anything is recorded.
    # (prometheus-client's ``_created`` series of counters and histograms read as families of their own here.)
    parsed = text_string_to_metric_families(Metrics().render().decode())
    families = {f.name for f in parsed if not f.name.endswith("_created")}
    assert families == {
        "bettercompute_http_requests",
        "bettercompute_http_request_duration_seconds",
        "bettercompute_admissions",
        "bettercompute_queue_depth",
        "bettercompute_queue_claim_duration_seconds",
        "bettercompute_queue_claimed",
        "bettercompute_leases_held",
        "bettercompute_leases_acquired",
        "bettercompute_leases_lost",
        "bettercompute_gateway_sessions",
        "bettercompute_gateway_handshakes",
        "bettercompute_gateway_revocations_applied",
        "bettercompute_gateway_tunnels",
        "bettercompute_gateway_tunnel_bytes",
        "bettercompute_webhook_delivery_lag_seconds",
        "bettercompute_webhook_dead_letters",
        "bettercompute_node_facts_refused",
        "bettercompute_db_pool_connections",
        "bettercompute_db_pool_max",
    }


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/api/compute/echo/say", "echo.say"),
        ("/api/compute/echo/nope", "other"),
        ("/api/compute/tenant_123/say", "other"),
        ("/api/compute/echo", "other"),
        ("/api/compute/echo/say/more", "other"),
        ("/api/compute/openapi.json", "openapi"),
        ("/healthz", "healthz"),
        ("/readyz", "readyz"),
        ("/metrics", "metrics"),
        ("/metrics/", "other"),
        ("/elsewhere/echo/say", "other"),
        ("", "other"),
    ],
)
def test_the_method_label_is_a_registered_method_or_a_fixed_name(path: str, label: str) -> None:
    assert http_method_label(path, "/api/compute", lambda g, m: (g, m) == ("echo", "say")) == label


@pytest.mark.parametrize(
    ("response", "code"),
    [
        (Response(status=200), "OK"),
        (Response(status=204), "OK"),
        (error_response(NotFoundError("no")), "NOT_FOUND"),
        (Response(status=503, body=b'{"status":"unavailable"}'), "UNAVAILABLE"),
        (Response(status=502, body=b"not json"), "HTTP_502"),
        (Response(status=400, body=b'{"error":{"code":"tenant-123 made up"}}'), "HTTP_400"),
        (Response(status=400, body=b'{"error":{"code":"' + b"A" * 100 + b'"}}'), "HTTP_400"),
        (Response(status=400, body=b'{"error":{"code":7}}'), "HTTP_400"),
    ],
)
def test_the_code_label_is_ok_or_an_error_code_and_nothing_else(response: Response, code: str) -> None:
    assert response_code(response) == code


@pytest.mark.parametrize(
    ("excluded", "reason"),
    [
        ({}, "no_atoms"),
        ({"booked": 3}, "booked"),
        ({"booked": 1, "unhealthy": 4, "free": 2}, "unhealthy"),
        ({"free": 2, "booked": 2}, "booked"),  # a tie goes to the earlier reason
        ({"tenant_abc": 9, "model": 1}, "model"),  # an unknown key never becomes a label
        ({"profile": 0}, "no_atoms"),
    ],
)
def test_no_capacity_is_labelled_by_the_reason_that_left_out_most_atoms(excluded: dict[str, Any], reason: str) -> None:
    assert no_capacity_reason(excluded) == reason


def test_a_deliverys_commit_time_is_read_back_from_its_body() -> None:
    at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    body = event_body(event_id="evt_1", type="t", key="k", seq=1, tenant="acme", created_at=at, data={})
    assert committed_at(body) == at
    assert committed_at("not json") is None
    assert committed_at('{"created_at": "2026-01-02T03:04:05"}') is None  # no zone: not comparable
    assert committed_at("[1]") is None
