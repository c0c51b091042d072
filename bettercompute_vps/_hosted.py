"""Hosted pools: what each node offers, the instances in its desired state, and what its daemon reports back.

- The ``vps-hosts`` job turns every ``vps-host`` node's ``vm`` inventory section (what its daemon offers to VMs:
  ``{"vcpu", "memory_mib", "disk_gib", "gpus": [uuid, ...]}``) and its lifecycle into the host row placement reads.
  A node without that section (a daemon that runs no VMs) offers nothing.
- The ``vps-node`` reconciler makes a node's desired state carry exactly its instances (the ``instances`` section,
  next to the other sections), whenever one of them changes.
- ``instances.report`` is the daemon's gateway method: the state of each instance it runs (and its console's tail).
  An instance being deleted that the daemon no longer runs is then ``deleted``.
- The ``vps-node-watch`` job follows the node lifecycle: on an ``unreachable`` node an instance shows why; on a
  ``failed`` or ``retired`` one it fails (``NODE_FAILED``) and frees its place, or is deleted if it was asked to be.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

from bettercompute import GatewayCall, GatewayMethod, Job, ModuleContext, Outcome, ReconcileContext, Reconciler
from bettercompute.errors import AccessDeniedError, ComputeError, InvalidInputError
from bettercompute.modules.images import IMAGES, ImageRecord
from bettercompute.modules.nodes import NODES, poke_gateways, prepared_signer, set_desired_state
from bettercompute.ports import Store, WorkItem
from bettercompute_vps._lifecycle import event, finish_delete
from bettercompute_vps._port import VPS, HostRecord, InstanceRecord

__all__ = ["HOST_SYNC", "NODE_CONTROLLER", "NODE_WATCH", "REPORT", "desired_entry", "node_item"]

log = logging.getLogger("bettercompute.vps")

NODE_KIND = "vps-node"
MAX_CONSOLE_CHARS = 16 * 1024
MAX_REPORTED = 512
_REPORTED_STATES = frozenset({"provisioning", "running", "stopped", "failed"})


def node_item(node_id: str) -> WorkItem:
    """The work item that brings ``node_id``'s desired state in line with its instances."""
    return NODE_CONTROLLER.item(node_id)


# --- host offers --------------------------------------------------------------------------------------------------


# What one node may offer at most: a node's report never becomes a value the host row cannot hold (which would stop
# the job for every node after it), nor an offer no machine has.
MAX_OFFER = {"vcpu": 4096, "memory_mib": 64 * 1024 * 1024, "disk_gib": 1024 * 1024}


