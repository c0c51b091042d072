"""The sharded half of the worker runtime: membership, shard leases, and the reconcile loops.

A worker process registers one membership row per role it runs (``Membership.heartbeat`` every third of the lease
TTL). For the ``controllers`` and ``scheduler`` roles it also holds the leases ``<role>/shard:<n>`` of the shards
rendezvous hashing gives it among the live members of the role: each cycle renews the held leases in one statement,
hands back those it should no longer own (once no pass on them is running), and takes those it should (one
statement each). A dead worker's shards pass on once its row and its leases have expired, about one TTL after its
last heartbeat.

The reconcile loop of a role claims due work only on the shards it holds, runs each item under its deadline, and
completes or retries it fenced by the shard lease. Loops poll; a notifier poke (``"work"`` channel) wakes them
sooner, and a membership change pokes the shard cycle the same way. The same listener hands the singleton job loops
their pokes (``@sinks``: see ``_jobs``).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import random
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from bettercompute._runtime.reconcile import ReconcileContext, Reconciler, reason_of
from bettercompute._runtime.shards import SHARDS, owned_by
from bettercompute.errors import ComputeError
from bettercompute.ports import SINKS_POKE, WORK_CHANNEL, Claim, Lease, WorkQueue

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = ["SINKS_POKE", "WORK_CHANNEL", "ShardedWorker", "notify_work", "reconcile_one", "shard_lease_name"]

log = logging.getLogger("bettercompute.workers")

MEMBERS_POKE = "@members"
CONCURRENCY = 8
"""Items one reconcile loop runs at once (each may hold a pooled connection)."""
REFILL_AT = CONCURRENCY // 2
"""Free slots that make a loop woken by finished items claim again before its poll interval."""
DEPTH_SAMPLE_SECONDS = 5.0
"""How often a worker process reads the queue's depth for ``bettercompute_queue_depth`` (one grouped count)."""
DEPTH_TIMEOUT_SECONDS = 2.0


async def notify_work(context: ModuleContext, payload: str) -> None:
    """Poke the loops of every process on ``WORK_CHANNEL``, when there is a notifier; a lost poke costs one poll."""
    notifier = context.notifier
    if notifier is not None:
        try:
            with anyio.fail_after(2):
                await notifier.notify(WORK_CHANNEL, payload)
        except (ComputeError, TimeoutError) as exc:
            log.debug("a poke was lost (%s); the loops will poll", type(exc).__name__)


def shard_lease_prefix(role: str) -> str:
    """``controllers/shard:``: the name of a role's shard lease, less the shard number."""
    return f"{role}/shard:"


def shard_lease_name(role: str, shard: int) -> str:
    """``controllers/shard:17``."""
    return f"{shard_lease_prefix(role)}{shard}"


class _Wake:
    """An edge a loop sleeps on: a poke that comes while the loop works is not lost, it ends the next sleep."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def poke(self) -> None:
        self._event.set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep until poked or ``seconds`` have passed; whether it was poked."""
        with anyio.move_on_after(seconds):
            await self._event.wait()
        poked = self._event.is_set()
        self._event = anyio.Event()
        return poked


