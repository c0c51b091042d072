"""The ``webhooks`` module: its group, the fan-out subscriber and the sender job."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.jobs import SINKS_POKE, Job
from bettercompute._version import __version__
from bettercompute.modules.webhooks import _service
from bettercompute.modules.webhooks._methods import ACTIONS, WebhooksGroup
from bettercompute.modules.webhooks._port import (
    SEALED_PREVIOUS_WEBHOOK_SECRETS,
    SEALED_WEBHOOK_SECRETS,
    WEBHOOKS,
)
from bettercompute.ports import Migration, Repository, Sealed, StoredEvent

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.registry import GroupSpec

__all__ = ["NEEDS_KMS", "RETENTION", "SENDER", "WebhooksModule"]

NEEDS_KMS = (
    "webhooks need Options.kms: a KMS seals each subscription's signing secret (bettercompute.LocalKeyKms(path), the"
    " same key file in every process)"
)
"""What the ``webhooks`` group answers (``FAILED_PRECONDITION``) where no KMS is configured."""

SENDER = Job(name="webhooks", role="sinks", interval=None, run=_service.send_due, wake_on=SINKS_POKE)
"""The sender: ``sinks/webhooks``, after ``sinks/events`` in each ``tick()``; in loops, every
``Options.poll_interval`` and at once when the events dispatcher (or ``webhooks.test``) pokes ``@sinks``."""

RETENTION = Job(name="webhooks-retention", role="sinks", interval=dt.timedelta(minutes=10), run=_service.purge_finished)
"""The purge of finished deliveries: ``sinks/webhooks-retention``, after the sender in each ``tick()``. A job of its
own rather than a step of the sender's pass: it needs to run every few minutes, not every second, and a slow or
failing purge never holds back a delivery."""


class WebhooksModule:
    """Always registered by ``better_compute()``. Without ``Options.kms`` (``kms=False``) it is ``unavailable``: its
    group answers ``FAILED_PRECONDITION`` naming the option, and it runs no job and fans nothing out."""

    name = "webhooks"
    version = __version__
    core_range = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (WebhooksGroup,)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    repositories: Sequence[Repository[Any]] = (WEBHOOKS,)
    sealed: Sequence[Repository[Sealed]] = (SEALED_WEBHOOK_SECRETS, SEALED_PREVIOUS_WEBHOOK_SECRETS)

    def __init__(self, *, kms: bool = True) -> None:
        self.unavailable: str | None = None if kms else NEEDS_KMS
        self.jobs: Sequence[Job] = (SENDER, RETENTION) if kms else ()
        self._unsubscribe: Callable[[], None] | None = None

    async def start(self, context: ModuleContext) -> None:
        """Subscribe the fan-out to committed events (with a KMS)."""
        if self._unsubscribe is None and self.unavailable is None:

            async def subscriber(event: StoredEvent) -> None:
                await _service.fan_out(context, event)

            self._unsubscribe = context.events.subscribe(subscriber)

    async def stop(self) -> None:
        """Stop fanning out events (the outbox keeps them for whoever runs ``sinks`` next)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
