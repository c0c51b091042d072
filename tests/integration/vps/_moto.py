"""A real EC2 API for tests: moto's server (``moto_server``, from the dev extra) as a separate process on loopback.

``start_moto(log_file)`` starts it on a free port and waits until it answers; ``MotoServer.reset()`` forgets every
resource (moto's own reset endpoint), ``usable_ami()`` names an image the server knows, ``ec2_client()`` is a plain
boto3 client for a test's own checks (counting instances, say). Nothing here reaches the network: moto's default images
ship inside the package.

Facts about moto 5.x the EC2 tests rely on (read from its source):

- RunInstances records ``ClientToken`` but does not deduplicate by it: the same token twice makes two instances.
- DescribeInstances supports ``tag:<key>`` filters but not the ``client-token`` filter (it answers 500).
- With ``MOTO_ENABLE_AMI_VALIDATION=true`` an unknown image id is ``InvalidAMIID.NotFound``; without it, any image id
  launches.
- With ``INITIAL_NO_AUTH_ACTION_COUNT=0`` every request's signature is checked against IAM access keys moto knows, so
  any made-up key is ``AuthFailure``; the default (infinity) accepts any credentials.
- RunInstances answers ``pending``, but the instance is ``running`` at once for every later read;
  ModifyInstanceAttribute does not check that the instance is stopped (the adapter does).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

import attrs
import boto3.session
import httpx

from tests._timing import deadline

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client

MOTO_SERVER = Path(sys.executable).parent / "moto_server"
REGION = "us-east-1"
# Any key works unless the server checks signatures; these look like AWS's and appear nowhere else.
ACCESS_KEY_ID = "AKIATESTKEY000000001"
SECRET_ACCESS_KEY = "bc-test-secret/3Jq8Zr5KxP0vW2yN7uT4sL1oA9dE6fG"
START_TIMEOUT = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at this moment."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@attrs.define
class MotoServer:
    """A running ``moto_server``; ``url`` is its endpoint (``http://127.0.0.1:<port>``)."""

    url: str
    process: subprocess.Popen[bytes]
    log_file: Path
    _log: IO[bytes]

    def reset(self) -> None:
        """Forget every resource (instances, images registered by tests, ...); the default images come back."""
        httpx.post(f"{self.url}/moto-api/reset", timeout=deadline(10)).raise_for_status()

    def ec2_client(
        self, *, access_key_id: str = ACCESS_KEY_ID, secret_access_key: str = SECRET_ACCESS_KEY
    ) -> EC2Client:
        session = boto3.session.Session(
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key, region_name=REGION
        )
        return session.client("ec2", endpoint_url=self.url)

    def usable_ami(self) -> str:
        """The id of an available image the server knows (one of moto's defaults)."""
        client = self.ec2_client()
        try:
            images = client.describe_images(Filters=[{"Name": "state", "Values": ["available"]}])["Images"]
        finally:
            client.close()
        ids = sorted(image["ImageId"] for image in images if "ImageId" in image)
        assert ids, "moto lists no image"
        return ids[0]

    def instance_count(self) -> int:
        """How many instances the server holds, in any state."""
        client = self.ec2_client()
        try:
            reservations = client.describe_instances()["Reservations"]
        finally:
            client.close()
        return sum(len(reservation.get("Instances", [])) for reservation in reservations)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=deadline(10))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=deadline(10))
        self._log.close()


def start_moto(log_file: Path, env: Mapping[str, str] | None = None) -> MotoServer:
    """Start ``moto_server`` on a free loopback port with image validation on, plus ``env``; wait until it answers.

    The server gets no AWS_* variable from the test's environment. Its access log goes to ``log_file``.
    """
    port = free_port()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    environment["MOTO_ENABLE_AMI_VALIDATION"] = "true"
    environment.update(env or {})
    log = log_file.open("wb")
    process = subprocess.Popen(
        [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
    )
    server = MotoServer(url=f"http://127.0.0.1:{port}", process=process, log_file=log_file, log=log)
    ends = time.monotonic() + deadline(START_TIMEOUT)
    while True:
        if process.poll() is not None:
            server.stop()
            raise RuntimeError(f"moto_server exited with {process.returncode}: {log_file.read_text()[-2000:]}")
        try:
            if httpx.get(f"{server.url}/moto-api/", timeout=deadline(1)).status_code < 500:
                return server
        except httpx.TransportError:
            pass
        if time.monotonic() > ends:
            server.stop()
            raise RuntimeError(f"moto_server did not answer within {START_TIMEOUT:g} s")
        time.sleep(0.1)
