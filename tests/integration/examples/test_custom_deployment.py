"""The custom deployment example (``examples/custom_deployment``) run as its README says, every part a real OS process
over one PostgreSQL schema: ``setup``, then the central IAM, an api process on ``RemoteIam`` and a gateway; a node
(``bcd sim``) joins through the gateway; the worker starts only later, so what it alone does is seen not to happen
before it runs, and to happen once it does."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests._timing import deadline

from ..cli.conftest import Running, free_port

pytestmark = [pytest.mark.pg, pytest.mark.e2e]

REPOSITORY = Path(__file__).resolve().parents[3]  # ``python -m examples.custom_deployment`` runs from here
BCD = str(Path(sys.executable).parent / "bcd")
CREDENTIAL_ENV = "BETTERCOMPUTE_IAM_CREDENTIAL"


class Part(Running):
    """One running process (a part of the deployment, or ``bcd sim``), its output in files."""

    def __init__(self, argv: list[str], env: dict[str, str], folder: Path) -> None:
        folder.mkdir()
        self.stdout_path = folder / "stdout"
        self.stderr_path = folder / "stderr"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=REPOSITORY)


def example(*args: str) -> list[str]:
    return [sys.executable, "-m", "examples.custom_deployment", *args]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[str, list[str], dict[str, str]], Part]]:
    """``start(name, argv, env)``; whatever is still running after the test, passed or failed, is killed."""
    started: list[Part] = []

    def run(name: str, argv: list[str], env: dict[str, str]) -> Part:
        part = Part(argv, env, tmp_path / name)
        started.append(part)
        return part

    yield run
    for part in started:
        if part.process.poll() is None:
            part.process.kill()
            part.process.wait(timeout=deadline(10))


@pytest.fixture
def deployment_env(database_url: str, empty_schema: str, tmp_path: Path) -> dict[str, str]:
    """The settings every part shares, on an empty schema of this test (``setup`` migrates it), with free ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTERCOMPUTE_")}
    env.update(
        BETTERCOMPUTE_DATABASE_URL=database_url,
        BETTERCOMPUTE_SCHEMA=empty_schema,
        BETTERCOMPUTE_KMS_KEY_FILE=str(tmp_path / "keys" / "kms.key"),
        BETTERCOMPUTE_TRUST_DOMAIN="deploy.test",
        BETTERCOMPUTE_GATEWAY_ADDRESS=f"127.0.0.1:{free_port()}",
        BETTERCOMPUTE_IAM_URL=f"http://127.0.0.1:{free_port()}",
    )
    return env


