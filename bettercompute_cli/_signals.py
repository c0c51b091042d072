"""The stop signals of the long-running commands (``serve``, ``dev``, ``mcp --http``), apart from the runtime so
that a command which does not load the control plane can use them."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from types import FrameType

__all__ = ["STOP_SIGNALS", "no_signal_reraise"]

log = logging.getLogger("bettercompute.cli")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that ask a long-running command to stop gracefully."""


def _ignore_signal(signum: int, frame: FrameType | None) -> None:
    log.debug("ignoring signal %d while shutting down", signum)


@contextlib.contextmanager
def no_signal_reraise() -> Iterator[None]:
    """Make SIGINT and SIGTERM harmless around uvicorn's server.

    uvicorn handles both signals while it serves, and after a graceful shutdown raises the signal again for the
    handler it found. With Python's defaults that is a KeyboardInterrupt (a traceback) or an immediate kill (exit
    -15, the workers never stopped); with these handlers it is nothing, and the process then exits 0.
    """
    previous = {sig: signal.signal(sig, _ignore_signal) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
