"""The built-in node controllers, reconcilers of the ``controllers`` role keyed by node id.

- The inventory controller (kind ``inventory``, enqueued by the gateway with each section it keeps) turns the
  node's latest sections into devices, atoms and conditions.
- The lifecycle controller (kind ``node-lifecycle``, enqueued when a session opens or is found lost, when an
  acceptance command ends, when an operator asks) runs the pool's acceptance checks as commands and judges their
  results (``adopting`` -> ``adopted`` or ``quarantined``), and follows reachability: an adopted node without a
  session for ``Options.session_timeout`` is ``unreachable``; its atoms stay bookable through the pool's grace period,
  then are withdrawn; a session back restores it.

Both finish by deciding every atom's availability, so whichever runs last leaves them right. Neither does network
I/O inside a transaction: commands reach the daemon through the gateway, after commit.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from bettercompute._runtime.reconcile import Outcome, ReconcileContext, Reconciler
from bettercompute.modules.commands import COMMANDS, SESSIONS, CommandRecord, SessionRecord, create_command
from bettercompute.modules.inventory._checks import AcceptanceCheck
from bettercompute.modules.inventory._derive import (
    Parsed,
    atom_states,
    atoms_for,
    conditions_for,
    device_id,
    parse_sections,
)
from bettercompute.modules.inventory._facts import result_refusal
from bettercompute.modules.inventory._port import INVENTORY, DeviceRecord, GpuOwner
from bettercompute.modules.nodes import (
    INVENTORY_KIND,
    LIFECYCLE_KIND,
    NODES,
    InventoryRecord,
    NodeRecord,
    Signing,
    audit_refusal,
    inventory_item,
    lifecycle_item,
    prepared_signer,
    section_refusal,
    set_desired_state,
)
from bettercompute.modules.pools import POOLS, NodePolicy
from bettercompute.ports import OutboxEvent, Transaction

__all__ = [
    "NODE_ADOPTED",
    "NODE_QUARANTINED",
    "NODE_STATE_CHANGED",
    "Controllers",
]

log = logging.getLogger("bettercompute.inventory")

NODE_ADOPTED = "node.adopted"
"""Published when a node passes its acceptance checks (payload: node_id, pool_id, desired_generation)."""
NODE_QUARANTINED = "node.quarantined"
DUPLICATE_DEVICE = "duplicate_device"
"""The quarantine reason of a node that reports a GPU UUID another live node holds."""
"""Published when a check fails or runs out of time (payload: node_id, pool_id, reason, check)."""
NODE_STATE_CHANGED = "node.state_changed"
"""Published with every other change of a node's state (payload: node_id, from, to, reason)."""
_ENDED = ("succeeded", "failed", "expired", "cancelled")


@attrs.frozen
class _Reach:
    reachable: bool
    reason: str
    message: str
    silent_since: dt.datetime | None


def _reach(node: NodeRecord, session: SessionRecord | None) -> _Reach:
    """Whether the node holds a session: its latest one is open. A session whose gateway died stays open until the
    SessionSweeper closes it (``gateway_lost``) after ``Options.session_timeout`` without liveness."""
    if session is None:
        return _Reach(False, "NeverConnected", "no session yet", node.joined_at)
    if session.closed_at is None:
        return _Reach(True, "SessionOpen", f"session {session.epoch} on {session.gateway}", None)
    since = session.closed_at
    return _Reach(False, "NoSession", f"no session since {since.isoformat()}", since)


def _event(kind: str, node: NodeRecord, **payload: Any) -> OutboxEvent:
    return OutboxEvent(type=kind, key=node.id, payload={"node_id": node.id, "pool_id": node.pool_id, **payload})


