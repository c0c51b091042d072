"""What every part of the module that moves an instance shares: the names an instance and its pools go by, the
outbox event of each of its changes, and its end.

The groups' handlers change what an instance should be; its node (``_hosted``) or its provider workflow
(``_workflows``) converges to it and reports back. All of them publish ``instance.<what>`` events and finish a
deletion the same way, so those live here, below all of them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from bettercompute.ports import OutboxEvent, ResourceRef, Transaction
from bettercompute_vps._port import VPS, InstanceRecord

__all__ = [
    "HOSTED",
    "INSTANCE",
    "PROVIDER",
    "event",
    "finish_delete",
    "in_pool",
    "in_tenant",
    "on_instance",
    "size_of",
]

INSTANCE = "compute-instance"
"""The resource type of an instance (what IAM decides on, and what the audit rows name)."""
HOSTED, PROVIDER = "vps-host", "provider"
"""The pool classes instances run in: on the pool's nodes, or at the pool's cloud provider."""


def in_pool(input: Any) -> ResourceRef:
    """The resource a method on a pool's instances is decided on."""
    return ResourceRef(type=INSTANCE, tenant=input.tenant, pool=input.pool_id)


def in_tenant(input: Any) -> ResourceRef:
    """The resource a method on a tenant's instances is decided on."""
    return ResourceRef(type=INSTANCE, tenant=input.tenant)


def on_instance(input: Any) -> ResourceRef:
    """The resource a method on one instance is decided on (its projection row)."""
    return ResourceRef(type=INSTANCE, id=input.id)


def size_of(record: InstanceRecord) -> dict[str, int]:
    """The instance's size, as events and audit rows show it."""
    return {"vcpu": record.vcpu, "memory_mib": record.memory_mib, "disk_gib": record.disk_gib, "gpus": record.gpus}


def event(record: InstanceRecord, what: str, **extra: Any) -> OutboxEvent:
    """The outbox event ``instance.<what>``."""
    payload: dict[str, Any] = {
        "instance_id": record.id,
        "tenant": record.tenant,
        "pool_id": record.pool_id,
        "state": record.state,
        "node_id": record.node_id,
        "provider_id": record.provider_id,
    }
    payload.update(extra)
    return OutboxEvent(type=f"instance.{what}", key=record.id, payload=payload)


async def finish_delete(tx: Transaction, record: InstanceRecord, now: dt.datetime) -> InstanceRecord:
    """The instance is gone: ``deleted``, its booking closed, its capacity free."""
    vps = tx.repository(VPS)
    await vps.close_booking(record.id, at=now)
    done = await vps.update_instance(
        record.id, state="deleted", step=None, reason=None, message=None, deleted_at=now, observed_spec=record.spec
    )
    assert done is not None
    await tx.publish([event(done, "deleted")])
    return done