async def reconcile_one(
    context: ModuleContext, reconciler: Reconciler, claim: Claim, lease: Lease | None, now: dt.datetime | None
) -> str:
    """Run one claimed item and settle it: ``done``, ``requeued``, ``retry`` or ``failed`` (attempts exhausted).

    Settling is fenced by ``lease`` (when given): after the shard moved, it changes nothing and the item's claim
    runs out, so the new owner runs it again.
    """
    queue = context.store.queue
    ctx = ReconcileContext(
        context=context,
        kind=claim.kind,
        key=claim.key,
        payload=claim.payload,
        attempt=claim.attempts,
        last_error=claim.last_error,
        lease=lease,
    )
    try:
        with anyio.fail_after(reconciler.deadline.total_seconds()):
            outcome = await reconciler.reconcile(ctx, claim.key)
    except Exception as exc:
        reason = reason_of(exc)
        if claim.attempts >= reconciler.retry.max_attempts:
            log.warning(
                "reconciling %s %s failed %d times (%s); giving up", claim.kind, claim.key, claim.attempts, reason
            )
            if reconciler.on_failure is not None:
                try:
                    with anyio.fail_after(reconciler.deadline.total_seconds()):
                        await reconciler.on_failure(ctx, claim.key, reason)
                except Exception as hook_exc:
                    log.warning("on_failure of %s %s failed: %s", claim.kind, claim.key, reason_of(hook_exc))
                    delay = reconciler.retry.delay(claim.kind, claim.key, claim.attempts)
                    await _settle(queue.retry(claim, delay=delay, error=reason, fence=lease, now=now), queue, claim)
                    return "retry"
            await _settle(queue.complete(claim, fence=lease, now=now), queue, claim)
            return "failed"
        delay = reconciler.retry.delay(claim.kind, claim.key, claim.attempts)
        log.info(
            "reconciling %s %s failed (%s); retrying in %.1f s", claim.kind, claim.key, reason, delay.total_seconds()
        )
        await _settle(queue.retry(claim, delay=delay, error=reason, fence=lease, now=now), queue, claim)
        return "retry"
    settled = queue.complete(claim, fence=lease, again_after=outcome.requeue_after, now=now)
    await _settle(settled, queue, claim)
    return "done" if outcome.requeue_after is None else "requeued"


async def _settle(fenced: Awaitable[bool], queue: WorkQueue, claim: Claim) -> None:
    """Settle under the shard lease; when the lease moved meanwhile, hand the item straight back (the claim token
    still guards it) so its new owner runs it now rather than when this claim would have run out."""
    if not await fenced:
        await queue.retry(claim, delay=dt.timedelta(0), error=claim.last_error or "SHARD_MOVED")


