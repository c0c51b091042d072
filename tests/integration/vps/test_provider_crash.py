"""A worker killed (kill -9) while its launch is in flight at EC2: the workflow resumes on a new worker process and
the instance runs on the one VM the first launch made, never a second one.

Everything but moto and the proxy runs as ``better-compute serve`` processes on one schema, as deployed: one with
the ``api`` role and a worker with the ``controllers`` role (where workflows run), with a 2 s lease TTL. The pool's
EC2 endpoint is a ``FaultyProxy`` in ``hold`` mode in this process: it forwards the first RunInstances to moto (so
the VM exists) and keeps the answer back, so the worker is killed with the call in flight.

How long the resume takes: the new worker owns the dead one's shards one lease TTL after its last heartbeat, but
re-claims the workflow's work item only when the dead worker's claim runs out, and a claim lasts the longest pass
of the ``controllers`` role (the longest workflow step's deadline, 120 s for bare metal's, plus a margin) plus one
lease TTL. So this test takes a little over two minutes.
"""

from __future__ import annotations

import functools
import json
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from tests._timing import deadline

from ..cli.conftest import Running, free_port, run_cli
from ._moto import ACCESS_KEY_ID, SECRET_ACCESS_KEY, MotoServer
from .test_ec2 import faulty_proxy

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.e2e, pytest.mark.timeout(420)]

LEASE_TTL = 2
RESUME_WITHIN = 240.0  # the dead worker's claim (about 127 s, see above) plus room for a loaded machine


