"""``serve --iam-url``: an api process that asks a central control plane's IAM, as real subprocesses."""

from __future__ import annotations

import signal
from typing import Any

import httpx
import pytest

from bettercompute.client import Client
from tests._timing import deadline

from .conftest import StartCli, free_port, run_cli

pytestmark = pytest.mark.pg

API = "/api/compute"


def _call(base_url: str, token: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{base_url}{API}/{path}", headers={"authorization": f"Bearer {token}"}, json=body, timeout=deadline(10)
    )


def _data(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()["data"]
    return data


def test_an_api_process_authenticates_and_authorizes_through_a_central_iam(
    cli_env: dict[str, str], start_cli: StartCli
) -> None:
    central_port, edge_port = free_port(), free_port()
    central_url, edge_url = f"http://127.0.0.1:{central_port}", f"http://127.0.0.1:{edge_port}"

    central = start_cli(cli_env, "serve", "--roles", "api", "--port", str(central_port))
    central.wait_ready(central_url)
    bootstrap = run_cli(cli_env, "iam", "bootstrap", "--output", "token")
    assert bootstrap.returncode == 0, bootstrap.stderr
    root_token = bootstrap.stdout.strip()

    # The edge process's own service account: bound on the root scope to the built-in role for RemoteIam.
    account = _data(
        _call(
            central_url, root_token, "principals/create", {"tenant": "root", "name": "edge", "kind": "service_account"}
        )
    )
    _data(
        _call(
            central_url,
            root_token,
            "bindings/create",
            {"tenant": "root", "principal_id": account["id"], "role": "compute.authz-client", "scope_type": "root"},
        )
    )
    created = _data(
        _call(
            central_url,
            root_token,
            "credentials/create",
            {"tenant": "root", "principal_id": account["id"], "expires_in_seconds": None},
        )
    )
    edge_credential: str = created["credential"]

    edge_env = {**cli_env, "BETTERCOMPUTE_IAM_CREDENTIAL": edge_credential}
    edge = start_cli(edge_env, "serve", "--roles", "api", "--port", str(edge_port), "--iam-url", central_url)
    edge.wait_ready(edge_url)

    # The edge registers none of IAM's groups: it only asks the central IAM.
    assert _call(edge_url, root_token, "tenants/list", {}).status_code == 404
    assert _call(central_url, root_token, "tenants/list", {}).status_code == 200

    with Client(central_url, root_token) as client:
        expected = client.system.whoami()
    through_edge = _data(_call(edge_url, root_token, "system/whoami", {}))
    assert through_edge["principal_id"] == expected.principal_id
    assert through_edge["tenant_id"] == "root"
    assert through_edge["is_root"] is True

    stranger = _call(edge_url, "bcak_0000000000000000." + "x" * 43, "system/whoami", {})
    assert stranger.status_code == 401
    assert stranger.json()["error"]["code"] == "UNAUTHENTICATED"

    assert edge.stop(signal.SIGTERM) == 0
    assert central.stop(signal.SIGTERM) == 0
    for server in (central, edge):
        assert "Traceback" not in server.stderr
        assert root_token not in server.stderr
        assert edge_credential not in server.stderr
    assert f"using the central IAM at {central_url}" in edge.stderr


def test_serve_against_an_unreachable_central_iam_answers_503_not_401(
    cli_env: dict[str, str], start_cli: StartCli
) -> None:
    """A central IAM that is down is an outage for the caller, never a refusal of the caller's credential."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {**cli_env, "BETTERCOMPUTE_IAM_CREDENTIAL": "bcak_0000000000000000." + "y" * 43}
    edge = start_cli(
        env, "serve", "--roles", "api", "--port", str(port), "--iam-url", f"http://127.0.0.1:{free_port()}"
    )
    edge.wait_ready(base_url)

    response = _call(base_url, "bcak_0000000000000001." + "x" * 43, "system/whoami", {})
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "UNAVAILABLE"

    assert edge.stop(signal.SIGTERM) == 0
    assert "Traceback" not in edge.stderr
