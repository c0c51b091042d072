"""Background jobs and reconcilers: one pass of everything per ``tick()``, or loops after ``start(roles)``.

Every job is a singleton under the lease ``<role>/<name>``, so any number of processes may run the same roles and
each pass still has one writer. Reconcilers run on sharded work (``_workers``): each worker process holds the shard
leases rendezvous hashing gives it. Loops converge by polling alone; a notifier only shortens the wait: reconcile
loops wake when work is enqueued, and the ``sinks`` jobs (events, webhooks) on the ``@sinks`` poke, sent after a
commit that published events and after an events pass handed some to subscribers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
import logging
import math
import random
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio
import attrs

from bettercompute._runtime.events import Events
from bettercompute._runtime.reconcile import Reconciler
from bettercompute._runtime.workers import SINKS_POKE, WORK_CHANNEL, ShardedWorker, _Wake, notify_work, reconcile_one
from bettercompute.errors import ComputeError, InvalidConfigError, UnavailableError
from bettercompute.ports import Lease, StoredEvent, Transaction

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = ["ROLES", "SINKS_POKE", "Events", "Job", "Jobs", "job_transaction"]

log = logging.getLogger("bettercompute.jobs")

ROLES = frozenset({"controllers", "scheduler", "sinks", "iam"})

_job_lease: contextvars.ContextVar[Lease | None] = contextvars.ContextVar("bettercompute_job_lease", default=None)


def job_transaction(context: ModuleContext) -> contextlib.AbstractAsyncContextManager[Transaction]:
    """A transaction fenced by the lease of the job pass running it (unfenced in ``tick()``, which holds no
    lease): if the job's lease was lost and taken over, its writes are refused with ``FailedPreconditionError``."""
    return context.store.transaction(fence=_job_lease.get())


@attrs.frozen(kw_only=True)
class Job:
    """A periodic job. ``run`` makes one pass and returns how many items it handled.

    A pass runs while its lease is renewed beside it, for at most ``budget``; it is cancelled when the lease is lost
    (or at ``stop()``), so a pass must keep the progress it made when cancelled (record it in a shielded
    ``finally``).

    Args:
        interval: The time between two passes; ``None`` for ``Options.poll_interval``.
        wake_on: A notifier poke (a ``WORK_CHANNEL`` payload such as ``SINKS_POKE``) that starts a pass at once
            on the process holding the job's lease. A pass of such a job that handled something is followed by
            another at once (what it did may have made more due). Pokes only shorten waits: the job still runs
            every ``interval``, so a lost poke, or no notifier at all, costs at most that.
    """

    name: str
    role: str
    interval: dt.timedelta | None
    run: Callable[[ModuleContext], Awaitable[int]]
    budget: dt.timedelta = dt.timedelta(minutes=5)
    wake_on: str | None = None

    @property
    def lease_name(self) -> str:
        """The singleton lease the job runs under."""
        return f"{self.role}/{self.name}"


async def dispatch_events(context: ModuleContext) -> int:
    """One pass of the outbox: claim deliverable events, hand them to ``events`` subscribers, acknowledge them."""
    store = context.store
    claimed = await store.outbox.claim(holder=context.instance, limit=100, claim_for=dt.timedelta(seconds=30))
    delivered: list[StoredEvent] = []
    failed: list[StoredEvent] = []
    try:
        for event in claimed:
            try:
                await context.events.deliver(event)
            except Exception as exc:
                log.warning("an event subscriber failed on %s %s: %s", event.type, event.id, type(exc).__name__)
                failed.append(event)
            else:
                delivered.append(event)
    finally:
        # Even when the pass is cancelled (lease lost, stop()), keep what it did and hand the rest back at once:
        # otherwise the delivered events would come again and the untried ones wait for their claim to expire.
        untried = claimed[len(delivered) + len(failed) :]
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            if delivered:
                await store.outbox.ack(delivered)
            if failed:
                await store.outbox.release(failed, delay=dt.timedelta(seconds=5))
            if untried:
                await store.outbox.release(untried, delay=dt.timedelta(0))
    if delivered:
        # Subscribers may have queued work for the other sinks jobs (webhook deliveries): wake whichever process
        # holds them.
        await notify_work(context, SINKS_POKE)
    return len(delivered)