def _int(value: Any, limit: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return 0
    return min(value, limit)


def offer_of(row: Mapping[str, Any]) -> HostRecord:
    """A host row from a node's lifecycle and its ``vm`` inventory section."""
    vm = row.get("vm") if isinstance(row.get("vm"), dict) else None
    reason: str | None = None
    if row["state"] != "adopted":
        reason = f"node_{row['state']}"
    elif row["cordoned"]:
        reason = "node_cordoned"
    elif vm is None:
        reason = "no_vm_capacity"
    gpus = vm.get("gpus") if vm is not None else None
    return HostRecord(
        node_id=row["node_id"],
        pool_id=row["pool_id"],
        tenant=row["tenant"],
        vcpu=_int(vm.get("vcpu"), MAX_OFFER["vcpu"]) if vm is not None else 0,
        memory_mib=_int(vm.get("memory_mib"), MAX_OFFER["memory_mib"]) if vm is not None else 0,
        disk_gib=_int(vm.get("disk_gib"), MAX_OFFER["disk_gib"]) if vm is not None else 0,
        gpus=tuple(sorted(g for g in gpus if isinstance(g, str) and 0 < len(g) <= 128 and g.isprintable()))[:64]
        if isinstance(gpus, list)
        else (),
        available=reason is None,
        reason=reason,
    )


async def sync_hosts(context: ModuleContext) -> int:
    """One pass of the ``vps-hosts`` job: every host row as its node's inventory and lifecycle say."""
    store = context.store
    changed = 0
    for row in await store.repository(VPS).host_offers(limit=100_000):
        try:
            if await store.repository(VPS).upsert_host(offer_of(row)):
                changed += 1
        except ComputeError as exc:  # one node's row never holds up the others'
            log.warning("vps hosts: node %s not synced: %s", row.get("node_id"), exc.code)
    if changed:
        log.info("vps hosts: %d changed", changed)
    return changed


HOST_SYNC = Job(name="vps-hosts", role="controllers", interval=dt.timedelta(seconds=2), run=sync_hosts)


# --- desired state ------------------------------------------------------------------------------------------------


def _file(image: ImageRecord | None) -> dict[str, Any] | None:
    if image is None:
        return None
    return {"url": image.url, "sha256": image.sha256, "size": image.size}


async def desired_entry(store: Store, record: InstanceRecord, images: dict[str, ImageRecord | None]) -> dict[str, Any]:
    """What a node's daemon is told of one instance (the ``instances`` section's entry)."""

    async def image(image_id: str | None) -> ImageRecord | None:
        if image_id is None:
            return None
        if image_id not in images:
            images[image_id] = await store.repository(IMAGES).get(image_id)
        return images[image_id]

    disk = await image(record.image_id)
    return {
        "id": record.id,
        "tenant": record.tenant,
        "spec": record.spec,
        "power": record.power,
        "boot": record.boot,
        "vcpu": record.vcpu,
        "memory_mib": record.memory_mib,
        "disk_gib": record.disk_gib,
        "gpus": list(record.gpu_ids),
        "hostname": record.hostname,
        "ssh_authorized_keys": list(record.ssh_keys),
        "user_data": record.user_data,
        "ports": list(record.ports),
        "image": {
            "id": record.image_id,
            "url": disk.url if disk is not None else None,
            "sha256": disk.sha256 if disk is not None else None,
            "size": disk.size if disk is not None else None,
            "format": (disk.format or "raw") if disk is not None else "raw",
            "kernel": _file(await image(disk.kernel_id if disk is not None else None)),
            "initrd": _file(await image(disk.initrd_id if disk is not None else None)),
            "cmdline": disk.cmdline if disk is not None else None,
        },
    }


async def reconcile_node(ctx: ReconcileContext, node_id: str) -> Outcome:
    """Carry exactly the node's live instances in its desired state; a pending one becomes ``provisioning``."""
    store = ctx.store
    instances = await store.repository(VPS).on_node(node_id)
    images: dict[str, ImageRecord | None] = {}
    wanted = [await desired_entry(store, r, images) for r in instances if not r.deleting]
    wrote = False
    signer = await prepared_signer(ctx.context)  # loaded before the transaction that signs
    async with ctx.transaction() as tx:
        node = await tx.repository(NODES).get_for_update(node_id)
        if node is None or node.state in ("failed", "retired"):
            return Outcome.done()  # the node watch fails (or deletes) its instances
        current = await tx.repository(NODES).desired_newer([(node_id, -1)])
        content = dict(current[0].content) if current else {}
        if content.get("instances") != wanted:
            await set_desired_state(tx, node, {**content, "instances": wanted}, signer=signer)
            wrote = True
        vps = tx.repository(VPS)
        for record in instances:
            if record.state == "pending" and not record.deleting:
                updated = await vps.update_instance(record.id, state="provisioning", step="apply")
                if updated is not None:
                    await tx.publish([event(updated, "provisioning")])
    if wrote:
        await poke_gateways(ctx.context.notifier)
    return Outcome.done()


NODE_CONTROLLER = Reconciler(kind=NODE_KIND, reconcile=reconcile_node)


# --- the daemon's reports -----------------------------------------------------------------------------------------


def _text(value: Any, limit: int) -> str | None:
    if not isinstance(value, str):
        return None
    cleaned = "".join(c for c in value[:limit] if c == "\n" or c == "\t" or (c.isprintable() and c != "\x00"))
    try:
        cleaned.encode("utf-8")
    except UnicodeEncodeError:
        cleaned = cleaned.encode("utf-8", "replace").decode("utf-8")
    return cleaned


def _addresses(value: Any) -> tuple[str, ...]:
    import ipaddress

    found: list[str] = []
    for item in value if isinstance(value, list) else ():
        if isinstance(item, str) and len(item) <= 64:
            try:
                address = ipaddress.ip_address(item)
            except ValueError:
                continue
            # An instance's address is one a tenant may use: never loopback, link-local (the metadata service's),
            # multicast or unspecified, whatever a node says.
            if not (address.is_loopback or address.is_link_local or address.is_multicast or address.is_unspecified):
                found.append(str(address))
    return tuple(found[:16])


async def report(call: GatewayCall) -> Mapping[str, Any]:
    """``instances.report``: a node says how each instance it runs is doing. Only instances placed on the calling
    node are touched; one being deleted that the node does not list is ``deleted``."""
    assert call.caller is not None
    node_id = call.caller.id
    items = call.input.get("instances")
    if not isinstance(items, list) or len(items) > MAX_REPORTED:
        raise InvalidInputError(f"instances: a list of at most {MAX_REPORTED}", details={"path": "instances"})
    store = call.context.store
    node = await store.repository(NODES).get(node_id)
    if node is None or node.state == "retired":
        raise AccessDeniedError("the node is retired", details={"reason": "node_retired"})
    reported: dict[str, Mapping[str, Any]] = {}
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            reported[item["id"]] = item
    now = call.context.clock.now()
    changed = 0
    async with store.transaction() as tx:
        vps = tx.repository(VPS)
        for record in await vps.on_node(node_id):
            item = reported.get(record.id)
            if item is None:
                if record.deleting:
                    await finish_delete(tx, record, now)
                    changed += 1
                continue
            if record.deleting:
                continue  # the daemon is taking it down
            fields = _observed(record, item, now)
            if fields:
                updated = await vps.update_instance(record.id, **fields)
                changed += 1
                if updated is not None and "state" in fields and fields["state"] != record.state:
                    await tx.publish([event(updated, str(fields["state"]), reason=fields.get("reason"))])
    return {"changed": changed}


def _observed(record: InstanceRecord, item: Mapping[str, Any], now: dt.datetime) -> dict[str, Any]:
    """The fields a report changes on one instance."""
    fields: dict[str, Any] = {}
    spec = item.get("spec")
    state = item.get("state")
    current = isinstance(spec, int) and not isinstance(spec, bool) and spec == record.spec
    if state in _REPORTED_STATES and current:
        reason = _text(item.get("reason"), 64) or None
        message = _text(item.get("message"), 500) or None
        new_state = str(state)
        if new_state in ("running", "stopped") and new_state == record.power:
            fields.update(state=new_state, step=None, reason=None, message=None, observed_spec=record.spec)
        elif new_state == "failed":
            fields.update(state="failed", step=None, reason=reason or "VM_FAILED", message=message)
        else:
            fields.update(
                state="provisioning", step=_text(item.get("step"), 64) or "apply", reason=reason, message=message
            )
        fields = {k: v for k, v in fields.items() if getattr(record, k) != v}
    addresses = _addresses(item.get("addresses"))
    if addresses and addresses != record.addresses:
        fields["addresses"] = addresses
    console = _text(item.get("console"), MAX_CONSOLE_CHARS)
    if console is not None and console != record.console:
        fields["console"] = console
        fields["console_at"] = now
    return fields


REPORT = GatewayMethod(name="instances.report", roles={"node"}, handler=report)


# --- the node lifecycle -------------------------------------------------------------------------------------------


async def watch_nodes(context: ModuleContext) -> int:
    """One pass of ``vps-node-watch``: instances on nodes that are gone or out of reach."""
    store = context.store
    now = context.clock.now()
    found = await store.repository(VPS).on_gone_nodes(limit=500)
    for record in found:
        assert record.node_id is not None
        node = await store.repository(NODES).get(record.node_id)
        node_state = node.state if node is not None else "retired"
        async with store.transaction() as tx:
            vps = tx.repository(VPS)
            locked = await vps.get_instance(record.id, lock=True)
            if locked is None or locked.deleted_at is not None:
                continue
            if node_state == "unreachable":
                if locked.reason != "NODE_UNREACHABLE" and locked.state != "failed":
                    await vps.update_instance(
                        locked.id,
                        reason="NODE_UNREACHABLE",
                        message=f"node {locked.node_id} has no session; the instance's state is its last known",
                    )
                continue
            if locked.deleting:
                await finish_delete(tx, locked, now)
                continue
            if locked.state == "failed" and locked.reason == "NODE_FAILED":
                continue
            await vps.close_booking(locked.id, at=now)
            failed = await vps.update_instance(
                locked.id,
                state="failed",
                step=None,
                reason="NODE_FAILED",
                message=f"node {locked.node_id} is {node_state}; delete the instance and create it again",
                node_id=None,
                gpu_ids=(),
            )
            if failed is not None:
                await tx.publish([event(failed, "failed", reason="NODE_FAILED", failed_node=record.node_id)])
    return len(found)


NODE_WATCH = Job(name="vps-node-watch", role="controllers", interval=dt.timedelta(seconds=5), run=watch_nodes)
