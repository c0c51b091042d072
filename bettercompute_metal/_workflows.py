"""The machine workflows: inspection over Redfish, and commissioning (PXE into the ramdisk, diagnose, wipe, ready).

Every step keeps the machine's ``step``, ``reason`` and ``message`` current, so ``metal.get`` shows where a machine
is and why it waits or failed. BMC calls happen between write blocks, never inside one. A BMC that is unreachable or
answers 5xx is retried with backoff (the reason stays visible meanwhile); bad credentials, a TLS mismatch or the
last attempt fail the machine with the step and the reason, and ``metal.retry`` starts the workflow again.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import re
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from bettercompute import (
    Job,
    ModuleContext,
    RetryPolicy,
    Step,
    StepContext,
    StepOutcome,
    Workflow,
    signal_workflow_in,
    start_workflow_in,
)
from bettercompute.errors import ComputeError, FailedPreconditionError, UnavailableError
from bettercompute.modules.nodes import JOIN_TOKENS, NODES
from bettercompute.ports import Transaction
from bettercompute_metal._port import METAL, MachineRecord
from bettercompute_metal._redfish import RedfishClient
from bettercompute_metal._redfish_json import RedfishError
from bettercompute_metal._redfish_trust import BmcCredentials, BmcTls
from bettercompute_metal._tokens import (
    RAMDISK_TOKEN_PREFIX,
    credentials_context,
    join_token_context,
    new_join_token,
    new_token,
    token_context,
)

__all__ = [
    "BOOT_RECORDS_TRIM",
    "COMMISSION",
    "DEPLOY",
    "INSPECT",
    "NODE_WATCH",
    "RELEASE",
    "WORKFLOWS",
    "bmc_client",
    "bmc_error",
    "by_name",
    "start",
]

log = logging.getLogger("bettercompute.metal")

_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")

BMC_ATTEMPTS = 6
"""How many times a step tries a BMC that is unreachable or failing before the machine fails."""
RAMDISK_WAIT = dt.timedelta(minutes=30)
"""How long commissioning waits for the ramdisk to boot, join and finish its tasks."""
RAMDISK_TOKEN_TTL = dt.timedelta(minutes=45)
DEPLOY_JOIN_TTL = dt.timedelta(hours=1)
"""How long the installed system's join token lives."""
STEP_MARGIN = dt.timedelta(seconds=10)
"""What a step keeps of its deadline to record its outcome on the machine."""
SITE_PICKUP = dt.timedelta(seconds=20)
"""How long a boot waits, per attempt, for the site's boot server to fetch the plan before powering on."""
NODE_WAIT = dt.timedelta(hours=1)
"""How long a deploy waits for the installed system to join, and then to be adopted."""


async def bmc_client(context: ModuleContext, machine: MachineRecord) -> RedfishClient:
    """A Redfish client for the machine's BMC, its credentials unsealed for this call only."""
    if context.kms is None:
        raise FailedPreconditionError("bare metal needs a KMS (Options.kms)")
    opened = json.loads(await context.kms.decrypt(machine.bmc_secret, context=credentials_context(machine.id)))
    tls = BmcTls(ca_pem=machine.bmc_tls.get("ca_pem"), pin_sha256=machine.bmc_tls.get("pin_sha256"))
    return RedfishClient(machine.bmc_url, BmcCredentials(username=opened["username"], password=opened["password"]), tls)


def bmc_error(exc: RedfishError) -> ComputeError:
    """A BMC failure as a caller sees it: unavailable (retry later) or a failed precondition (fix the BMC)."""
    details = {"reason": exc.reason}
    if exc.retryable:
        return UnavailableError(f"the BMC: {exc}", details=details)
    return FailedPreconditionError(f"the BMC: {exc}", details=details)


async def _note(ctx: StepContext, machine_id: str, **fields: Any) -> MachineRecord | None:
    async with ctx.writes() as tx:
        return await tx.repository(METAL).update_machine(machine_id, **fields)


async def _fail(ctx: StepContext, machine_id: str, reason: str, message: str) -> StepOutcome:
    outcome = StepOutcome.fail(reason, message)
    async with ctx.writes(outcome=outcome) as tx:
        machine = await tx.repository(METAL).lock_machine(machine_id)
        results = dict(machine.results) if machine is not None else {}
        results["workflow"] = ctx.type
        await tx.repository(METAL).update_machine(
            machine_id,
            state="failed",
            step=ctx.step,
            reason=reason,
            message=message,
            results=results,
            boot={"action": "local"},
            task=None,
            tasks=(),
            ramdisk_token=None,
        )
    log.info("machine %s failed at %s: %s", machine_id, ctx.step, reason)
    return outcome