class Controllers:
    """The inventory and lifecycle controllers, with the acceptance checks modules registered."""

    def __init__(self, checks: Sequence[AcceptanceCheck]) -> None:
        self._checks = {c.kind: c for c in checks}
        self.inventory = Reconciler(kind=INVENTORY_KIND, reconcile=self.reconcile_inventory)
        self.lifecycle = Reconciler(kind=LIFECYCLE_KIND, reconcile=self.reconcile_lifecycle)

    @property
    def checks(self) -> list[str]:
        """The acceptance checks a pool may name."""
        return sorted(self._checks)

    # --- inventory ------------------------------------------------------------------------------------------------

    async def reconcile_inventory(self, ctx: ReconcileContext, node_id: str) -> Outcome:
        """Derive devices, atoms and conditions from the node's latest sections."""
        store = ctx.store
        node = await store.repository(NODES).get(node_id)
        if node is None or node.state == "retired":
            return Outcome.done()
        records = await store.repository(NODES).inventory(node_id)
        verdicts = await _section_verdicts(ctx, node, records)
        if verdicts:
            async with ctx.transaction() as tx:
                await _note_sections(ctx, tx, node, records, verdicts)
        if any(verdicts.get(r.section, r.checked) != "ok" for r in records):
            # A section its node's key did not sign changes nothing: the devices stay as the last signed report
            # left them until the node reports again. Each refusal is audited once (it is noted on the section).
            return Outcome.done()
        sections = {r.section: r.content for r in records}
        parsed = parse_sections(sections, fake=any(r.fake for r in records))
        gpu_idents = [d[1] for d in parsed.devices if d[0] == "gpu"]
        owners = await store.repository(INVENTORY).gpu_owners(gpu_idents, besides=node_id, tenant=node.tenant)
        taken = _taken(node, owners)
        existing = await store.repository(INVENTORY).devices(node_id)
        devices = _devices(node, parsed, existing, {k: v for k, v in owners.items() if k not in taken})
        async with ctx.transaction() as tx:
            await tx.repository(INVENTORY).release_retired(gpu_idents)
            if taken:
                # Attested here, not on the node that held it: the holder's device goes into conflict (its own
                # pass then quarantines it), whoever reported first.
                displaced = [(owners[i].node_id, i, _claimed_by(node.id, owners[i].same_tenant)) for i in taken]
                await tx.repository(INVENTORY).displace(displaced)
                holders = sorted({owners[i].node_id for i in taken})
                await tx.enqueue([w for h in holders for w in (inventory_item(h), lifecycle_item(h))])
            await tx.repository(INVENTORY).save_devices(devices)
            await self._settle(ctx, tx, node, devices, parsed)
            await tx.enqueue([lifecycle_item(node_id)])
        if len(owners) > len(taken):
            log.warning("node %s reports %d GPU UUID(s) another node holds", node_id, len(owners) - len(taken))
        if taken:
            log.warning(
                "node %s took %d GPU UUID(s) its attestation names from the nodes that held them", node_id, len(taken)
            )
        return Outcome.done()

    # --- lifecycle ------------------------------------------------------------------------------------------------

    async def reconcile_lifecycle(self, ctx: ReconcileContext, node_id: str) -> Outcome:
        """Acceptance, quarantine and reachability of one node."""
        store = ctx.store
        now = ctx.clock.now()
        timeout = ctx.context.session_timeout
        node = await store.repository(NODES).get(node_id)
        if node is None:
            return Outcome.done()
        pool = await store.repository(POOLS).get(node.pool_id)
        policy = NodePolicy.from_stored(pool.node_policy) if pool is not None else NodePolicy()
        checks = tuple(pool.acceptance_checks) if pool is not None else ()
        session = await store.repository(SESSIONS).get(node_id)
        reach = _reach(node, session)
        commands = await _commands(ctx, node)
        # Only a node being accepted: the results of a finished round decided already.
        refused = await _refused_results(ctx, node, commands) if node.state == "adopting" else {}
        # Only the sections whose signature the inventory controller checked and found good.
        records = [r for r in await store.repository(NODES).inventory(node_id) if r.checked == "ok"]
        parsed = parse_sections({r.section: r.content for r in records})
        wake_at: list[dt.datetime] = []
        # Acceptance may write commands and the first desired state, signed: the key is loaded before the transaction.
        signer = await prepared_signer(ctx.context)  # the node may turn adopting before it is locked
        async with ctx.transaction() as tx:
            locked = await tx.repository(NODES).get_for_update(node_id)
            if locked is None:
                return Outcome.done()
            node = locked
            if node.acceptance.get("commands") != {c.kind: c.id for c in commands.values()} and commands:
                commands = {}  # a new round began since the read (an operator's requalify): judge it next pass
                refused = {}
            events: list[OutboxEvent] = []
            changed = node
            if refused:
                # A result its node's key did not sign changes nothing: the check stays unanswered (the node stays
                # adopting, to be requalified) and the refusal is audited once, and counted.
                changed = await _refuse(ctx, tx, changed, refused)
                commands = {kind: c for kind, c in commands.items() if kind not in refused}
            if node.state != "retired":
                changed = _reachability(changed, reach, now, timeout, policy, events, wake_at)
            devices = await tx.repository(INVENTORY).devices(node_id)
            claimed = sorted(d.ident for d in devices if d.state == "conflict")
            if claimed and changed.state in ("adopting", "adopted"):
                # It reports hardware another node holds: the reporter stops, the holder is untouched. Requalify
                # it once the conflict is settled (the holder retired, or the report corrected).
                detail = {"devices": claimed[:8], "count": len(claimed)}
                changed = self._quarantine(changed, DUPLICATE_DEVICE, detail, events)
            elif changed.state == "adopting" and records:
                changed = await self._acceptance(
                    tx, changed, checks, policy, commands, now, events, wake_at, signer=signer
                )
            if changed != node:
                saved = await tx.repository(NODES).save_lifecycle(changed)
                changed = saved if saved is not None else node
            if events:
                await tx.publish(events)
            await self._settle(ctx, tx, changed, devices, parsed, reach=reach, policy=policy, now=now)
        if wake_at:
            return Outcome.requeue(max(dt.timedelta(0), min(wake_at) - now) + dt.timedelta(milliseconds=200))
        return Outcome.done()

    async def _acceptance(
        self,
        tx: Transaction,
        node: NodeRecord,
        checks: Sequence[str],
        policy: NodePolicy,
        commands: Mapping[str, CommandRecord],
        now: dt.datetime,
        events: list[OutboxEvent],
        wake_at: list[dt.datetime],
        *,
        signer: Signing | None,
    ) -> NodeRecord:
        acceptance = dict(node.acceptance)
        if not acceptance.get("commands") and not acceptance.get("started_at"):
            unknown = [c for c in checks if c not in self._checks]
            if unknown:
                return self._quarantine(node, "unknown_check", {"check": unknown[0], "known": self.checks}, events)
            started: dict[str, str] = {}
            for kind in checks:
                check = self._checks[kind]
                deadline = now + (check.deadline or dt.timedelta(seconds=policy.check_deadline_seconds))
                command = await create_command(
                    tx,
                    node=node,
                    kind=kind,
                    payload=dict(check.arguments),
                    deadline=deadline,
                    on_session_loss="redispatch",
                    max_attempts=5,
                    wake=lifecycle_item(node.id),
                    signer=signer,
                )
                started[kind] = command.id
                wake_at.append(deadline + dt.timedelta(seconds=5))
            acceptance = {
                "round": int(acceptance.get("round") or 0) + 1,
                "commands": started,
                "started_at": now.isoformat(),
            }
            if not started:  # a pool with no checks adopts at once
                return await self._adopt(tx, attrs.evolve(node, acceptance=acceptance), events, signer)
            return attrs.evolve(node, acceptance=acceptance)
        pending = [c for c in commands.values() if c.state not in _ENDED]
        if pending or len(commands) < len(acceptance.get("commands") or {}):
            wake_at.extend(c.deadline + dt.timedelta(seconds=5) for c in pending)
            return node
        for kind in sorted(commands):
            command = commands[kind]
            if command.state != "succeeded":
                reason = {"expired": "check_deadline_exceeded", "cancelled": "check_cancelled"}.get(
                    command.state,
                    "check_session_lost"
                    if command.reason in ("session_lost", "attempts_exhausted")
                    else "check_failed",
                )
                failed = {
                    "check": kind,
                    "command_id": command.id,
                    "command_reason": command.reason,
                    "output": command.result,
                }
                return self._quarantine(node, reason, failed, events, acceptance=acceptance)
            judged = self._checks.get(kind)
            findings = judged.judge(dict(command.result or {}), policy) if judged is not None else []
            if kind == "diag.nvml":
                acceptance["findings"] = findings
            if findings:
                detail: dict[str, Any] = {
                    "check": kind,
                    "command_id": command.id,
                    "findings": findings,
                    "output": command.result,
                }
                return self._quarantine(node, str(findings[0]["reason"]), detail, events, acceptance=acceptance)
        return await self._adopt(tx, attrs.evolve(node, acceptance=acceptance), events, signer)

    def _quarantine(
        self,
        node: NodeRecord,
        reason: str,
        detail: Mapping[str, Any],
        events: list[OutboxEvent],
        *,
        acceptance: Mapping[str, Any] | None = None,
    ) -> NodeRecord:
        kept = dict(acceptance if acceptance is not None else node.acceptance)
        kept["finished"] = True
        events.append(_event(NODE_QUARANTINED, node, reason=reason, check=detail.get("check")))
        log.info("node %s quarantined: %s", node.id, reason)
        return attrs.evolve(node, state="quarantined", state_reason=reason, state_detail=dict(detail), acceptance=kept)

    async def _adopt(
        self, tx: Transaction, node: NodeRecord, events: list[OutboxEvent], signer: Signing | None
    ) -> NodeRecord:
        generation = node.desired_generation
        if generation == 0:
            desired = await set_desired_state(tx, node, {"allocations": []}, signer=signer)
            generation = desired.generation
        acceptance = {**node.acceptance, "finished": True}
        events.append(_event(NODE_ADOPTED, node, desired_generation=generation))
        return attrs.evolve(node, state="adopted", state_reason=None, state_detail={}, acceptance=acceptance)

    async def _settle(
        self,
        ctx: ReconcileContext,
        tx: Transaction,
        node: NodeRecord,
        devices: Sequence[DeviceRecord],
        parsed: Parsed,
        *,
        reach: _Reach | None = None,
        policy: NodePolicy | None = None,
        now: dt.datetime | None = None,
    ) -> None:
        """Decide the atoms' availability and write the conditions."""
        now = now or ctx.clock.now()
        if policy is None:
            pool = await tx.repository(POOLS).get(node.pool_id)
            policy = NodePolicy.from_stored(pool.node_policy) if pool is not None else NodePolicy()
        if reach is None:
            session = await tx.repository(SESSIONS).get(node.id)
            reach = _reach(node, session)
        grace = dt.timedelta(seconds=policy.unreachable_grace_seconds)
        known = {a.ident: a for a in await tx.repository(INVENTORY).atoms(node.id)}
        wanted = {a.ident: a for a in atoms_for(node, devices)}
        # An atom is never deleted: one whose device is gone keeps its row (what was booked on it stays findable).
        merged = [wanted.get(ident, atom) for ident, atom in known.items()] + [
            a for ident, a in wanted.items() if ident not in known
        ]
        decided = atom_states(node, devices, merged, now=now, grace=grace)
        changed = [
            a
            for a in decided
            if known.get(a.ident) is None
            or (
                known[a.ident].state,
                known[a.ident].reason,
                known[a.ident].device_id,
                known[a.ident].model,
                known[a.ident].profile,
                known[a.ident].memory_mib,
            )
            != (a.state, a.reason, a.device_id, a.model, a.profile, a.memory_mib)
        ]
        await tx.repository(INVENTORY).save_atoms(changed)
        findings = node.acceptance.get("findings")
        conditions = conditions_for(
            devices,
            problems=parsed.problems,
            unreadable_gpus=parsed.unreadable_gpus,
            findings=findings if isinstance(findings, list) else None,
            reachable=(reach.reachable, reach.reason, reach.message),
        )
        await tx.repository(NODES).save_conditions(node.id, conditions)


