"""The gateway raises the process's young-generation collector threshold when it starts (``gc_young_threshold``),
and leaves it alone when told to: Python's 700 cost a 15,000-session gateway a quarter of its CPU in collections."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import attrs
import pytest

from bettercompute_gateway import create_gateway

from .conftest import Wire

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@pytest.fixture
def python_thresholds() -> Iterator[None]:
    """Python's own thresholds for the test, and the process's put back after it."""
    kept = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*kept)


async def test_a_gateway_starting_raises_the_young_threshold_unless_told_not_to(
    python_thresholds: None, gw: Wire
) -> None:
    gc.set_threshold(700, 10, 10)
    left = create_gateway(
        gw.fleet.services, gw.fleet.store, gw.gateway._tls, attrs.evolve(gw.gateway.options, gc_young_threshold=None)
    )
    await left.start("127.0.0.1", 0)
    try:
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        await left.close()
    raised = create_gateway(gw.fleet.services, gw.fleet.store, gw.gateway._tls, gw.gateway.options)
    await raised.start("127.0.0.1", 0)
    try:
        assert gc.get_threshold() == (50_000, 10, 10)
    finally:
        await raised.close()
    gc.set_threshold(60_000, 10, 10)  # never lowered
    again = create_gateway(gw.fleet.services, gw.fleet.store, gw.gateway._tls, gw.gateway.options)
    await again.start("127.0.0.1", 0)
    try:
        assert gc.get_threshold() == (60_000, 10, 10)
    finally:
        await again.close()