StepBody = Callable[[StepContext, MachineRecord], Awaitable[StepOutcome]]


def machine_step(name: str, body: StepBody, *, deadline: dt.timedelta = dt.timedelta(seconds=120)) -> Step:
    """A step on the workflow's machine (its ``subject``) that fails the machine, not only the workflow.

    A ``RedfishError`` that may pass is retried (``BMC_ATTEMPTS`` in all), any other failure fails the machine with
    its reason at once; an unexpected exception fails it on the last attempt the engine would make.
    """

    # The engine cancels an attempt that overruns ``deadline`` and, after the last, fails only the workflow: the body
    # gets a little less, so that its overrun is caught here and the machine shows it.
    budget = max(1.0, deadline.total_seconds() - STEP_MARGIN.total_seconds())

    async def run(ctx: StepContext) -> StepOutcome:
        machine = await ctx.store.repository(METAL).get_machine(ctx.subject)
        if machine is None:
            return StepOutcome.fail("MACHINE_GONE", "the machine no longer exists")
        try:
            with anyio.fail_after(budget):
                return await body(ctx, machine)
        except TimeoutError:
            message = f"the step {name} took longer than {int(budget)} s"
            if ctx.attempt < BMC_ATTEMPTS:
                await _note(ctx, machine.id, step=name, reason="STEP_TIMEOUT", message=message)
                return StepOutcome.retry(dt.timedelta(seconds=5), reason="STEP_TIMEOUT")
            return await _fail(ctx, machine.id, "STEP_TIMEOUT", message)
        except RedfishError as exc:
            if exc.retryable and ctx.attempt < BMC_ATTEMPTS:
                await _note(ctx, machine.id, step=name, reason=exc.reason, message=str(exc))
                return StepOutcome.retry(dt.timedelta(seconds=min(30, 2**ctx.attempt)), reason=exc.reason)
            return await _fail(ctx, machine.id, exc.reason, str(exc))
        except ComputeError as exc:
            if ctx.attempt < BMC_ATTEMPTS and exc.code == "UNAVAILABLE":
                return StepOutcome.retry(dt.timedelta(seconds=2), reason=exc.code)
            return await _fail(ctx, machine.id, exc.code, exc.message)
        except Exception as exc:
            if ctx.attempt < BMC_ATTEMPTS:
                raise
            return await _fail(ctx, machine.id, f"EXCEPTION:{type(exc).__name__}", "the step failed unexpectedly")

    return Step(
        name=name,
        run=run,
        deadline=deadline,
        retry=RetryPolicy(base=dt.timedelta(seconds=2), max_delay=dt.timedelta(seconds=30), max_attempts=BMC_ATTEMPTS),
    )


# --- inspection -------------------------------------------------------------------------------------------------


def _mac(value: str | None) -> str | None:
    text = (value or "").strip().lower().replace("-", ":")
    return text if _MAC.fullmatch(text) else None


def _uuid(value: str | None) -> str | None:
    try:
        return str(uuid.UUID(value)) if value else None
    except ValueError:
        return None


async def _inspect(ctx: StepContext, machine: MachineRecord) -> StepOutcome:
    async with await bmc_client(ctx.context, machine) as client:
        inventory = await client.inspect()
    macs = tuple(sorted({m for m in (_mac(n.mac) for n in inventory.nics) if m is not None}))
    system_uuid = _uuid(inventory.uuid)
    if not macs and system_uuid is None:
        return await _fail(ctx, machine.id, "BMC_NO_IDENTITY", "the BMC reports neither a MAC address nor a UUID")
    # A site boots a machine by its MAC or UUID: another machine of the site with one of them would be served this
    # machine's boot (or this one another's), so the second is refused.
    others = await ctx.store.repository(METAL).machines_at_site(machine.site_id)
    for other in others:
        if other.id != machine.id and (
            set(other.macs) & set(macs) or (system_uuid and other.system_uuid == system_uuid)
        ):
            return await _fail(
                ctx, machine.id, "DUPLICATE_HARDWARE", f"machine {other.id} of this site has the same MAC or UUID"
            )
    outcome = StepOutcome.next()
    async with ctx.writes(outcome=outcome) as tx:
        await tx.repository(METAL).update_machine(
            machine.id,
            state="inspected",
            step=None,
            reason=None,
            message=None,
            system_uuid=system_uuid,
            serial=inventory.serial_number,
            macs=macs,
            power_state=inventory.power_state,
            hardware=inventory.to_json(),
        )
    log.info("machine %s inspected: %d NICs, %d disks", machine.id, len(macs), len(inventory.disks))
    return outcome