ATTESTED_GPUS = "gpu_uuids"
"""The fact (comma-separated GPU UUIDs) an attestor of the host's records when it verified the node's GPUs (a GPU
vendor's attestation bound to the node's key, say; kept as ``<attestor>.gpu_uuids``): a UUID it names is the
node's, whoever reported it first. The built-in ``claims`` attestor, which only compares what the machine says,
never counts."""


def _attested(node: NodeRecord) -> set[str]:
    found: set[str] = set()
    for key, value in node.attestation.items():
        attestor, _, fact = key.rpartition(".")
        if fact == ATTESTED_GPUS and attestor and attestor != "claims" and isinstance(value, str):
            found |= {u for u in value.split(",") if u}
    return found


def _taken(node: NodeRecord, owners: Mapping[str, GpuOwner]) -> set[str]:
    """The GPU UUIDs held by other nodes that this node takes: its attestation names them and the holder's does
    not. Otherwise (neither attested, or both) the holder keeps the GPU and this node's device is in conflict: a
    claim that is only said, not attested, never displaces another node."""
    attested = _attested(node)
    return {ident for ident, owner in owners.items() if ident in attested and not owner.attested}


def _claimed_by(node_id: str, same_tenant: bool) -> dict[str, Any]:
    """What a device in conflict says of the node that holds it: its id within the tenant, nothing across."""
    return {"claimed_by": node_id} if same_tenant else {"claimed_by_another_tenant": True}