_BLIP_RETRY = 0.5
"""Seconds before a job loop first retries after the database could not be reached; doubled per failure."""


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or every exception grouped in it, as a task group raises them) says the database could not
    be reached or asked for a retry: ``UnavailableError``."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_unreachable(inner) for inner in exc.exceptions)
    return isinstance(exc, UnavailableError)


def _check_roles(roles: Collection[str]) -> None:
    unknown = sorted(set(roles) - ROLES)
    if unknown:
        raise InvalidConfigError(
            f"unknown worker roles: {', '.join(unknown)}", details={"problems": unknown, "roles": sorted(ROLES)}
        )


async def purge_idempotency_keys(context: ModuleContext) -> int:
    """Delete the idempotency keys whose answers are past keeping, a batch at a time."""
    return await context.store.idempotency.purge(limit=10_000)


BUILTIN_JOBS = (
    Job(name="events", role="sinks", interval=None, run=dispatch_events, wake_on=SINKS_POKE),
    Job(name="idempotency-purge", role="controllers", interval=dt.timedelta(minutes=5), run=purge_idempotency_keys),
)


TICK_BATCH = 500


@runtime_checkable
class _PublishHooks(Protocol):
    """A store that says when a commit published outbox events (``PgStore`` does; ``Store`` does not require it)."""

    def on_published(self, listener: Callable[[], Awaitable[None]]) -> Callable[[], None]: ...