INSPECT = Workflow(name="metal-inspect", steps=[machine_step("inspect", _inspect)])


# --- commissioning ----------------------------------------------------------------------------------------------


# Every boot diagnoses first: the ramdisk touches only disks it found itself, and the hardware is checked again.
TASKS = {
    "metal-commission": ("diagnose", "wipe"),
    "metal-deploy": ("diagnose", "deploy"),
    "metal-release": ("diagnose", "wipe"),
}


async def _prepare_ramdisk(ctx: StepContext, machine: MachineRecord) -> StepOutcome:
    """Mint the machine's ramdisk token (its secret sealed for the site's boot plan) and queue the ramdisk's tasks;
    for a deploy, mint the installed system's join token too (single use, an hour, bound to this machine's hardware
    key and node id), sealed until the ramdisk writes it into cloud-init."""
    kms = ctx.context.kms
    if kms is None:
        raise FailedPreconditionError("bare metal needs a KMS (Options.kms)")
    token_id, token, secret_hash = new_token(RAMDISK_TOKEN_PREFIX, "rt_")
    sealed = await kms.encrypt(token.encode(), context=token_context(machine.id))
    now = ctx.clock.now()
    boot: dict[str, Any] = {
        "action": "ramdisk",
        "token": base64.b64encode(sealed).decode(),
        "prepared_at": now.isoformat(),
    }
    join: tuple[str, bytes] | None = None
    node_id = machine.node_id
    if ctx.type == DEPLOY.name:
        if machine.hardware_key is None:
            raise FailedPreconditionError("the machine has no hardware key: commission it first")
        node = await ctx.store.repository(NODES).get(node_id)
        if node is not None and node.state == "retired":
            node_id = f"node_{secrets.token_hex(8)}"  # a retired node stays retired: the machine joins as a new one
        join_id, join_token, join_hash = new_join_token()
        join = (join_id, join_hash)
        boot["join_token"] = base64.b64encode(
            await kms.encrypt(join_token.encode(), context=join_token_context(machine.id))
        ).decode()
        boot["join_token_id"] = join_id
    outcome = StepOutcome.next()
    async with ctx.writes(outcome=outcome) as tx:
        if join is not None:
            await tx.repository(JOIN_TOKENS).create(
                id=join[0],
                pool_id=machine.pool_id,
                tenant=machine.tenant,
                secret_hash=join[1],
                uses=1,
                expires_at=now + DEPLOY_JOIN_TTL,
                expect={"hardware_key": machine.hardware_key, "node_id": node_id},
                reclaim="same-hardware",
                created_by=f"machine:{machine.id}",
            )
        await tx.repository(METAL).update_machine(
            machine.id,
            node_id=node_id,
            step="boot",
            reason=None,
            message=None,
            boot=boot,
            ramdisk_token={
                "id": token_id,
                "hash": secret_hash.hex(),
                "expires_at": (now + RAMDISK_TOKEN_TTL).isoformat(),
            },
            tasks=TASKS[ctx.type],
            task=None,
        )
    return outcome


async def _site_serving(ctx: StepContext, machine: MachineRecord) -> bool:
    """Whether the site's active boot server has fetched the plan since this boot was prepared (else a machine that
    boots at once could be served the last boot's spent token)."""
    prepared = machine.boot.get("prepared_at")
    if not isinstance(prepared, str):
        return True
    prepared_at = dt.datetime.fromisoformat(prepared)
    deadline = time.monotonic() + SITE_PICKUP.total_seconds()
    while True:
        site = await ctx.store.repository(METAL).get_site(machine.site_id)
        synced = site.boot_synced_at if site is not None else None
        if synced is not None and synced > prepared_at:
            return True
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.5)


