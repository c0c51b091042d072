"""A module's own tunnels: a method of its that opens one with ``open_tunnel_in`` in its transaction, and its
``tunnel_checks`` entry that closes the open ones when its resource says so (as the VPS module's ``instances.tunnel``
will for a stopped instance)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import attrs
import pytest

from bettercompute import (
    CallContext,
    GroupSpec,
    Job,
    ModuleContext,
    TunnelRecord,
    __version__,
    method,
    open_tunnel_in,
)
from bettercompute.ports import Migration, ResourceRef, Store
from tests._timing import deadline

from .conftest import Wire
from .test_tunnels import close_reason, echo_server, exchange, node, tunnel_stream

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

B = TypeVar("B")
STOPPED: set[str] = set()
"""The gadgets stopped now (what the module's check reads)."""


@attrs.frozen(kw_only=True)
class GadgetTunnelInput:
    tenant: str
    gadget_id: str
    node_id: str
    port: int


@attrs.frozen(kw_only=True)
class GadgetTunnel:
    tunnel_id: str
    ticket: str


@method(mutates=True, resource=lambda i: ResourceRef(type="gadget", id=i.gadget_id, tenant=i.tenant))
async def tunnel_gadget(call: CallContext, input: GadgetTunnelInput) -> GadgetTunnel:
    assert call.identity is not None
    async with call.transaction() as tx:
        opened = await open_tunnel_in(
            tx,
            tenant=input.tenant,
            identity=call.identity,
            node_id=input.node_id,
            host="127.0.0.1",
            port=input.port,
            resource=ResourceRef(type="gadget", id=input.gadget_id),
            action=call.method.action,
        )
    return GadgetTunnel(tunnel_id=opened.tunnel_id, ticket=opened.ticket)


class Gadgets(GroupSpec[B]):
    """Gadgets that run on nodes."""

    name = "gadgets"
    tunnel = tunnel_gadget


async def gadget_check(store: Store, tunnel: TunnelRecord, now: dt.datetime) -> str | None:
    return "gadget_stopped" if tunnel.resource_id in STOPPED else None


@attrs.define
class GadgetModule:
    name: str = "gadgets"
    version: str = "1.0.0"
    core_range: str = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (Gadgets,)
    actions: Sequence[str] = ()
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(factory=dict)
    jobs: Sequence[Job] = ()
    tunnel_checks: Mapping[str, Any] = attrs.field(factory=lambda: {"gadget": gadget_check})

    async def start(self, context: ModuleContext) -> None:
        pass

    async def stop(self) -> None:
        pass


@pytest.fixture
def modules() -> Sequence[Any]:
    return [GadgetModule()]


@pytest.fixture
async def stopped() -> AsyncIterator[set[str]]:
    STOPPED.clear()
    yield STOPPED
    STOPPED.clear()


async def test_a_modules_check_closes_its_open_tunnels_within_two_seconds(
    gw: Wire, tmp_path: Path, stopped: set[str]
) -> None:
    async with echo_server() as port, node(gw, tmp_path, "SN-G1", (port,)) as n:
        opened: GadgetTunnel = await gw.fleet.compute.api.group(Gadgets).tunnel(
            gw.fleet.alice, GadgetTunnelInput(tenant=gw.fleet.acme, gadget_id="gd_1", node_id=n.node_id, port=port)
        )
        async with tunnel_stream(gw, opened.ticket) as stream:
            assert await exchange(stream, b"running") == b"running"
            await asyncio.sleep(1.5)  # checked at least once, and kept
            assert await exchange(stream, b"still") == b"still"
            stopped.add("gd_1")
            with anyio.fail_after(deadline(2.0)):
                assert await close_reason(stream) == "gadget_stopped"
            with contextlib.suppress(Exception):
                await stream.end()
