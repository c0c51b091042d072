"""What a VM runtime offers ``bcd node`` (``VmRuntime``), and what it says of an instance (``InstanceStatus``)."""

from __future__ import annotations

from typing import Literal, Protocol

import attrs

from ._spec import InstanceSpec

__all__ = ["REASONS", "InstanceState", "InstanceStatus", "VmRuntime"]

InstanceState = Literal["provisioning", "running", "stopped", "failed"]

REASONS = (
    "INVALID_SPEC",
    "IMAGE_REFUSED",
    "IMAGE_FETCH_FAILED",
    "IMAGE_CHECKSUM_MISMATCH",
    "DISK_FAILED",
    "SEED_FAILED",
    "NETWORK_FAILED",
    "VM_START_FAILED",
    "VM_STOP_FAILED",
    "VM_CRASHED",
)
"""The machine-readable reasons of a ``failed`` instance."""


@attrs.frozen(kw_only=True)
class InstanceStatus:
    """An instance as the node sees it.

    Attributes:
        id: The instance.
        spec: The desired spec number this status is about.
        state: ``provisioning`` (fetching its image, making its disk and seed, starting), ``running``, ``stopped``
            or ``failed``.
        reason: One of ``REASONS`` when failed, else ``None``.
        message: For people: what happened.
        addresses: Where the node reaches the instance (its address on the node's VM network).
    """

    id: str
    spec: int
    state: InstanceState
    reason: str | None = None
    message: str = ""
    addresses: tuple[str, ...] = ()


class VmRuntime(Protocol):
    """Runs instances as VMs. Every method is idempotent and may be called again after a failure or a restart of
    the daemon; calls for one instance are never concurrent (the caller serialises them), calls for different
    instances may be."""

    def known(self) -> list[str]:
        """The instances that have anything on this node (a VM, a disk, a seed), including those a previous daemon
        left: the caller destroys those no longer wanted."""
        ...

    async def apply(self, spec: InstanceSpec) -> InstanceStatus:
        """Make the instance match ``spec``: fetch its image, make its disk and seed, and start it (``power``
        running), restart it (``boot`` grew, or its hardware changed) or stop it (``power`` stopped). Returns once
        the VM process was started or stopped, or the instance failed (never raises for the instance's own
        failures: they are in the status)."""
        ...

    async def stop(self, instance_id: str) -> InstanceStatus:
        """Stop the VM (a graceful power-down, then a kill after a grace period); its disk stays."""
        ...

    async def destroy(self, instance_id: str) -> None:
        """Stop the VM and remove everything of the instance: disk, seed, logs, network, address."""
        ...

    def status(self, instance_id: str) -> InstanceStatus | None:
        """The instance's last known status; ``None`` for an instance this runtime knows nothing of."""
        ...

    def poll(self) -> list[str]:
        """Check the VMs that should be running; the instances whose status changed (a VM that died)."""
        ...

    def console_tail(self, instance_id: str, max_bytes: int = 16384) -> str:
        """The last ``max_bytes`` of the instance's serial console (``""`` when there is none)."""
        ...

    def address_of(self, instance_id: str) -> str | None:
        """The address at which the node opens TCP connections to the instance (``None``: not assigned)."""
        ...

    def endpoint(self, instance_id: str, port: int) -> tuple[str, int] | None:
        """Where the node connects to reach ``port`` of the instance: its address and that port on a bridge, a
        forwarded port on 127.0.0.1 with user networking (``None``: not reachable, or the port not exposed)."""
        ...
