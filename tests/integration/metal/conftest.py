"""Fixtures for the metal tests: a running Redfish emulator per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ._bmc import Bmc, start_bmc


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[Bmc]:
    """A sushy-tools emulator on loopback (TLS, basic auth, one fake system that is off); stopped after the test.

    A missing emulator fails the test: sushy-tools is a dev dependency, not an optional one.
    """
    server = start_bmc(tmp_path / "bmc")
    try:
        yield server
    finally:
        server.stop()