class Jobs:
    """The jobs and reconcilers of one control plane.

    Args:
        jobs: Singleton jobs.
        context: The control plane's parts.
        reconcilers: Every module's reconcilers (kinds unique).
        injected_clock: Whether ``context.clock`` was injected (``Options.clock``): then ``tick()`` decides what is
            due by it rather than by the database's clock.
    """

    def __init__(
        self,
        jobs: Sequence[Job],
        context: ModuleContext,
        reconcilers: Sequence[Reconciler] = (),
        *,
        injected_clock: bool = False,
    ) -> None:
        seen: set[str] = set()
        problems: list[str] = []
        for job in jobs:
            if job.role not in ROLES:
                problems.append(f"job {job.name!r} has an unknown role {job.role!r}")
            if job.lease_name in seen:
                problems.append(f"job {job.lease_name!r} is registered twice")
            seen.add(job.lease_name)
        kinds: set[str] = set()
        untyped: Sequence[object] = reconcilers  # a module may declare anything: check what is really there
        for reconciler in untyped:
            if not isinstance(reconciler, Reconciler):
                problems.append(f"{type(reconciler).__name__} is not a bettercompute.Reconciler")
                continue
            if reconciler.kind in kinds:
                problems.append(f"reconciler kind {reconciler.kind!r} is registered twice")
            kinds.add(reconciler.kind)
        if problems:
            raise InvalidConfigError("the jobs are misdeclared", details={"problems": problems})
        self._jobs = sorted(jobs, key=lambda j: (j.role, j.name))
        self._reconcilers = sorted(reconcilers, key=lambda r: r.kind)
        self._context = context
        self._injected_clock = injected_clock
        self._runner: asyncio.Task[None] | None = None
        self._held: dict[str, Lease] = {}
        self._worker: ShardedWorker | None = None
        self._wakes: dict[str, _Wake] = {}
        if context.notifier is not None:
            # Every process pokes after enqueuing or publishing (API processes too), whatever roles it runs.
            context.store.on_enqueued(self._poke)
            if isinstance(context.store, _PublishHooks):
                context.store.on_published(self._poke_sinks)

    async def _poke(self, kinds: frozenset[str]) -> None:
        notifier = self._context.notifier
        if notifier is not None:
            with anyio.fail_after(2):
                await notifier.notify(WORK_CHANNEL, ",".join(sorted(kinds)))

    async def _poke_sinks(self) -> None:
        await notify_work(self._context, SINKS_POKE)

    def _on_job_poke(self, payload: str) -> None:
        for job in self._jobs:
            wake = self._wakes.get(job.lease_name)
            if wake is not None and job.wake_on == payload:
                wake.poke()

    @property
    def reconcilers(self) -> list[Reconciler]:
        """Every registered reconciler, by kind."""
        return list(self._reconcilers)

    @property
    def worker(self) -> ShardedWorker | None:
        """This process's sharded worker while roles run (its ``id`` is the holder of its shard leases)."""
        return self._worker

    @property
    def all(self) -> list[Job]:
        """Every registered job, in the order ``tick()`` runs them."""
        return list(self._jobs)

    async def tick(self, roles: Collection[str] | None = None) -> dict[str, int]:
        """One deterministic pass (of ``roles``, when given), for tests and the simulator.

        First every singleton job, by role and name; then every work item due now, over all shards, claimed before
        any runs and reconciled one at a time in (kind, key) order. Items that a pass requeues or retries are due
        again at a later tick, never in this one. It takes no leases, so call it where no worker loop runs.

        Time: with an injected clock (``Options.clock``, such as ``testing.ManualClock``), "due" means ``run_at`` at
        or before the clock's now, and retry and requeue delays count from it; items enqueued without ``run_at``
        are stamped with the database's now, so start a manual clock at or after the database's time. Without one,
        the database's clock decides. Retry jitter is a function of kind, key and attempt, so the same start state
        gives the same result.

        Returns:
            Items handled per job (``<role>/<name>``) and per reconciler kind (``reconcile:<kind>``).
        """
        done: dict[str, int] = {}
        for job in self._jobs:
            if roles is None or job.role in roles:
                done[job.lease_name] = await job.run(self._context)
        reconcilers = {r.kind: r for r in self._reconcilers if roles is None or r.role in roles}
        if not reconcilers:
            return done
        now = self._context.clock.now() if self._injected_clock else None
        claim_for = max(r.deadline for r in reconcilers.values()) + self._context.lease_ttl
        claims = []
        while True:
            batch = await self._context.store.queue.claim(
                holder=f"{self._context.instance}/tick",
                kinds=sorted(reconcilers),
                limit=TICK_BATCH,
                claim_for=claim_for,
                now=now,
            )
            claims.extend(batch)
            if len(batch) < TICK_BATCH:
                break
        for kind in reconcilers:
            done[f"reconcile:{kind}"] = 0
        for claim in sorted(claims, key=lambda c: (c.kind, c.key)):
            await reconcile_one(self._context, reconcilers[claim.kind], claim, None, now)
            done[f"reconcile:{claim.kind}"] += 1
        return done

    async def run(
        self, roles: Collection[str], *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the jobs of ``roles`` until cancelled, then hand their leases back (start it with ``tg.start``)."""
        _check_roles(roles)
        try:
            async with anyio.create_task_group() as tg:
                self._wakes = {job.lease_name: _Wake() for job in self._jobs if job.role in roles and job.wake_on}
                self._worker = ShardedWorker(self._context, self._reconcilers, roles, self._on_job_poke)
                await tg.start(self._worker.run)
                for job in self._jobs:
                    if job.role in roles:
                        await tg.start(self._loop, job)
                task_status.started()
        finally:
            self._worker = None
            self._wakes = {}
            held, self._held = self._held, {}
            self._count_leases()
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

    def _count_leases(self, *, acquired: int = 0, lost: int = 0) -> None:
        """The singleton leases' metrics: how many are held now, and those just taken or lost."""
        metrics = self._context.metrics
        if acquired:
            metrics.leases_acquired.labels("singleton").inc(acquired)
        if lost:
            metrics.leases_lost.labels("singleton").inc(lost)
        metrics.leases_held.labels("singleton").set(len(self._held))

    async def _pass(self, job: Job, lease: Lease) -> int:
        """One pass of ``job`` while a companion task renews its lease; losing the lease cancels the pass.

        Returns how many items the pass handled (0 when it was cancelled).
        """
        store = self._context.store
        ttl = self._context.lease_ttl

        async with anyio.create_task_group() as tg:

            async def keep(current: Lease) -> None:
                while True:
                    await anyio.sleep(ttl.total_seconds() / 3)
                    renewed = await store.leases.renew(current, ttl)
                    if renewed is None:
                        log.warning("job %s lost its lease during a pass; the pass stops", job.lease_name)
                        self._held.pop(job.lease_name, None)
                        self._count_leases(lost=1)
                        tg.cancel_scope.cancel()
                        return
                    current = self._held[job.lease_name] = renewed

            tg.start_soon(keep, lease)
            token = _job_lease.set(lease)
            handled = 0  # stays 0 when losing the lease cancels the pass
            try:
                with anyio.fail_after(job.budget.total_seconds()):
                    handled = await job.run(self._context)
            finally:
                _job_lease.reset(token)
            tg.cancel_scope.cancel()
        return handled

    async def _loop(self, job: Job, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold the job's lease (renewed every third of its TTL) and run a pass every ``interval`` while held, or at
        once when a ``wake_on`` poke comes (or a pass of such a job handled something).

        ``started`` is signalled after the first attempt at the lease, so ``start()`` returns with leases taken
        where they were free.
        """
        store = self._context.store
        ttl = self._context.lease_ttl.total_seconds()
        interval = (job.interval or self._context.poll_interval).total_seconds()
        wake = self._wakes.get(job.lease_name)
        next_run = 0.0
        failures = 0
        started = False
        while True:
            wait = ttl / 3
            wakeable = False
            try:
                held = self._held.get(job.lease_name)
                lease = await (
                    store.leases.renew(held, self._context.lease_ttl)
                    if held
                    else store.leases.acquire(job.lease_name, self._context.instance, self._context.lease_ttl)
                )
                if lease is None:
                    self._held.pop(job.lease_name, None)
                    self._count_leases(lost=int(held is not None))
                else:
                    self._held[job.lease_name] = lease
                    self._count_leases(acquired=int(held is None))
                if not started:
                    task_status.started()
                    started = True
                again = False
                if lease is not None and anyio.current_time() >= next_run:
                    handled = await self._pass(job, lease)
                    # What a poked job did may have made more due (the next event of a key): no poke would say so.
                    again = wake is not None and handled > 0
                    next_run = anyio.current_time() + (0.0 if again else interval)
                if lease is not None:
                    # Wake for the next pass (or the next renewal, whichever comes first), not a fixed nap that
                    # may end just before the pass is due and then skip it for a whole renewal period.
                    wait = 0.0 if again else max(0.05, min(ttl / 3, next_run - anyio.current_time()))
                    wakeable = True  # only the lease's holder heeds pokes; the others retry the lease on their own
                failures = 0
            except Exception as exc:
                if not started:
                    task_status.started()
                    started = True
                failures += 1
                unreachable = _unreachable(exc)
                reason = "UNAVAILABLE" if unreachable else type(exc).__name__
                if unreachable:
                    # The database is away, maybe only for a restart: retry at least every sixth of the TTL, so that
                    # the lease (kept in _held) is renewed before it lapses, even when the outage began just before
                    # a renewal was due, and no other process takes the job over. Backing off by the job's interval
                    # would pause a minute-interval job for minutes after a blip, and lose its lease.
                    wait = min(ttl / 6, _BLIP_RETRY * math.pow(2, min(failures - 1, 6)))
                else:
                    wait = min(60.0, interval * math.pow(2, min(failures, 6)))
                log.warning("job %s failed (%s); retrying in about %.1f s", job.lease_name, reason, wait)
            nap = wait * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not security
            if wake is not None and wakeable:
                if await wake.sleep(nap):
                    next_run = 0.0
            else:
                await anyio.sleep(nap)