async def _pxe_boot(ctx: StepContext, machine: MachineRecord) -> StepOutcome:
    """Once the site serves this boot: one-time PXE boot over Redfish, then power on (or reset a machine that is
    on)."""
    if not await _site_serving(ctx, machine):
        message = "the site's boot server has not fetched the boot plan: is `bcd site run` running there?"
        if ctx.attempt < BMC_ATTEMPTS:
            await _note(ctx, machine.id, step="boot", reason="SITE_NOT_SERVING", message=message)
            return StepOutcome.retry(dt.timedelta(seconds=5), reason="SITE_NOT_SERVING")
        return await _fail(ctx, machine.id, "SITE_NOT_SERVING", message)
    async with await bmc_client(ctx.context, machine) as client:
        await client.set_boot_once("Pxe")
        state = await client.power_state()
        await client.power("reset" if state == "On" else "on")
        state = await client.power_state()
    outcome = StepOutcome.next()
    async with ctx.writes(outcome=outcome) as tx:
        await tx.repository(METAL).update_machine(machine.id, step="ramdisk", power_state=state)
    return outcome


async def _await_ramdisk(ctx: StepContext, machine: MachineRecord) -> StepOutcome:
    # At its timeout the workflow goes on without the event: the next step fails the machine (RAMDISK_TIMEOUT).
    return StepOutcome.wait("ramdisk.done", timeout=RAMDISK_WAIT, on_timeout="next")


