"""Fixtures for the VPS tests: moto's EC2 server, one per test session, emptied before each test.

Tests elsewhere can reuse them by importing them into their own conftest
(``from tests.integration.vps.conftest import moto_ec2, moto_ec2_server, moto_ami``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from bettercompute_vps import Ec2Adapter, Ec2Credentials, Ec2Settings

from ._moto import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, MotoServer, start_moto


@pytest.fixture(scope="session")
def moto_ec2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """``moto_server`` on loopback for the whole session (image validation on, any credentials accepted)."""
    server = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def moto_ec2(moto_ec2_server: MotoServer) -> str:
    """The endpoint URL of an EC2 API with no instances (moto, reset before the test)."""
    moto_ec2_server.reset()
    return moto_ec2_server.url


@pytest.fixture
def moto_ami(moto_ec2: str, moto_ec2_server: MotoServer) -> str:
    """An image id that ``moto_ec2`` accepts for RunInstances."""
    return moto_ec2_server.usable_ami()


def ec2_adapter(
    endpoint_url: str, *, secret_access_key: str = SECRET_ACCESS_KEY, read_timeout: float = 30.0
) -> Ec2Adapter:
    """An ``Ec2Adapter`` for a moto endpoint with the tests' credentials."""
    return Ec2Adapter(
        Ec2Settings(region=REGION, endpoint_url=endpoint_url, connect_timeout=2.0, read_timeout=read_timeout),
        Ec2Credentials(access_key_id=ACCESS_KEY_ID, secret_access_key=secret_access_key),
    )


@pytest.fixture
async def ec2(moto_ec2: str) -> AsyncIterator[Ec2Adapter]:
    """An ``Ec2Adapter`` on ``moto_ec2``, closed after the test."""
    adapter = ec2_adapter(moto_ec2)
    try:
        yield adapter
    finally:
        await adapter.aclose()
