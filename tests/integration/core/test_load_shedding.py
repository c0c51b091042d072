"""Load shedding, at small scale: a control plane on PostgreSQL, served by uvicorn on loopback, with two calls in
flight and (by default) two waiting. A burst of twelve times that many calls to a method that holds its slot until
the test lets it go: the four that fit run and answer 200, every other one is answered at once with 503
``UNAVAILABLE``, ``Retry-After`` and the envelope, the health endpoints answer meanwhile, and afterwards everything
is served again. Every assertion is a count, a status or a header: nothing here is timed.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import attrs
import httpx
import pytest
import uvicorn

from bettercompute import (
    BetterCompute,
    CallContext,
    GroupSpec,
    Job,
    ModuleContext,
    Options,
    Request,
    better_compute,
    method,
)
from bettercompute.client import AsyncClient
from bettercompute.errors import UnavailableError
from bettercompute.ports import Migration
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

pytestmark = [pytest.mark.pg, pytest.mark.anyio]

B = TypeVar("B")
IN_FLIGHT = 2
QUEUED = IN_FLIGHT  # the default: as many as run at once
BURST = 12 * IN_FLIGHT


@attrs.frozen(kw_only=True)
class HoldInput:
    tag: str = ""


@attrs.frozen(kw_only=True)
class HoldOutput:
    tag: str


@attrs.define
class Holding:
    """What the held calls did: how many ran, how many at once at most; ``gate`` lets them finish."""

    gate: anyio.Event = attrs.field(factory=anyio.Event)
    entered: int = 0
    running: int = 0
    most: int = 0
    tags: list[str] = attrs.field(factory=list)


holding = Holding()


@method(mutates=False)
async def wait(call: CallContext, input: HoldInput) -> HoldOutput:
    """Hold the slot until the test opens the gate."""
    holding.entered += 1
    holding.running += 1
    holding.most = max(holding.most, holding.running)
    holding.tags.append(input.tag)
    try:
        await holding.gate.wait()
    finally:
        holding.running -= 1
    return HoldOutput(tag=input.tag)


class HoldGroup(GroupSpec[B]):
    """Calls that take as long as the test says."""

    name = "hold"
    wait = wait


@attrs.frozen(kw_only=True)
class HoldModule:
    name: str = "hold"
    version: str = "1.0.0"
    core_range: str = ">=0.1,<0.2"
    groups: Sequence[type[GroupSpec[Any]]] = (HoldGroup,)
    actions: Sequence[str] = ("compute:hold:wait",)
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(factory=dict)
    jobs: Sequence[Job] = ()

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None


@attrs.frozen(kw_only=True)
class Served:
    compute: BetterCompute
    root: str
    port: int
    http: httpx.AsyncClient

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.root}"}

    async def hold(self, tag: str) -> httpx.Response:
        return await self.http.post("/api/compute/hold/wait", headers=self.headers, json={"tag": tag})


@pytest.fixture
async def served(database_url: str, fresh_schema: str) -> AsyncIterator[Served]:
    global holding
    holding = Holding()
    store = PgStore(database_url, schema=fresh_schema, pool_size=4)
    iam = EmbeddedIam()
    options = Options(store=store, iam=iam, modules=[HoldModule()], instance="test-1", max_in_flight=IN_FLIGHT)
    compute = better_compute(options)
    assert (compute.max_in_flight, compute.max_queued) == (IN_FLIGHT, QUEUED)
    await compute.initialize()
    boot = await iam.bootstrap()
    assert boot.credential is not None
    # TCP named, so that asyncio turns Nagle off on its connections; listening before uvicorn starts, so
    # connections wait in the backlog and there is no start-up to wait for.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    port = listener.getsockname()[1]
    config = uvicorn.Config(compute.asgi, lifespan="off", log_level="warning", http="h11", ws="none")
    server = uvicorn.Server(config)
    limits = httpx.Limits(max_connections=BURST + 8, max_keepalive_connections=BURST + 8)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [listener])
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits) as http:
                    yield Served(compute=compute, root=boot.credential, port=port, http=http)
            finally:
                holding.gate.set()  # nothing left hanging when a test fails
                server.should_exit = True
    finally:
        await compute.close()


async def until(condition: Any) -> None:
    """Wait for ``condition()`` to hold (the test's timeout bounds it)."""
    while not condition():  # noqa: ASYNC110 - the states polled (counters, answers) have no event to wait on
        await anyio.sleep(0.005)


def assert_shed(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": {
            "code": "UNAVAILABLE",
            "message": "the server is at capacity and did not run the call; retry after 1 s",
            "details": {"reason": "overloaded", "retry_after": 1},
            "retryable": True,
        }
    }