class ShardedWorker:
    """One process's membership, shard leases and reconcile loops, for the roles it runs.

    ``on_job_poke`` gets the pokes meant for singleton job loops (payloads starting with ``@`` other than
    ``@members``).
    """

    def __init__(
        self,
        context: ModuleContext,
        reconcilers: Sequence[Reconciler],
        roles: Collection[str],
        on_job_poke: Callable[[str], None] | None = None,
    ) -> None:
        self._context = context
        self._on_job_poke = on_job_poke
        self._roles = sorted(roles)
        self._shard_roles = [r for r in self._roles if r in ("controllers", "scheduler")]
        self._reconcilers = {r.kind: r for r in reconcilers if r.role in roles}
        # Unique per process even when several share an instance name: it is the holder of the shard leases.
        self.id = f"{context.instance}/{uuid.uuid4().hex[:8]}"
        self._held: dict[str, Lease] = {}
        self._running: dict[str, int] = {}
        self._wanted: dict[str, set[int]] = {role: set() for role in self._shard_roles}
        self._joined = False
        self._shard_wake = _Wake()
        self._work_wakes = {role: _Wake() for role in self._shard_roles}
        self._kinds = {
            role: sorted(r.kind for r in self._reconcilers.values() if r.role == role) for role in self._shard_roles
        }

    @property
    def held(self) -> dict[str, Lease]:
        """The shard leases held now, by name."""
        return dict(self._held)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; then hand every shard lease back and leave the membership."""
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self._shard_loop)
                if self._context.notifier is not None:
                    # Started once LISTEN is in place (or its first try failed): a poke sent after ``run`` has
                    # started is heard, never lost to a LISTEN still on its way.
                    await tg.start(self._listen)
                for role in self._shard_roles:
                    if self._kinds[role]:
                        tg.start_soon(self._reconcile_loop, role)
                if self._reconcilers:
                    tg.start_soon(self._depth_loop)
                task_status.started()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._leave()

    async def _leave(self) -> None:
        store = self._context.store
        held, self._held = list(self._held.values()), {}
        self._context.metrics.leases_held.labels("shard").set(0)
        try:
            await store.leases.release_many(held)
            await store.membership.leave(roles=self._roles, id=self.id)
        except ComputeError as exc:  # the leases and the row expire by themselves
            log.warning("leaving the workers failed (%s); the shards move after their TTL", exc.code)
            return
        await self._poke(MEMBERS_POKE)

    async def _poke(self, payload: str) -> None:
        await notify_work(self._context, payload)

    async def _listen(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Turn notifier pokes into wake-ups; reconnect with backoff, forever (the loops poll meanwhile)."""
        notifier = self._context.notifier
        assert notifier is not None
        failures = 0
        started = False
        while True:
            try:
                async with notifier.listen(WORK_CHANNEL) as pokes:
                    failures = 0
                    if not started:
                        task_status.started()
                        started = True
                    async for payload in pokes:
                        self._on_poke(payload)
            except ComputeError as exc:
                if not started:
                    task_status.started()
                    started = True
                failures += 1
                wait = min(30.0, math.pow(2, min(failures, 5)))
                log.info("listening for pokes failed (%s); again in about %.0f s", exc.code, wait)
                await anyio.sleep(wait * random.uniform(0.8, 1.2))  # noqa: S311 - jitter, not security

    def _on_poke(self, payload: str) -> None:
        if payload == MEMBERS_POKE:
            self._shard_wake.poke()
            return
        if payload.startswith("@") and self._on_job_poke is not None:
            self._on_job_poke(payload)  # a singleton job loop's poke: no reconciler kind matches it below
        kinds = set(payload.split(",")) if payload else set()
        for role, wake in self._work_wakes.items():
            if not kinds or kinds & set(self._kinds[role]):
                wake.poke()

    async def _shard_loop(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        ttl = self._context.lease_ttl
        started = False
        failures = 0
        while True:
            wait = ttl.total_seconds() / 3
            try:
                joined = await self._cycle()
                failures = 0
                if joined:
                    await self._poke(MEMBERS_POKE)
            except ComputeError as exc:
                failures += 1
                wait = min(wait, math.pow(2, min(failures, 4)) / 4)
                log.warning("the shard cycle failed (%s); again in about %.1f s", exc.code, wait)
            if not started:
                task_status.started()
                started = True
            await self._shard_wake.sleep(wait * random.uniform(0.8, 1.0))  # noqa: S311 - jitter, not security

    async def _cycle(self) -> bool:
        """Heartbeat, then renew, release and take shard leases; whether this worker just joined a role."""
        store = self._context.store
        ttl = self._context.lease_ttl
        members = await store.membership.heartbeat(
            roles=self._roles, id=self.id, instance=self._context.instance, ttl=ttl
        )
        joined, self._joined = not self._joined, True
        renewed = await store.leases.renew_many(list(self._held.values()), ttl)
        lost = set(self._held) - {lease.name for lease in renewed}
        metrics = self._context.metrics
        if lost:
            log.warning("lost %d shard lease(s) (expired and taken over)", len(lost))
            metrics.leases_lost.labels("shard").inc(len(lost))
        self._held = {lease.name: lease for lease in renewed}
        wanted_names: set[str] = set()
        for role in self._shard_roles:
            ids = [m.id for m in members if m.role == role]
            self._wanted[role] = owned_by(self.id, ids, SHARDS)
            wanted_names.update(shard_lease_name(role, shard) for shard in self._wanted[role])
        # A shard is handed back only when no pass on it runs, so those passes' fenced writes still land.
        unwanted = [
            lease for name, lease in self._held.items() if name not in wanted_names and not self._running.get(name)
        ]
        if unwanted:
            # Forgotten before the release is awaited, so no claim made meanwhile counts on them.
            for lease in unwanted:
                self._held.pop(lease.name, None)
            await store.leases.release_many(unwanted)
        missing = sorted(wanted_names - set(self._held))
        if missing:
            acquired = await store.leases.acquire_many(missing, self.id, ttl)
            for lease in acquired:
                self._held[lease.name] = lease
            metrics.leases_acquired.labels("shard").inc(len(acquired))
        metrics.leases_held.labels("shard").set(len(self._held))
        return joined

    def _owned(self, role: str) -> list[int]:
        wanted = self._wanted.get(role, set())
        return sorted(s for s in wanted if shard_lease_name(role, s) in self._held)

    async def _reconcile_loop(self, role: str) -> None:
        """Claim due items of ``role``'s kinds on the shards held, and run up to ``CONCURRENCY`` at once.

        A slot is refilled as soon as its item is done, not when the whole batch is: one slow item (a BMC that does
        not answer, a provider API that hangs) holds one slot, never the other items' turn.
        """
        kinds = self._kinds[role]
        poll = self._context.poll_interval.total_seconds()
        claim_for = max(self._reconcilers[k].deadline for k in kinds) + self._context.lease_ttl
        wake = self._work_wakes[role]
        failures = 0
        running = 0

        async def run(claim: Claim) -> None:
            nonlocal running
            try:
                await self._run_claim(role, claim)
            finally:
                running -= 1
                wake.poke()  # a free slot: claim again now

        async with anyio.create_task_group() as tg:
            poked = False
            while True:
                free = CONCURRENCY - running
                # Woken by items finishing, it claims once half the slots are free (one claim per few items, not
                # one per item); at the poll interval, or poked with slots to spare, it claims whatever is free.
                if free > 0 and (not poked or free >= REFILL_AT):
                    try:
                        owned = self._owned(role)
                        claims = await self._context.store.queue.claim(
                            holder=self.id,
                            kinds=kinds,
                            limit=free,
                            claim_for=claim_for,
                            shards=owned,
                            owner_prefix=shard_lease_prefix(role),
                        )
                        if claims:
                            self._count_claims(claims, claim_for)
                            for claim in claims:
                                running += 1
                                tg.start_soon(run, claim)
                        failures = 0
                    except ComputeError as exc:
                        failures += 1
                        log.warning("the %s reconcile loop failed (%s)", role, exc.code)
                wait = poll if not failures else min(30.0, poll * math.pow(2, min(failures, 5)))
                poked = await wake.sleep(wait * random.uniform(0.8, 1.2))  # noqa: S311 - jitter, not security

    def _count_claims(self, claims: Sequence[Claim], claim_for: dt.timedelta) -> None:
        """Count claimed items per kind, and how long each had been due (both times are the database's)."""
        metrics = self._context.metrics
        for claim in claims:
            metrics.queue_claimed.labels(claim.kind).inc()
            if claim.due_at is not None:
                waited = (claim.claimed_until - claim_for - claim.due_at).total_seconds()
                metrics.queue_claim_duration.labels(claim.kind).observe(max(0.0, waited))

    async def _depth_loop(self) -> None:
        """Sample the queue's depth per kind of this process's reconcilers into ``bettercompute_queue_depth``.

        Here, not at scrape time: a collector runs synchronously on the event loop while a scrape renders, so it
        could not await the database without blocking every request; and one grouped count every few seconds per
        worker process costs the database little. A failed sample leaves the last values (logged at debug).
        """
        kinds = sorted(self._reconcilers)
        gauge = self._context.metrics.queue_depth
        while True:
            try:
                with anyio.fail_after(DEPTH_TIMEOUT_SECONDS):
                    depth = await self._context.store.queue.depth(kinds)
                for kind in kinds:
                    gauge.labels(kind).set(depth.get(kind, 0))
            except (ComputeError, TimeoutError) as exc:
                log.debug("sampling the queue's depth failed (%s)", type(exc).__name__)
            await anyio.sleep(DEPTH_SAMPLE_SECONDS * random.uniform(0.9, 1.1))  # noqa: S311 - jitter, not security

    async def _run_claim(self, role: str, claim: Claim) -> None:
        name = shard_lease_name(role, claim.shard)
        lease = self._held.get(name)
        queue = self._context.store.queue
        try:
            if lease is None:  # the shard moved between the claim and now: hand the item back untouched
                await queue.retry(claim, delay=dt.timedelta(0), error=claim.last_error or "SHARD_MOVED")
                return
            self._running[name] = self._running.get(name, 0) + 1
            try:
                await reconcile_one(self._context, self._reconcilers[claim.kind], claim, lease, None)
            except anyio.get_cancelled_exc_class():
                # stop() cut the pass short: hand the item back at once instead of leaving it claimed until its
                # claim runs out (a rolling deploy would otherwise stall these keys).
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await queue.retry(claim, delay=dt.timedelta(0), error=claim.last_error or "WORKER_STOPPED")
                raise
            finally:
                self._running[name] -= 1
                if not self._running[name]:
                    del self._running[name]
        except ComputeError as exc:  # settling failed: the claim runs out and the item comes back
            log.warning("settling %s %s failed (%s)", claim.kind, claim.key, exc.code)