def _devices(
    node: NodeRecord, parsed: Parsed, existing: Sequence[DeviceRecord], owners: Mapping[str, GpuOwner]
) -> list[DeviceRecord]:
    """The node's devices as the sections say: reported ones present (or in conflict, for a GPU UUID another live
    node holds: ``claimed_by`` names that node only when it is in the same tenant), earlier ones no longer reported
    missing."""
    out = []
    reported = set()
    for kind, ident, slot, model, details in parsed.devices:
        reported.add((kind, ident))
        state = "conflict" if kind == "gpu" and ident in owners else "present"
        if state == "conflict":
            owner = owners[ident]
            details = {**details, **_claimed_by(owner.node_id, owner.same_tenant)}
        out.append(
            DeviceRecord(
                id=device_id(node.id, kind, ident),
                node_id=node.id,
                tenant=node.tenant,
                pool_id=node.pool_id,
                kind=kind,
                ident=ident,
                slot=slot,
                model=model,
                details=details,
                state=state,
            )
        )
    for device in existing:
        if (device.kind, device.ident) not in reported and device.state != "missing":
            out.append(attrs.evolve(device, state="missing"))
    return out


async def _section_verdicts(
    ctx: ReconcileContext, node: NodeRecord, records: Sequence[InventoryRecord]
) -> dict[str, str]:
    """The verdict of each section not checked yet, by name: ``ok`` when its node's key signed it, else why not
    (``fact_refusal``)."""
    verdicts: dict[str, str] = {}
    for record in records:
        if record.checked is not None:
            continue
        verdicts[record.section] = await section_refusal(ctx.store, record) or "ok"
    return verdicts


