"""``metrics_port`` and ``metrics_host``: where the metrics listener listens, and what the API's port and the
listener each answer (through ``httpx.ASGITransport``: no server, no database)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bettercompute_cli import load_config
from bettercompute_cli._config import ConfigError
from bettercompute_cli._runtime import _HostedApp, _MetricsApp, metrics_address

from ..core.conftest import make_compute


def test_the_metrics_port_comes_from_the_file_the_environment_or_the_flag(tmp_path: Path) -> None:
    assert metrics_address(load_config(None, {})) is None
    path = tmp_path / "c.toml"
    path.write_text('host = "10.0.0.1"\nmetrics_port = 9100\n')
    assert metrics_address(load_config(path, {})) == ("10.0.0.1", 9100)
    assert metrics_address(load_config(None, {"BETTERCOMPUTE_METRICS_PORT": "9200"})) == ("127.0.0.1", 9200)
    flagged = load_config(None, {"BETTERCOMPUTE_METRICS_PORT": "9200"}, {"metrics_port": 9300, "metrics_host": "::"})
    assert metrics_address(flagged) == ("::", 9300)


@pytest.mark.parametrize("value", ["0", "70000", "ninety", "\uff19\uff11\uff10\uff10"])
def test_a_bad_metrics_port_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, {"BETTERCOMPUTE_METRICS_PORT": value})
    assert "BETTERCOMPUTE_METRICS_PORT" in str(raised.value)


async def _get(app: object, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:  # type: ignore[arg-type]
        return await client.get(path)


@pytest.mark.anyio
async def test_with_a_metrics_port_the_api_port_no_longer_serves_metrics() -> None:
    compute = make_compute()
    apart = await _get(_HostedApp(compute, migrate=False, metrics_apart=True), "/metrics")
    assert apart.status_code == 404 and apart.json()["error"]["code"] == "NOT_FOUND"
    assert (await _get(_HostedApp(compute, migrate=False), "/metrics")).status_code == 200
    assert (await _get(_HostedApp(compute, migrate=False, metrics_apart=True), "/healthz")).status_code == 200


@pytest.mark.anyio
async def test_the_metrics_listener_serves_metrics_and_healthz_only() -> None:
    compute = make_compute()
    app = _MetricsApp(compute)
    metrics = await _get(app, "/metrics")
    assert metrics.status_code == 200 and "bettercompute_http_requests_total" in metrics.text
    assert (await _get(app, "/healthz")).status_code == 200
    for path in ("/readyz", "/api/compute/openapi.json", "/"):
        refused = await _get(app, path)
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "NOT_FOUND", path