class Api:
    """Calls to one process's HTTP API."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def post(self, token: str, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            f"{self.base_url}/api/compute/{path}",
            headers={"authorization": f"Bearer {token}"},
            json=body,
            timeout=deadline(10),
        )

    def data(self, token: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.post(token, path, body)
        assert response.status_code == 200, f"{path} on {self.base_url}: {response.status_code} {response.text}"
        data: dict[str, Any] = response.json()["data"]
        return data


def wait_until(check: Callable[[], bool], within: float, what: str, *parts: Part) -> None:
    """Poll ``check``; fail at once if one of ``parts`` exits meanwhile, naming it and showing its log."""
    ends = time.monotonic() + deadline(within)
    while not check():
        for part in parts:
            code = part.process.poll()
            assert code is None, (
                f"{part.stderr_path.parent.name} exited {code} while waiting for {what}:\n{part.stderr}"
            )
        assert time.monotonic() < ends, f"not within {within} s: {what}"
        time.sleep(0.2)


def lease_holders(url: str, schema: str, parts: dict[str, Part]) -> dict[str, set[str]]:
    """Role -> the parts holding a live lease of that role (a shard or a singleton job), by name."""
    names = {str(part.process.pid): name for name, part in parts.items()}
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(f'SELECT name, holder FROM "{schema}".leases WHERE expires_at > now()').fetchall()
    holders: dict[str, set[str]] = {}
    for name, holder in rows:
        pid = str(holder).partition("/")[0].rpartition(":")[2]  # <instance>[/<worker id>], the instance <host>:<pid>
        holders.setdefault(str(name).partition("/")[0], set()).add(names.get(pid, f"pid {pid}"))
    return holders


def _setup(env: dict[str, str]) -> tuple[str, str]:
    """``setup``: migrations and keys, then the two credentials, shown once as lines to eval; a second run mints
    nothing. (root token, the api process's credential)"""
    done = subprocess.run(
        example("setup"), env=env, cwd=REPOSITORY, capture_output=True, text=True, timeout=deadline(60)
    )
    assert done.returncode == 0, done.stderr
    exported = dict(re.findall(r"^export (\w+)=(\S+)$", done.stdout, re.MULTILINE))
    again = subprocess.run(
        example("setup"), env=env, cwd=REPOSITORY, capture_output=True, text=True, timeout=deadline(60)
    )
    assert again.returncode == 0 and again.stdout == "", again.stderr  # a second run mints nothing
    return exported["ROOT_TOKEN"], exported[CREDENTIAL_ENV]


def _operator_through_the_central_iam(central: Api, edge: Api, root: str) -> tuple[str, dict[str, Any]]:
    """Credentials minted by the central IAM work on the api process, which asks the central IAM for each
    authentication and each decision: an operator may create, a viewer may not. (the operator's credential, a pool
    it made)"""
    minted: dict[str, dict[str, str]] = {}
    for name, role in (("ops", "compute.operator"), ("auditor", "compute.viewer")):
        principal = central.data(root, "principals/create", {"tenant": "root", "name": name, "kind": "user"})
        central.data(
            root,
            "bindings/create",
            {"tenant": "root", "principal_id": principal["id"], "role": role, "scope_type": "root"},
        )
        credential = central.data(
            root, "credentials/create", {"tenant": "root", "principal_id": principal["id"], "expires_in_seconds": 3600}
        )
        minted[name] = {"id": principal["id"], "credential": credential["credential"]}
    ops = minted["ops"]["credential"]
    assert edge.data(ops, "system/whoami", {})["principal_id"] == minted["ops"]["id"]
    pool = edge.data(ops, "pools/create", {"tenant": "root", "name": "gpus"})
    refused = edge.post(minted["auditor"]["credential"], "pools/create", {"tenant": "root", "name": "other"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "ACCESS_DENIED", refused.text
    unknown = edge.post("bcak_0000000000000000." + "x" * 43, "system/whoami", {})
    assert unknown.status_code == 401 and unknown.json()["error"]["code"] == "UNAUTHENTICATED", unknown.text
    # The api process embeds no IAM: IAM is administered on the central process only.
    assert edge.post(root, "tenants/list", {}).status_code == 404
    return ops, pool


def _nothing_adopts_without_a_worker(edge: Api, ops: str, node_id: str, holders: Callable[[], object]) -> None:
    """The api, the gateway and the central IAM run no controller: the node stays adopting with no devices, and only
    the central IAM holds leases, for IAM's own jobs."""
    time.sleep(3)  # adoption takes about a second when a worker runs; give it three
    seen = edge.data(ops, "nodes/get", {"id": node_id})
    assert (seen["state"], seen["desired_generation"]) == ("adopting", 0), (
        f"the node moved on with no worker running: {seen['state']}, desired generation {seen['desired_generation']}"
    )
    assert edge.data(ops, "devices/list", {"tenant": "root", "node_id": node_id})["devices"] == []
    assert holders() == {"iam": {"iam"}}


def _everything_stops(sim: Part, parts: list[Part], secrets: tuple[str, ...]) -> None:
    """Everything stops on SIGTERM, exits 0, and no credential reached a log."""
    assert sim.stop() == 0, sim.stderr
    summary = json.loads(sim.stdout.splitlines()[-1])
    assert summary["joined"] == 1 and summary["acks"] >= 1, summary
    for part in parts:
        name = part.stderr_path.parent.name
        assert part.stop(signal.SIGTERM) == 0, f"{name}:\n{part.stderr}"
        assert "Traceback" not in part.stderr, f"{name}:\n{part.stderr}"
        for secret in secrets:
            assert secret not in part.stderr, f"a credential in the log of {name}"


def test_a_central_iam_an_api_process_a_gateway_and_a_worker_run_one_deployment(
    deployment_env: dict[str, str],
    database_url: str,
    start: Callable[[str, list[str], dict[str, str]], Part],
    tmp_path: Path,
) -> None:
    env, schema = deployment_env, deployment_env["BETTERCOMPUTE_SCHEMA"]
    iam_url, gateway_address = env["BETTERCOMPUTE_IAM_URL"], env["BETTERCOMPUTE_GATEWAY_ADDRESS"]
    api_port = free_port()
    root, edge_credential = _setup(env)

    # The central IAM, an api process and a gateway; the worker is not started yet.
    edge_env = {**env, CREDENTIAL_ENV: edge_credential}
    iam = start("iam", example("iam", "--port", iam_url.rpartition(":")[2]), env)
    api = start("api", example("api", "--port", str(api_port)), edge_env)
    gateway = start("gateway", example("gateway", "--name", "gw-test"), edge_env)
    iam.wait_ready(iam_url, timeout=45)
    api.wait_ready(f"http://127.0.0.1:{api_port}", timeout=45)
    gateway.wait_for(f"gateway gw-test listening on 127.0.0.1:{gateway_address.rpartition(':')[2]}", in_stderr=True)
    central, edge = Api(iam_url), Api(f"http://127.0.0.1:{api_port}")
    ops, pool = _operator_through_the_central_iam(central, edge, root)

    # A node joins through the gateway with a token made on the api process, and holds its session there.
    token = edge.data(ops, "join-tokens/create", {"pool_id": pool["id"], "uses": 1, "expires_in_seconds": 600})
    printed = shlex.split(token["join_command"])
    assert printed[printed.index("--gateway") + 1] == gateway_address
    sim_argv = [BCD, "sim", "--nodes", "1", "--state-dir", str(tmp_path / "sim-state"), *printed[2:]]
    sim = start("sim", sim_argv, {k: v for k, v in env.items() if not k.startswith("BETTERCOMPUTE_")})

    def nodes() -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = edge.data(ops, "nodes/list", {"tenant": "root", "pool_id": pool["id"]})["nodes"]
        return listed

    wait_until(lambda: any(n["session_epoch"] >= 1 for n in nodes()), 30, "the node in session", sim, gateway, api, iam)
    [node] = nodes()
    parts = {"iam": iam, "api": api, "gateway": gateway}
    _nothing_adopts_without_a_worker(edge, ops, node["id"], lambda: lease_holders(database_url, schema, parts))

    # The worker starts: it takes the worker roles' leases, and its controllers run the acceptance check (a command
    # the gateway dispatches to the node) and adopt the node, with its 8 GPUs as devices.
    worker = start("worker", example("worker"), edge_env)
    worker.wait_for("worker running controllers, scheduler, sinks", in_stderr=True, timeout=45)

    def adopted() -> bool:
        seen = edge.data(ops, "nodes/get", {"id": node["id"]})
        return bool(seen["state"] == "adopted" and not seen["desired_state_pending"])

    wait_until(adopted, 30, "the node adopted", worker, sim, gateway, api, iam)
    devices = edge.data(ops, "devices/list", {"tenant": "root", "node_id": node["id"]})["devices"]
    assert len([d for d in devices if d["kind"] == "gpu"]) == 8
    parts["worker"] = worker
    expected = {"iam": {"iam"}, "controllers": {"worker"}, "scheduler": {"worker"}, "sinks": {"worker"}}
    wait_until(lambda: lease_holders(database_url, schema, parts) == expected, 30, "the worker's leases", worker)

    # A reservation made on the api process: placed there, then carried to the node by the worker's controller and
    # the gateway, and acknowledged by the node.
    reservation = edge.data(
        ops, "reservations/create", {"tenant": "root", "pool_id": pool["id"], "gpus": 1, "duration": "PT1H"}
    )
    assert reservation["state"] == "placed", reservation

    def active() -> bool:
        return bool(edge.data(ops, "reservations/get", {"id": reservation["id"]})["state"] == "active")

    wait_until(active, 30, "the reservation active", worker, sim, gateway, api, iam)
    _everything_stops(sim, [worker, gateway, api, iam], (root, edge_credential, ops))