async def _ramdisk_failed(ctx: StepContext, machine: MachineRecord) -> StepOutcome | None:
    if "ramdisk.done" not in ctx.data:
        minutes = int(RAMDISK_WAIT.total_seconds() // 60)
        return await _fail(
            ctx,
            machine.id,
            "RAMDISK_TIMEOUT",
            f"the ramdisk did not finish within {minutes} minutes (did the machine PXE-boot through its site?)",
        )
    done = dict(ctx.data["ramdisk.done"])
    if done.get("ok"):
        return None
    kind = str(done.get("kind") or "ramdisk")
    return await _fail(
        ctx, machine.id, f"{kind.upper()}_FAILED", str(done.get("error") or f"the ramdisk's {kind} failed")[:500]
    )


async def _finish_ready(ctx: StepContext, machine: MachineRecord) -> StepOutcome:
    """After a commissioning or a release: the ramdisk's work judged, the machine powered off and ``ready``."""
    failed = await _ramdisk_failed(ctx, machine)
    if failed is not None:
        return failed
    async with await bmc_client(ctx.context, machine) as client:
        await client.power("off")
        state = await client.power_state()
    outcome = StepOutcome.next()
    async with ctx.writes(outcome=outcome) as tx:
        await tx.repository(METAL).update_machine(
            machine.id,
            state="ready",
            step=None,
            reason=None,
            message=None,
            power_state=state,
            boot={"action": "local"},
            ramdisk_token=None,
            task=None,
            tasks=(),
            image_id=None,
            disk=None,
        )
    log.info("machine %s is ready (%s)", machine.id, ctx.type)
    return outcome


COMMISSION = Workflow(
    name="metal-commission",
    steps=[
        machine_step("prepare", _prepare_ramdisk),
        machine_step("boot", _pxe_boot),
        machine_step("ramdisk", _await_ramdisk),
        machine_step("finish", _finish_ready),
    ],
)

# --- deploy and release -----------------------------------------------------------------------------------------


async def _installed(ctx: StepContext, machine: MachineRecord) -> StepOutcome:
    """The image is on the disk: from now on the site boots the machine from it (the ramdisk reboots it)."""
    failed = await _ramdisk_failed(ctx, machine)
    if failed is not None:
        return failed
    outcome = StepOutcome.wait("node.joined", timeout=NODE_WAIT, on_timeout="next")
    async with ctx.writes(outcome=outcome) as tx:
        boot = {"action": "local", "join_token_id": machine.boot.get("join_token_id")}
        await tx.repository(METAL).update_machine(
            machine.id, step="join", message="waiting for the installed system to join", boot=boot, ramdisk_token=None
        )
    return outcome


async def _joined(ctx: StepContext, machine: MachineRecord) -> StepOutcome:
    if "node.joined" not in ctx.data:
        return await _fail(ctx, machine.id, "JOIN_TIMEOUT", "the installed system did not join within an hour")
    outcome = StepOutcome.wait("node.adopted", timeout=NODE_WAIT, on_timeout="next")
    async with ctx.writes(outcome=outcome) as tx:
        await tx.repository(METAL).update_machine(
            machine.id, step="adopt", message=f"node {machine.node_id} joined; its acceptance checks run"
        )
    return outcome


async def _deployed(ctx: StepContext, machine: MachineRecord) -> StepOutcome:
    if "node.adopted" not in ctx.data:
        return await _fail(
            ctx, machine.id, "ADOPTION_TIMEOUT", f"node {machine.node_id} joined but was not adopted within an hour"
        )
    outcome = StepOutcome.next()
    async with ctx.writes(outcome=outcome) as tx:
        await tx.repository(METAL).update_machine(
            machine.id, state="deployed", step=None, reason=None, message=None, task=None, tasks=()
        )
    log.info("machine %s is deployed as node %s", machine.id, machine.node_id)
    return outcome


DEPLOY = Workflow(
    name="metal-deploy",
    steps=[
        machine_step("prepare", _prepare_ramdisk),
        machine_step("boot", _pxe_boot),
        machine_step("ramdisk", _await_ramdisk),
        machine_step("installed", _installed),
        machine_step("joined", _joined),
        machine_step("finish", _deployed),
    ],
)

RELEASE = Workflow(
    name="metal-release",
    steps=[
        machine_step("prepare", _prepare_ramdisk),
        machine_step("boot", _pxe_boot),
        machine_step("ramdisk", _await_ramdisk),
        machine_step("finish", _finish_ready),
    ],
)

WORKFLOWS = (INSPECT, COMMISSION, DEPLOY, RELEASE)


async def watch_nodes(context: ModuleContext) -> int:
    """Tell deploy workflows that their node joined, then that it was adopted (read from the nodes table: converges
    by polling, with no notifier)."""
    machines = await context.store.repository(METAL).deploying()
    signalled = 0
    for machine in machines:
        node = await context.store.repository(NODES).get(machine.node_id)
        if node is None or machine.workflow_id is None:
            continue
        event = None
        if machine.step == "join" and node.join_token_id == machine.boot.get("join_token_id"):
            event = "node.joined"
        elif machine.step == "adopt" and node.state == "adopted":
            event = "node.adopted"
        if event is not None:
            async with context.store.transaction() as tx:
                signalled += await signal_workflow_in(tx, machine.workflow_id, event, {"node_state": node.state})
    return signalled


NODE_WATCH = Job(name="metal-node-watch", role="controllers", interval=dt.timedelta(seconds=2), run=watch_nodes)

BOOT_RECORDS_KEPT = dt.timedelta(days=7)


async def trim_boot_records(context: ModuleContext) -> int:
    """Forget the boot records older than a week (``metal.get`` shows the latest only)."""
    return await context.store.repository(METAL).trim_boot_records(before=context.clock.now() - BOOT_RECORDS_KEPT)


BOOT_RECORDS_TRIM = Job(
    name="metal-boot-records", role="controllers", interval=dt.timedelta(minutes=10), run=trim_boot_records
)


def by_name(name: str) -> Workflow:
    """The machine workflow of that name (inspection when unknown)."""
    return next((w for w in WORKFLOWS if w.name == name), INSPECT)


async def start(tx: Transaction, workflow: Workflow, machine: MachineRecord, **data: Any) -> MachineRecord:
    """Start ``workflow`` on ``machine`` in ``tx`` and show it on the machine (state, first step)."""
    workflow_id = await start_workflow_in(tx, workflow, tenant=machine.tenant, subject=machine.id, data=data)
    state = {
        "metal-inspect": "enrolled",
        "metal-commission": "commissioning",
        "metal-deploy": "deploying",
        "metal-release": "releasing",
    }[workflow.name]
    results = {k: v for k, v in machine.results.items() if k not in ("workflow", "workflow_data")}
    results["workflow"] = workflow.name
    results["workflow_data"] = data
    updated = await tx.repository(METAL).update_machine(
        machine.id,
        state=state,
        step=workflow.steps[0].name,
        reason=None,
        message=None,
        workflow_id=workflow_id,
        results=results,
        **({"image_id": data["image_id"], "disk": data["disk"]} if workflow.name == "metal-deploy" else {}),
    )
    assert updated is not None
    return updated
