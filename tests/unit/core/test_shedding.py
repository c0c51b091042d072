"""``LoadShedder`` on its own: slots, a bounded queue served in arrival order, shedding past it, and places given up by
calls that are cancelled or whose client left; ``retry_delay`` reads only a shed answer."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from bettercompute._runtime.shedding import PRESENCE, LoadShedder, Presence, retry_delay

pytestmark = pytest.mark.anyio


async def settle() -> None:
    for _ in range(10):
        await anyio.lowlevel.checkpoint()


async def test_calls_past_the_queue_are_shed_and_the_queue_is_served_in_order() -> None:
    shedder = LoadShedder(2, 3)
    started: list[int] = []
    results: dict[int, bool] = {}
    release = anyio.Event()

    async def call(i: int) -> None:
        results[i] = admitted = await shedder.acquire()
        if admitted:
            started.append(i)
            await release.wait()
            shedder.release()

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(call, i)
            await settle()  # in this order
        assert started == [0, 1] and shedder.waiting == 3 and shedder.full
        assert [i for i, ok in results.items() if not ok] == [5, 6, 7, 8, 9]
        release.set()
    assert started == [0, 1, 2, 3, 4]
    assert (shedder.in_flight, shedder.waiting, shedder.shed, shedder.peak_waiting) == (0, 0, 5, 3)


async def test_no_queue_sheds_as_soon_as_every_slot_is_busy() -> None:
    shedder = LoadShedder(1, 0)
    assert await shedder.acquire()
    assert shedder.full and not await shedder.acquire()
    shedder.release()
    assert await shedder.acquire()


async def test_a_cancelled_waiter_leaves_the_queue_and_no_slot_is_lost() -> None:
    shedder = LoadShedder(1, 2)
    assert await shedder.acquire()
    got: list[str] = []

    async def wait(name: str) -> None:
        if await shedder.acquire():
            got.append(name)
            shedder.release()

    async with anyio.create_task_group() as tg:
        async with anyio.create_task_group() as doomed:
            doomed.start_soon(wait, "cancelled")
            await settle()
            assert shedder.waiting == 1
            doomed.cancel_scope.cancel()
        assert shedder.waiting == 0
        tg.start_soon(wait, "next")
        await settle()
        shedder.release()
    assert got == ["next"] and (shedder.in_flight, shedder.waiting) == (0, 0)

    # Cancelled as the slot is handed to it: whether it still runs (anyio lets a task whose wait is over resume) or
    # not, the slot is not lost and the next waiter runs.
    assert await shedder.acquire()
    async with anyio.create_task_group() as tg, anyio.create_task_group() as doomed:
        doomed.start_soon(wait, "handed")
        await settle()
        tg.start_soon(wait, "after")
        await settle()
        shedder.release()  # to "handed", which is cancelled before it resumes
        doomed.cancel_scope.cancel()
    assert got[0] == "next" and got[-1] == "after" and (shedder.in_flight, shedder.waiting) == (0, 0)


async def test_a_waiter_whose_client_left_gives_its_place_up() -> None:
    shedder = LoadShedder(1, 1)
    assert await shedder.acquire()
    presence = Presence()
    outcome: list[bool] = []

    async def wait() -> None:
        PRESENCE.set(presence)
        outcome.append(await shedder.acquire())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await settle()
        assert shedder.full
        presence.leave()
    assert outcome == [False] and shedder.waiting == 0 and not shedder.full
    shedder.release()
    assert shedder.in_flight == 0


SHED: dict[str, Any] = {"error": {"code": "UNAVAILABLE", "details": {"reason": "overloaded", "retry_after": 2}}}


@pytest.mark.parametrize(
    ("status", "headers", "payload", "expected"),
    [
        (503, {"retry-after": "2"}, SHED, 2.0),
        (503, {"retry-after": " 3 "}, SHED, 3.0),
        (429, {"retry-after": "2"}, SHED, None),
        (503, {}, SHED, None),
        (503, {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, SHED, None),  # only whole seconds
        (503, {"retry-after": "-1"}, SHED, None),
        (503, {"retry-after": "\u0662"}, SHED, None),  # an Arabic-Indic two is a digit to str.isdigit()
        (503, {"retry-after": "99999999"}, SHED, None),
        # An UNAVAILABLE that is not a shed (the database went away mid-call): it may have run, so no retry.
        (503, {"retry-after": "2"}, {"error": {"code": "UNAVAILABLE", "details": {}}}, None),
        (503, {"retry-after": "2"}, {"error": {"code": "INTERNAL", "details": {"reason": "overloaded"}}}, None),
        (503, {"retry-after": "2"}, None, None),
        (503, {"retry-after": "2"}, [1], None),
    ],
)
def test_retry_delay_reads_only_a_shed_answer(
    status: int, headers: dict[str, str], payload: Any, expected: float | None
) -> None:
    assert retry_delay(status, headers, payload) == expected
