"""``VmHost``: the ``instances`` of a node's desired state, carried out on a ``VmRuntime`` and reported back.

``apply`` takes a whole desired ``instances`` section: instances it lists are applied, those it no longer lists are
destroyed, and it returns once each of them was acted on (its VM started or stopped, or it failed, or it was deleted).
Calls for one instance never overlap; a call overtaken by a newer desired state for the same instance is skipped.

``run`` reports every instance's status with ``report`` (``instances.report``'s input) whenever one changes, and at
most every ``console_interval`` seconds while a console tail changes; a report that fails is sent again later (with
what is true then), and never stops the loop. It also watches for VMs that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ._runtime import InstanceStatus, VmRuntime
from ._spec import InstanceSpec, SpecError

__all__ = ["CONSOLE_BYTES", "Report", "VmHost"]

log = logging.getLogger("bcd.vm")

CONSOLE_BYTES = 16 * 1024
"""The most of a console tail a report carries."""

Report = Callable[[Mapping[str, Any]], Awaitable[None]]
"""Sends ``instances.report`` (raises when it could not)."""


class VmHost:
    """A node's instances (see the module docstring).

    Args:
        runtime: What runs the VMs.
        report: Sends a report; ``None`` until a session is there (``set_report``).
        console_interval: The shortest time between two reports sent only for a console change.
        poll_interval: How often VMs are checked for having died.
    """

    def __init__(
        self,
        runtime: VmRuntime,
        *,
        report: Report | None = None,
        console_interval: float = 2.0,
        poll_interval: float = 1.0,
    ) -> None:
        self.runtime = runtime
        self._report = report
        self._console_interval = console_interval
        self._poll_interval = poll_interval
        self._locks: dict[str, asyncio.Lock] = {}
        self._wanted: dict[str, InstanceSpec | None] = {}
        self._invalid: dict[str, InstanceStatus] = {}
        self._changed = asyncio.Event()
        self._changed.set()  # the first report says what is there after a restart
        self._sent_states: object = None
        self._sent_consoles: dict[str, str] = {}

    def set_report(self, report: Report | None) -> None:
        """Report through ``report`` from now on (``None``: hold reports until one is set)."""
        self._report = report
        if report is not None:
            self._changed.set()

    async def apply(self, specs: Sequence[InstanceSpec], invalid: Mapping[str, SpecError] | None = None) -> None:
        """Carry out a desired ``instances`` section: ``specs``, and the ids of entries that were malformed (each is
        reported failed with ``INVALID_SPEC``, and left as it is on the node)."""
        invalid = invalid or {}
        listed = {spec.id for spec in specs} | set(invalid)
        for ident, problem in invalid.items():
            self._invalid[ident] = InstanceStatus(
                id=ident, spec=0, state="failed", reason="INVALID_SPEC", message=str(problem)
            )
        for ident in list(self._invalid):
            if ident not in invalid:
                del self._invalid[ident]
        gone = [i for i in set(self.runtime.known()) | {i for i, s in self._wanted.items() if s} if i not in listed]
        for spec in specs:
            self._wanted[spec.id] = spec
        for ident in gone:
            self._wanted[ident] = None
        self._changed.set()
        await asyncio.gather(*(self._one(spec.id, spec) for spec in specs), *(self._one(i, None) for i in gone))

    async def _one(self, ident: str, spec: InstanceSpec | None) -> None:
        lock = self._locks.setdefault(ident, asyncio.Lock())
        async with lock:
            if self._wanted.get(ident) is not spec:
                return  # a newer desired state took over; its own call acts on it
            try:
                if spec is None:
                    await self.runtime.destroy(ident)
                    self._wanted.pop(ident, None)
                    self._sent_consoles.pop(ident, None)
                else:
                    await self.runtime.apply(spec)
            except Exception:  # a runtime's bug must not stop the other instances, nor the session
                log.exception("instance %s: could not be applied", ident)
            finally:
                self._changed.set()
        if spec is None and not lock.locked():
            self._locks.pop(ident, None)

    def address_of(self, instance_id: str) -> str | None:
        """The instance's address on the node's VM network (``None``: none assigned)."""
        return self.runtime.address_of(instance_id)

    def endpoint(self, instance_id: str, port: int) -> tuple[str, int] | None:
        """Where the node opens a TCP connection to ``port`` of the instance (see ``VmRuntime.endpoint``)."""
        return self.runtime.endpoint(instance_id, port)

    def tunnel_endpoint(self, instance_id: str, port: int) -> tuple[str, int] | None:
        """Where a tunnel to ``port`` of an instance connects: only an instance this node is told to run, only one
        of the ports its spec exposes (``None`` otherwise)."""
        spec = self._wanted.get(instance_id)
        if spec is None or port not in spec.ports:
            return None
        return self.endpoint(instance_id, port)

    def statuses(self) -> list[InstanceStatus]:
        """Every instance's status: those the runtime knows, and the malformed ones."""
        known = [self.runtime.status(i) for i in sorted(set(self.runtime.known()) | set(self._wanted))]
        return [s for s in known if s is not None] + list(self._invalid.values())

    def snapshot(self) -> dict[str, Any]:
        """``instances.report``'s input as of now."""
        return {"instances": [self._entry(s) for s in self.statuses()]}

    def _entry(self, status: InstanceStatus) -> dict[str, Any]:
        return {
            "id": status.id,
            "spec": status.spec,
            "state": status.state,
            "reason": status.reason,
            "message": status.message,
            "addresses": list(status.addresses),
            "console": _at_most(self.runtime.console_tail(status.id, CONSOLE_BYTES), CONSOLE_BYTES),
        }

    async def run(self) -> None:
        """Report and watch, until cancelled."""
        backoff = 1.0
        loop = asyncio.get_running_loop()
        last_sent = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval):
                    await self._changed.wait()
            if self.runtime.poll():
                self._changed.set()
            report = self._report
            if report is None:  # no session: set_report marks everything changed once there is one
                self._changed.clear()
                continue
            snapshot = self.snapshot()
            states = [{k: v for k, v in e.items() if k != "console"} for e in snapshot["instances"]]
            consoles = {e["id"]: e["console"] for e in snapshot["instances"]}
            state_changed = states != self._sent_states
            console_changed = consoles != self._sent_consoles
            due = loop.time() - last_sent >= self._console_interval
            if not state_changed and not (console_changed and due):
                self._changed.clear()
                continue
            self._changed.clear()
            try:
                await report(snapshot)
            except Exception as exc:  # a failed report is sent again (with what is true then); never fatal
                log.warning("instances.report failed (%s); trying again in %.0f s", exc, backoff)
                self._changed.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            backoff = 1.0
            last_sent = loop.time()
            self._sent_states, self._sent_consoles = states, consoles


def _at_most(text: str, size: int) -> str:
    """The end of ``text`` that fits in ``size`` bytes of UTF-8 (a console's undecodable bytes became U+FFFD, three
    bytes each)."""
    encoded = text.encode()
    return text if len(encoded) <= size else encoded[-size:].decode(errors="ignore")