async def test_a_burst_past_the_queue_is_shed_and_the_admitted_calls_complete(served: Served) -> None:
    answers: dict[str, httpx.Response] = {}

    async def one(tag: str) -> None:
        answers[tag] = await served.hold(tag)

    async with anyio.create_task_group() as tg:
        for i in range(BURST):
            tg.start_soon(one, f"c{i}")
        # Two calls run and hold their slots, two wait, every other one has its answer: nothing more can change
        # until the gate opens.
        await until(lambda: holding.entered == IN_FLIGHT and len(answers) == BURST - IN_FLIGHT - QUEUED)
        shed = list(answers.values())
        assert len(shed) == BURST - IN_FLIGHT - QUEUED
        for response in shed:
            assert_shed(response)

        # Overloaded, the process still answers its probes and serves its OpenAPI document; a further call is shed.
        assert (await served.http.get("/healthz")).json() == {"status": "ok"}
        ready = await served.http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ok"
        assert (await served.http.get("/api/compute/openapi.json")).status_code == 200
        assert_shed(await served.http.post("/api/compute/system/version", headers=served.headers, json={}))
        # A call shed while the queue is full is answered without its body being read: a large one is shed too
        # (not refused as too large, which would mean it was read).
        big = await served.http.post("/api/compute/hold/wait", headers=served.headers, json={"tag": "x" * 2_000_000})
        assert_shed(big)
        assert holding.entered == IN_FLIGHT

        holding.gate.set()
    admitted = {tag: r for tag, r in answers.items() if r.status_code == 200}
    assert len(admitted) == IN_FLIGHT + QUEUED
    assert all(r.json() == {"data": {"tag": tag}} for tag, r in admitted.items())
    assert sorted(holding.tags) == sorted(admitted)  # every admitted call ran, and no shed one did
    assert holding.most == IN_FLIGHT
    assert sum(r.status_code == 503 for r in answers.values()) == BURST - IN_FLIGHT - QUEUED
    assert {r.status_code for r in answers.values()} == {200, 503}  # never a 500

    # After the burst, everything is served again: as many calls as fit at once, and the others.
    async with anyio.create_task_group() as tg:
        for i in range(IN_FLIGHT + QUEUED):
            tg.start_soon(one, f"after{i}")
    assert all(answers[f"after{i}"].status_code == 200 for i in range(IN_FLIGHT + QUEUED))
    version = await served.http.post("/api/compute/system/version", headers=served.headers, json={})
    assert version.status_code == 200, version.text