async def _note_sections(
    ctx: ReconcileContext,
    tx: Transaction,
    node: NodeRecord,
    records: Sequence[InventoryRecord],
    verdicts: Mapping[str, str],
) -> None:
    """Note each verdict on its section (unless a newer report replaced it meanwhile); audit and count each
    refusal noted."""
    for record in records:
        verdict = verdicts.get(record.section)
        if verdict is None:
            continue
        noted = await tx.repository(NODES).check_inventory(
            node.id, record.section, received_at=record.received_at, verdict=verdict
        )
        if not noted or verdict == "ok":
            continue
        ctx.context.metrics.facts_refused.labels("inventory_section", verdict).inc()
        log.warning("node %s: inventory section %s is refused: %s", node.id, record.section, verdict)
        await audit_refusal(
            tx,
            node_id=node.id,
            tenant=node.tenant,
            fact="inventory_section",
            reason=verdict,
            signed=record.signed,
            section=record.section,
        )


async def _refused_results(
    ctx: ReconcileContext, node: NodeRecord, commands: Mapping[str, CommandRecord]
) -> dict[str, tuple[CommandRecord, str]]:
    """The acceptance commands whose result (succeeded or failed) the node's key did not sign, by check, with why
    (``fact_refusal``)."""
    refused: dict[str, tuple[CommandRecord, str]] = {}
    for kind, command in commands.items():
        if command.state not in ("succeeded", "failed"):
            continue
        why = await result_refusal(ctx.store, node.id, command)
        if why is not None:
            refused[kind] = (command, why)
    return refused