class Plane:
    """The processes of one control plane on a schema, and its HTTP API as the root admin."""

    def __init__(self, env: dict[str, str], folder: Path, token: str) -> None:
        self.env = env
        self.folder = folder
        self.port = free_port()
        self.started: list[Running] = []
        self.headers = {"Authorization": f"Bearer {token}"}

    def start(self, instance: str, *args: str) -> Running:
        folder = self.folder / instance
        folder.mkdir()
        running = Running({**self.env, "BETTERCOMPUTE_INSTANCE": instance}, ["serve", "--no-migrate", *args], folder)
        self.started.append(running)
        return running

    async def call(self, client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await client.post(
            f"http://127.0.0.1:{self.port}/api/compute/{path}", headers=self.headers, json=body, timeout=deadline(10)
        )
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()["data"]
        return data

    def kill_all(self) -> None:
        for running in self.started:
            if running.process.poll() is None:
                running.process.kill()
            running.process.wait(timeout=deadline(10))


def _vm_ids(server: MotoServer) -> list[str]:
    client = server.ec2_client()
    try:
        reservations = client.describe_instances()["Reservations"]
    finally:
        client.close()
    return [vm["InstanceId"] for r in reservations for vm in r.get("Instances", []) if "InstanceId" in vm]


async def _worker(plane: Plane, instance: str) -> Running:
    worker = plane.start(instance, "--roles", "controllers")
    await anyio.to_thread.run_sync(lambda: worker.wait_for("running controllers", in_stderr=True, timeout=60))
    return worker


async def _instance_on_an_ec2_pool(plane: Plane, client: httpx.AsyncClient, endpoint: str, moto_ami: str) -> str:
    """A provider pool on ``endpoint`` with its keys as a secret, an image, and an instance created on it: its id."""
    tenant = (await plane.call(client, "system/whoami", {}))["tenant_id"]
    made_pool = {"tenant": tenant, "name": "cloud", "pool_class": "provider"}
    pool = (await plane.call(client, "pools/create", made_pool))["id"]
    keys = {"access_key_id": ACCESS_KEY_ID, "secret_access_key": SECRET_ACCESS_KEY}
    await plane.call(
        client,
        "secrets/create",
        {"tenant": tenant, "name": "ec2-keys", "scope": f"pool:{pool}", "value": json.dumps(keys)},
    )
    provider = {
        "kind": "ec2",
        "region": "us-east-1",
        "credentials_secret": "ec2-keys",
        "endpoint_url": endpoint,
        "instance_types": [{"name": "t3.micro", "vcpu": 2, "memory_mib": 1024}],
    }
    await plane.call(client, "vps-pools/configure", {"pool_id": pool, "provider": provider})
    image = await plane.call(
        client,
        "images/register",
        {
            "tenant": tenant,
            "name": "ubuntu",
            "kind": "disk",
            "url": "https://images.example.test/ubuntu.img",
            "sha256": "d" * 64,
            "provider_images": {"ec2": moto_ami},
        },
    )
    created = await plane.call(
        client,
        "instances/create",
        {
            "tenant": tenant,
            "pool_id": pool,
            "name": "web-1",
            "size": {"vcpu": 2, "memory_mib": 1024, "disk_gib": 8},
            "image_id": image["id"],
        },
    )
    instance: str = created["id"]
    return instance


async def _until_settled(
    plane: Plane, client: httpx.AsyncClient, instance: str, worker: Running, since: float
) -> dict[str, Any]:
    """Poll the instance until it is running or failed (the worker alive meanwhile): how it is then."""
    seen: list[tuple[str, str | None, str | None]] = []
    while True:
        shown = await plane.call(client, "instances/get", {"id": instance})
        seen.append((shown["state"], shown["step"], shown["reason"]))
        if shown["state"] in ("running", "failed"):
            break
        assert worker.process.poll() is None, worker.stderr
        assert time.monotonic() - since < deadline(RESUME_WITHIN), seen[-5:]
        await anyio.sleep(0.5)
    assert shown["state"] == "running", seen[-5:]
    return shown


async def test_a_worker_killed_during_its_launch_resumes_on_another_without_a_second_vm(
    cli_env: dict[str, str], tmp_path: Path, moto_ec2: str, moto_ami: str, moto_ec2_server: MotoServer
) -> None:
    env = {
        **cli_env,
        # Node identity and a KMS key file: the CLI composes the VPS module with them.
        "BETTERCOMPUTE_TRUST_DOMAIN": "crash.localhost",
        "BETTERCOMPUTE_GATEWAY_ADDRESS": f"127.0.0.1:{free_port()}",
        "BETTERCOMPUTE_KMS_KEY_FILE": str(tmp_path / "kms" / "kms.key"),
        "BETTERCOMPUTE_LEASE_TTL_SECONDS": str(LEASE_TTL),
    }
    for step in (("migrate",), ("iam", "bootstrap", "--output", "token")):
        done = await anyio.to_thread.run_sync(functools.partial(run_cli, env, *step))
        assert done.returncode == 0, done.stderr
    plane = Plane(env, tmp_path, done.stdout.strip())

    async with faulty_proxy(moto_ec2, "hold") as (endpoint, proxy), httpx.AsyncClient() as client:
        try:
            api = plane.start("crash-api", "--roles", "api", "--port", str(plane.port))
            await anyio.to_thread.run_sync(lambda: api.wait_ready(f"http://127.0.0.1:{plane.port}", timeout=60))
            first = await _worker(plane, "crash-w1")
            instance = await _instance_on_an_ec2_pool(plane, client, endpoint, moto_ami)

            # The worker's RunInstances reached moto, which made the VM; its answer is held back.
            with anyio.fail_after(deadline(60)):
                await proxy.held.wait()
            made = await anyio.to_thread.run_sync(_vm_ids, moto_ec2_server)
            assert len(made) == 1
            shown = await plane.call(client, "instances/get", {"id": instance})
            assert (shown["state"], shown["step"], shown["provider_id"]) == ("provisioning", "launch", None)

            first.process.send_signal(signal.SIGKILL)
            assert await anyio.to_thread.run_sync(lambda: first.process.wait(timeout=deadline(10))) == -signal.SIGKILL
            killed_at = time.monotonic()
            with anyio.fail_after(deadline(10)):
                await proxy.client_gone.wait()  # the launch died with the process, unanswered

            second = await _worker(plane, "crash-w2")
            shown = await _until_settled(plane, client, instance, second, killed_at)

            # The resumed launch found the VM by its client token and asked EC2 for no other.
            assert await anyio.to_thread.run_sync(_vm_ids, moto_ec2_server) == made
            assert shown["provider_id"] == made[0]
            assert proxy.run_instances_seen == 1

            for running in (second, api):
                code = await anyio.to_thread.run_sync(functools.partial(running.stop, signal.SIGTERM))
                assert code == 0, running.stderr
            for running in plane.started:
                assert "Traceback" not in running.stderr, running.stderr
        finally:
            await anyio.to_thread.run_sync(plane.kill_all)