async def test_a_waiting_call_whose_client_left_gives_its_place_up(served: Served) -> None:
    admission = served.compute._http.shedder
    holders: list[httpx.Response] = []

    async def hold(tag: str) -> None:
        holders.append(await served.hold(tag))

    async with anyio.create_task_group() as tg:
        for i in range(IN_FLIGHT):
            tg.start_soon(hold, f"held{i}")
        await until(lambda: holding.entered == IN_FLIGHT)
        # Two more clients queue, then hang up before a slot comes.
        body = b'{"tag":"gone"}'
        request = (
            f"POST /api/compute/hold/wait HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {served.root}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode() + body
        streams = [await anyio.connect_tcp("127.0.0.1", served.port) for _ in range(QUEUED)]
        for stream in streams:
            await stream.send(request)
        await until(lambda: admission.waiting == QUEUED)
        for stream in streams:
            await stream.aclose()
        await until(lambda: admission.waiting == 0)
        # Their places are free: two more calls queue instead of being shed, and run once the gate opens.
        for i in range(QUEUED):
            tg.start_soon(hold, f"later{i}")
        await until(lambda: admission.waiting == QUEUED)
        holding.gate.set()
    assert [r.status_code for r in holders] == [200] * (IN_FLIGHT + QUEUED)
    assert "gone" not in holding.tags and len(holding.tags) == IN_FLIGHT + QUEUED


async def test_the_in_process_handler_sheds_the_same_way(served: Served) -> None:
    compute = served.compute
    admission = compute._http.shedder
    answers: list[int] = []

    def request(tag: str) -> Request:
        headers = {**served.headers, "content-type": "application/json"}
        body = b'{"tag":"%s"}' % tag.encode()
        return Request(method="POST", path="/api/compute/hold/wait", headers=headers, body=body)

    async def one(tag: str) -> None:
        answers.append((await compute.handler(request(tag))).status)

    async with anyio.create_task_group() as tg:
        for i in range(IN_FLIGHT):
            tg.start_soon(one, f"h{i}")
        await until(lambda: holding.entered == IN_FLIGHT)
        # A waiting call that is cancelled leaves the queue.
        async with anyio.create_task_group() as inner:
            inner.start_soon(one, "cancelled")
            await until(lambda: admission.waiting == 1)
            inner.cancel_scope.cancel()
        assert (admission.in_flight, admission.waiting) == (IN_FLIGHT, 0)
        for i in range(IN_FLIGHT, BURST):
            tg.start_soon(one, f"h{i}")
        await until(lambda: len(answers) == BURST - IN_FLIGHT - QUEUED)
        assert answers == [503] * (BURST - IN_FLIGHT - QUEUED)
        shed = await compute.handler(request("more"))
        assert shed.status == 503 and shed.headers["retry-after"] == "1"
        assert shed.json()["error"]["details"] == {"reason": "overloaded", "retry_after": 1}
        holding.gate.set()
    assert sorted(answers) == [200] * (IN_FLIGHT + QUEUED) + [503] * (BURST - IN_FLIGHT - QUEUED)
    assert "cancelled" not in holding.tags and "more" not in holding.tags
    assert (admission.in_flight, admission.waiting) == (0, 0)


async def test_the_typed_client_sends_a_shed_call_again_after_retry_after(served: Served) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(IN_FLIGHT + QUEUED):
            tg.start_soon(served.hold, f"c{i}")
        await until(lambda: served.compute._http.shedder.full)
        client = AsyncClient(f"http://127.0.0.1:{served.port}", served.root)
        try:
            # No retry: the shed call is raised as UNAVAILABLE, saying it did not run.
            async with AsyncClient(f"http://127.0.0.1:{served.port}", served.root, shed_retries=0) as once:
                with pytest.raises(UnavailableError) as info:
                    await once.call(HoldGroup.wait, HoldInput(tag="no-retry"))
            assert info.value.details == {"reason": "overloaded", "retry_after": 1}
            # With retries (the default), the call is sent again after Retry-After; the gate opens meanwhile.
            result: list[HoldOutput] = []

            async def retried() -> None:
                result.append(await client.call(HoldGroup.wait, HoldInput(tag="retried")))

            tg.start_soon(retried)
            await until(lambda: served.compute._http.shedder.shed >= 2)  # its first attempt was shed
            holding.gate.set()
            await until(lambda: bool(result))
            assert result == [HoldOutput(tag="retried")]
        finally:
            await client.aclose()
    assert "no-retry" not in holding.tags and "retried" in holding.tags