async def _refuse(
    ctx: ReconcileContext, tx: Transaction, node: NodeRecord, refused: Mapping[str, tuple[CommandRecord, str]]
) -> NodeRecord:
    """Audit and count each refused result once (the node's acceptance notes it), and log it."""
    noted = dict(node.acceptance.get("refused") or {})
    for kind, (command, why) in sorted(refused.items()):
        if command.id in noted:
            continue
        noted[command.id] = why
        ctx.context.metrics.facts_refused.labels("command_result", why).inc()
        log.warning("node %s: the result of %s (%s) is refused: %s", node.id, kind, command.id, why)
        await audit_refusal(
            tx,
            node_id=node.id,
            tenant=node.tenant,
            fact="command_result",
            reason=why,
            signed=command.signed,
            check=kind,
            command_id=command.id,
        )
    if noted == (node.acceptance.get("refused") or {}):
        return node
    return attrs.evolve(node, acceptance={**node.acceptance, "refused": noted})


async def _commands(ctx: ReconcileContext, node: NodeRecord) -> dict[str, CommandRecord]:
    ids = node.acceptance.get("commands") or {}
    found = {}
    for kind, command_id in sorted(ids.items()):
        command = await ctx.store.repository(COMMANDS).get(command_id)
        if command is not None:
            found[kind] = command
    return found


def _reachability(
    node: NodeRecord,
    reach: _Reach,
    now: dt.datetime,
    timeout: dt.timedelta,
    policy: NodePolicy,
    events: list[OutboxEvent],
    wake_at: list[dt.datetime],
) -> NodeRecord:
    if reach.reachable:
        if node.state == "unreachable":
            events.append(
                _event(NODE_STATE_CHANGED, node, **{"from": "unreachable", "to": "adopted", "reason": "session_back"})
            )
            return attrs.evolve(node, state="adopted", unreachable_since=None, state_reason=None)
        return node
    if node.state == "adopted" and reach.silent_since is not None:
        if now >= reach.silent_since + timeout:
            events.append(
                _event(NODE_STATE_CHANGED, node, **{"from": "adopted", "to": "unreachable", "reason": reach.reason})
            )
            grace = dt.timedelta(seconds=policy.unreachable_grace_seconds)
            wake_at.append(now + grace)
            return attrs.evolve(node, state="unreachable", unreachable_since=now, state_reason="no_session")
        wake_at.append(reach.silent_since + timeout)
    elif node.state == "unreachable" and node.unreachable_since is not None:
        end = node.unreachable_since + dt.timedelta(seconds=policy.unreachable_grace_seconds)
        if now < end:
            wake_at.append(end)
    return node
