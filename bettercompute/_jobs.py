"""Background jobs: one pass each per ``tick()``, or loops on timers under leases after ``start(roles)``.

This is the first slice of the worker runtime: every job is a singleton under the lease ``<role>/<name>``, so any
number of processes may run the same roles and each pass still has one writer. Loops converge by polling alone; a
notifier only shortens the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import random
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING

import anyio
import attrs

from .errors import ComputeError, InvalidConfigError
from .ports import Lease, OutboxEvent, StoredEvent

if TYPE_CHECKING:
    from ._core import ModuleContext

__all__ = ["ROLES", "Events", "Job", "Jobs"]

log = logging.getLogger("bettercompute.jobs")

ROLES = frozenset({"controllers", "scheduler", "sinks", "iam"})


@attrs.frozen(kw_only=True)
class Job:
    """A periodic job. ``run`` makes one pass and returns how many items it handled."""

    name: str
    role: str
    interval: dt.timedelta
    run: Callable[[ModuleContext], Awaitable[int]]

    @property
    def lease_name(self) -> str:
        """The singleton lease the job runs under."""
        return f"{self.role}/{self.name}"


Subscriber = Callable[[StoredEvent], Awaitable[None]]


class Events:
    """In-process subscribers of committed events. A subscriber runs only after the event's transaction commits,
    at least once, in per-key order; an exception makes the event come back later."""

    def __init__(self) -> None:
        self._subscribers: list[tuple[frozenset[str] | None, Subscriber]] = []

    def subscribe(self, subscriber: Subscriber, *, types: Collection[str] | None = None) -> Callable[[], None]:
        """Call ``subscriber`` for committed events (of ``types`` only, when given); returns an unsubscribe."""
        entry = (frozenset(types) if types is not None else None, subscriber)
        self._subscribers.append(entry)

        def unsubscribe() -> None:
            if entry in self._subscribers:
                self._subscribers.remove(entry)

        return unsubscribe

    @staticmethod
    def event(type: str, key: str, **payload: object) -> OutboxEvent:
        """An event to publish with ``Transaction.publish``."""
        return OutboxEvent(type=type, key=key, payload=payload)

    async def deliver(self, event: StoredEvent) -> None:
        """Hand one event to every matching subscriber."""
        for types, subscriber in list(self._subscribers):
            if types is None or event.type in types:
                await subscriber(event)


async def dispatch_events(context: ModuleContext) -> int:
    """One pass of the outbox: claim deliverable events, hand them to ``events`` subscribers, acknowledge them."""
    store = context.store
    claimed = await store.outbox.claim(holder=context.instance, limit=100, claim_for=dt.timedelta(seconds=30))
    delivered: list[StoredEvent] = []
    failed: list[StoredEvent] = []
    for event in claimed:
        try:
            await context.events.deliver(event)
        except Exception as exc:
            log.warning("an event subscriber failed on %s %s: %s", event.type, event.id, type(exc).__name__)
            failed.append(event)
        else:
            delivered.append(event)
    if delivered:
        await store.outbox.ack(delivered)
    if failed:
        await store.outbox.release(failed, delay=dt.timedelta(seconds=5))
    return len(delivered)


def _check_roles(roles: Collection[str]) -> None:
    unknown = sorted(set(roles) - ROLES)
    if unknown:
        raise InvalidConfigError(
            f"unknown worker roles: {', '.join(unknown)}", details={"problems": unknown, "roles": sorted(ROLES)}
        )


BUILTIN_JOBS = (Job(name="events", role="sinks", interval=dt.timedelta(seconds=1), run=dispatch_events),)


class Jobs:
    """The jobs of one control plane."""

    def __init__(self, jobs: Sequence[Job], context: ModuleContext) -> None:
        seen: set[str] = set()
        problems: list[str] = []
        for job in jobs:
            if job.role not in ROLES:
                problems.append(f"job {job.name!r} has an unknown role {job.role!r}")
            if job.lease_name in seen:
                problems.append(f"job {job.lease_name!r} is registered twice")
            seen.add(job.lease_name)
        if problems:
            raise InvalidConfigError("the jobs are misdeclared", details={"problems": problems})
        self._jobs = sorted(jobs, key=lambda j: (j.role, j.name))
        self._context = context
        self._runner: asyncio.Task[None] | None = None
        self._held: dict[str, Lease] = {}

    @property
    def all(self) -> list[Job]:
        """Every registered job, in the order ``tick()`` runs them."""
        return list(self._jobs)

    async def tick(self, roles: Collection[str] | None = None) -> dict[str, int]:
        """One deterministic pass of every job (of ``roles``, when given), in a stable order. For tests and the
        simulator; it takes no leases, so call it where no worker loop runs."""
        done: dict[str, int] = {}
        for job in self._jobs:
            if roles is None or job.role in roles:
                done[job.lease_name] = await job.run(self._context)
        return done

    async def run(
        self, roles: Collection[str], *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the jobs of ``roles`` until cancelled, then hand their leases back (start it with ``tg.start``)."""
        _check_roles(roles)
        try:
            async with anyio.create_task_group() as tg:
                for job in self._jobs:
                    if job.role in roles:
                        await tg.start(self._loop, job)
                task_status.started()
        finally:
            held, self._held = self._held, {}
            with anyio.CancelScope(shield=True):
                for lease in held.values():
                    with contextlib.suppress(ComputeError):  # if the release fails, the lease expires by itself
                        await self._context.store.leases.release(lease)

    async def start(self, roles: Collection[str]) -> None:
        """Run the jobs of ``roles`` in a background task until ``stop()``, which any task may call."""
        _check_roles(roles)
        if self._runner is not None and not self._runner.done():
            return
        started = anyio.Event()

        async def runner() -> None:
            async with anyio.create_task_group() as tg:
                await tg.start(self.run, roles)
                started.set()

        # A task of its own, not a task group held open across calls: a host may call stop() from another task
        # (an ASGI lifespan shutdown, a signal handler) than the one that called start().
        self._runner = asyncio.get_running_loop().create_task(runner())
        waiter = asyncio.ensure_future(started.wait())
        done, _ = await asyncio.wait({self._runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if self._runner in done:
            waiter.cancel()
            runner_task, self._runner = self._runner, None
            runner_task.result()  # raises what made the runner fail

    async def stop(self) -> None:
        """Stop the loops and hand their leases back, so another process takes over at once."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner

    async def _loop(self, job: Job, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold the job's lease (renewed every third of its TTL) and run a pass every ``interval`` while held.

        ``started`` is signalled after the first attempt at the lease, so ``start()`` returns with leases taken
        where they were free.
        """
        store = self._context.store
        ttl = self._context.options.lease_ttl.total_seconds()
        interval = job.interval.total_seconds()
        next_run = 0.0
        failures = 0
        started = False
        while True:
            wait = ttl / 3
            try:
                held = self._held.get(job.lease_name)
                lease = await (
                    store.leases.renew(held, self._context.options.lease_ttl)
                    if held
                    else store.leases.acquire(job.lease_name, self._context.instance, self._context.options.lease_ttl)
                )
                if lease is None:
                    self._held.pop(job.lease_name, None)
                else:
                    self._held[job.lease_name] = lease
                if not started:
                    task_status.started()
                    started = True
                if lease is not None and anyio.current_time() >= next_run:
                    with anyio.fail_after(ttl * 2 / 3):
                        await job.run(self._context)
                    next_run = anyio.current_time() + interval
                    wait = min(interval, ttl / 3)
                failures = 0
            except Exception as exc:
                if not started:
                    task_status.started()
                    started = True
                failures += 1
                wait = min(60.0, interval * math.pow(2, min(failures, 6)))
                log.warning("job %s failed (%s); retrying in about %.0f s", job.lease_name, type(exc).__name__, wait)
            await anyio.sleep(wait * random.uniform(0.8, 1.2))  # noqa: S311 - jitter, not security
