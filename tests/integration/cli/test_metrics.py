"""``/metrics`` of every process mode, scraped as Prometheus scrapes it, from real ``better-compute serve`` processes
on real PostgreSQL: an API process (on its API port), a worker-only process and a gateway-only process (each on its
``--metrics-port``), with a ``bcd sim`` fleet in session on the gateway. Calls from two tenants and the sessions of
two nodes leave no tenant id, node id or pool id in any label."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests._timing import deadline

from .conftest import Running, StartCli, free_port, run_cli

pytestmark = pytest.mark.pg

BCD = str(Path(sys.executable).parent / "bcd")
API = "/api/compute"
LIFECYCLE = "node-lifecycle"  # the lifecycle controller's work kind: a session opening enqueues one item

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> tuple[Samples, set[str]]:
    """Every sample by (name, sorted labels), and the families' names; the response is the text format."""
    response = httpx.get(url, timeout=deadline(5))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    samples: Samples = {}
    families = set()
    for family in text_string_to_metric_families(response.text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, families


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def wait_until(check: Callable[[], bool], what: str, *processes: Running, within: float = 60) -> None:
    ends = time.monotonic() + deadline(within)
    while not check():
        for running in processes:
            assert running.process.poll() is None, f"exited while waiting for {what}:\n{running.stderr}"
        assert time.monotonic() < ends, f"not within {within} s: {what}"
        time.sleep(0.25)


def _gateway_metrics(url: str, gateway: Running) -> Samples:
    """The gateway-only process: two sessions while the fleet is connected, each after an ok handshake."""
    wait_until(
        lambda: value(scrape(url)[0], "bettercompute_gateway_sessions") == 2,
        "two sessions counted on the gateway",
        gateway,
    )
    samples, families = scrape(url)
    assert value(samples, "bettercompute_gateway_handshakes_total", outcome="ok") >= 2
    assert "bettercompute_gateway_revocations_applied" in families
    assert value(samples, "bettercompute_db_pool_max") > 0
    return samples


def _worker_metrics(url: str, worker: Running) -> Samples:
    """The worker-only process: its shard leases, and the lifecycle items the sessions enqueued, claimed."""
    wait_until(
        lambda: value(scrape(url)[0], "bettercompute_queue_claimed_total", kind=LIFECYCLE) >= 2,
        "the sessions' lifecycle items claimed by the worker",
        worker,
    )
    wait_until(
        lambda: value(scrape(url)[0], "bettercompute_leases_held", kind="shard") == 512,
        "both roles' 256 shard leases held",
        worker,
    )
    samples, families = scrape(url)
    assert value(samples, "bettercompute_queue_claim_duration_seconds_count", kind=LIFECYCLE) >= 2
    assert value(samples, "bettercompute_leases_acquired_total", kind="shard") >= 512
    assert {"bettercompute_queue_depth", "bettercompute_leases_lost"} <= families
    assert value(samples, "bettercompute_db_pool_connections", state="idle") >= 1
    return samples


def _api_metrics(url: str) -> Samples:
    """The API process, on its API port: requests by method and code, an error code each, admission outcomes."""
    samples, families = scrape(url)
    requests = "bettercompute_http_requests_total"
    assert value(samples, requests, method="pools.create", code="OK") == 2
    assert value(samples, requests, method="pools.get", code="NOT_FOUND") == 1
    assert value(samples, requests, method="pools.list", code="UNAUTHENTICATED") == 1
    assert value(samples, requests, method="other", code="NOT_FOUND") == 1
    assert value(samples, requests, method="readyz", code="OK") >= 1
    assert value(samples, "bettercompute_http_request_duration_seconds_count", method="pools.create") == 2
    assert (
        value(
            samples, "bettercompute_admissions_total", resource="reservation", outcome="no_capacity", reason="no_atoms"
        )
        == 1
    )
    assert value(samples, "bettercompute_db_pool_max") > 0
    assert value(samples, "bettercompute_db_pool_connections", state="in_use") >= 0
    assert {"bettercompute_webhook_delivery_lag_seconds", "bettercompute_webhook_dead_letters"} <= families
    return samples


def _started(
    env: dict[str, str], start_cli: StartCli, api_port: int
) -> tuple[str, Running, Running, Running, int, int]:
    """Migrated, then an API process, a worker-only and a gateway-only process (enrolled over the api's internal
    listener, with no KMS key), each answering: the root token, the three, and the two metrics ports."""
    migrated = run_cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    boot = run_cli(env, "iam", "bootstrap", "--output", "token")
    assert boot.returncode == 0, boot.stderr
    worker_metrics, gateway_metrics, internal = free_port(), free_port(), free_port()
    # The gateway process holds no KMS key: it enrols with a one-time token on the api's internal listener.
    minted = run_cli(env, "gateways", "token", "gw-metrics")
    assert minted.returncode == 0, minted.stderr
    api = start_cli(
        {**env, "BETTERCOMPUTE_INTERNAL_PORT": str(internal)},
        "serve",
        "--roles",
        "api",
        "--port",
        str(api_port),
        "--no-migrate",
    )
    worker = start_cli(
        env, "serve", "--roles", "controllers,scheduler", "--no-migrate", "--metrics-port", str(worker_metrics)
    )
    api.wait_ready(f"http://127.0.0.1:{api_port}")
    edge = {k: v for k, v in env.items() if k != "BETTERCOMPUTE_KMS_KEY_FILE"}
    edge |= {
        "BETTERCOMPUTE_INSTANCE": "gw-metrics",
        "BETTERCOMPUTE_INTERNAL_ADDRESS": f"127.0.0.1:{internal}",
        "BETTERCOMPUTE_GATEWAY_TOKEN": minted.stdout.strip(),
        "BETTERCOMPUTE_GATEWAY_STATE_DIR": env["BETTERCOMPUTE_KMS_KEY_FILE"] + ".gateway",
    }
    gateway = start_cli(edge, "serve", "--roles", "gateway", "--no-migrate", "--metrics-port", str(gateway_metrics))
    api.wait_ready(f"http://127.0.0.1:{api_port}")
    worker.wait_for("running controllers, scheduler", in_stderr=True)
    gateway.wait_for("running gateway", in_stderr=True)
    return boot.stdout.strip(), api, worker, gateway, worker_metrics, gateway_metrics


@pytest.mark.timeout(240)
def test_every_process_mode_serves_metrics_that_move_with_bounded_labels(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    gateway_port, api_port = free_port(), free_port()
    env = {
        **cli_env,
        "BETTERCOMPUTE_KMS_KEY_FILE": str(tmp_path / "kms.key"),
        "BETTERCOMPUTE_TRUST_DOMAIN": "dev.localhost",
        "BETTERCOMPUTE_GATEWAY_ADDRESS": f"127.0.0.1:{gateway_port}",
    }
    token, api, worker, gateway, worker_metrics, gateway_metrics = _started(env, start_cli, api_port)
    headers = {"authorization": f"Bearer {token}"}
    base = f"http://127.0.0.1:{api_port}"

    def call(path: str, body: dict[str, Any], *, status: int = 200) -> Any:
        response = httpx.post(f"{base}{API}/{path}", headers=headers, json=body, timeout=deadline(10))
        assert response.status_code == status, response.text
        return response.json().get("data")

    # Two tenants, a pool in each, a reservation that cannot fit (no nodes yet), errors of three kinds.
    tenants = [call("tenants/create", {"name": f"metrics-{n}"})["id"] for n in ("a", "b")]
    pools = [call("pools/create", {"tenant": t, "name": "gpus"})["id"] for t in tenants]
    call("reservations/create", {"tenant": tenants[1], "pool_id": pools[1], "gpus": 1, "duration": "PT1H"}, status=409)
    call("pools/get", {"id": "pool_00000000000000000000000000"}, status=404)
    assert httpx.post(f"{base}{API}/pools/list", json={"tenant": tenants[0]}, timeout=deadline(5)).status_code == 401
    assert httpx.post(f"{base}{API}/no-such/route-{tenants[0]}", json={}, timeout=deadline(5)).status_code == 404

    created = call("join-tokens/create", {"pool_id": pools[0], "uses": 2, "expires_in_seconds": 600})
    printed = shlex.split(created["join_command"])
    printed[printed.index("--gateway") + 1] = f"127.0.0.1:{gateway_port}"
    with (tmp_path / "sim.out").open("wb") as out, (tmp_path / "sim.err").open("wb") as err:
        sim = subprocess.Popen(
            [BCD, "sim", "--nodes", "2", "--state-dir", str(tmp_path / "fleet"), *printed[2:]], stdout=out, stderr=err
        )
    try:
        gateway_samples = _gateway_metrics(f"http://127.0.0.1:{gateway_metrics}/metrics", gateway)
        worker_samples = _worker_metrics(f"http://127.0.0.1:{worker_metrics}/metrics", worker)
        nodes = [n["id"] for n in call("nodes/list", {"tenant": tenants[0]})["nodes"]]
        assert len(nodes) == 2
    finally:
        sim.send_signal(signal.SIGTERM)
        sim.wait(timeout=deadline(20))
    api_samples = _api_metrics(f"{base}/metrics")

    # Bounded labels: no tenant, node or pool id anywhere, in any process's metrics.
    ids = [*tenants, *pools, *nodes]
    for samples in (api_samples, worker_samples, gateway_samples):
        for _, labels in samples:
            for label, text in labels:
                assert not any(i in text for i in ids), f"{label}={text!r} carries an id"

    # Only /metrics and /healthz on a metrics port; the worker-only process still has no API.
    other = httpx.get(f"http://127.0.0.1:{worker_metrics}/api/compute/openapi.json", timeout=deadline(5))
    assert other.status_code == 404 and other.json()["error"]["code"] == "NOT_FOUND"
    assert httpx.get(f"http://127.0.0.1:{gateway_metrics}/healthz", timeout=deadline(5)).status_code == 200
    for running in (api, worker, gateway):
        assert running.stop(signal.SIGTERM) == 0, running.stderr
        assert "Traceback" not in running.stderr
