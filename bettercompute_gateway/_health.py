"""What the gateway's gRPC health service says: serving, unless it is draining or the last pass of the flush loop
could not reach the database."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

import bettercompute_proto as wire
from bettercompute_proto import health

from ._wire import receive

__all__ = ["Health"]

log = logging.getLogger("bettercompute.gateway")

_SERVED = frozenset({"", wire.SERVICE})
"""The services the health service answers for ("": the gateway as a whole)."""


class Health:
    """The gateway's serving status, and the ``Check`` and ``Watch`` calls that tell it."""

    def __init__(self, *, name: str, most: int) -> None:
        self._name = name
        self._most = most
        self.draining = False
        self._database_ok = True  # until a pass of the flush loop fails
        self._changed = asyncio.Event()  # set, and replaced, when the served status changes

    @property
    def serving(self) -> bool:
        """Not draining, and the database reached by the last pass of the flush loop."""
        return not self.draining and self._database_ok

    def drain(self) -> None:
        """Say ``NOT_SERVING`` from now on (load balancers send daemons elsewhere)."""
        before = self.serving
        self.draining = True
        self._may_have_changed(before)

    def database(self, *, ok: bool) -> None:
        """Whether the last pass of the flush loop reached the database."""
        before = self.serving
        self._database_ok = ok
        self._may_have_changed(before)

    def _may_have_changed(self, before: bool) -> None:
        if self.serving != before:
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
            log.warning("gateway %s is %s", self._name, "serving" if self.serving else "not serving")

    def _status(self) -> health.ServingStatus:
        return health.ServingStatus.SERVING if self.serving else health.ServingStatus.NOT_SERVING

    async def check(self, stream: Stream[Any, Any]) -> None:
        """``Check``: the status now (no client certificate needed; nothing is read from the database)."""
        request = await receive(stream, health.HealthCheckRequest, self._most)
        if request is None or request.service not in _SERVED:
            raise GRPCError(Status.NOT_FOUND, "unknown service")
        await stream.send_message(health.HealthCheckResponse(status=self._status()))

    async def watch(self, stream: Stream[Any, Any]) -> None:
        """``Watch``: the status now, then each change, until the caller leaves or the gateway closes; an unknown
        service gets ``SERVICE_UNKNOWN`` and the call stays open, as the protocol asks."""
        request = await receive(stream, health.HealthCheckRequest, self._most)
        if request is None or request.service not in _SERVED:
            await stream.send_message(health.HealthCheckResponse(status=health.ServingStatus.SERVICE_UNKNOWN))
            await asyncio.Event().wait()
        sent = None
        while True:
            changed = self._changed
            status = self._status()
            if status != sent:
                await stream.send_message(health.HealthCheckResponse(status=status))
                sent = status
            await changed.wait()
