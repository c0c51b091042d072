"""The one boundary where driver exceptions become ``bettercompute.errors`` classes.

Driver text can hold SQL, connection strings or row values, so no message built here quotes it; the driver's
exception stays reachable as ``__cause__`` for logs and tracebacks.
"""

from __future__ import annotations

import logging
from types import TracebackType

import psycopg
import psycopg.errors

from bettercompute.errors import ComputeError, ConflictError, InternalError, UnavailableError

__all__ = ["translate", "translated"]

log = logging.getLogger("bettercompute.store_pg")

UNREACHABLE = "the database is unreachable"
RETRY = "the database could not complete the transaction now; retry"
FAILED = "the database failed unexpectedly"
CONFLICT = "the change conflicts with one committed meanwhile (a name or key already taken); retry or change it"
OVERLAP = "the change overlaps one committed meanwhile (a unit of capacity already booked for that time)"


def translate(exc: BaseException) -> ComputeError | None:
    """The error a caller should see for ``exc``, or ``None`` when ``exc`` is not a database error."""
    if isinstance(exc, ComputeError):
        return None
    if isinstance(exc, psycopg.Error) and exc.sqlstate == "23505":
        # A uniqueness rule the statement's own checks could not see yet: a concurrent transaction committed the
        # same name or key first. That is the caller's conflict to resolve, not an internal failure.
        return ConflictError(CONFLICT)
    if isinstance(exc, psycopg.Error) and exc.sqlstate == "23P01":
        # An exclusion constraint: a booking overlapping one a concurrent transaction committed first.
        return ConflictError(OVERLAP)
    if isinstance(exc, psycopg.Error) and ((exc.sqlstate or "").startswith("40") or exc.sqlstate == "55P03"):
        # Class 40 (serialization failure, deadlock) and a lock wait past ``lock_timeout`` are worth retrying,
        # unlike the other driver errors.
        return UnavailableError(RETRY)
    if isinstance(exc, psycopg.Error) and exc.sqlstate in ("25P03", "25P04"):
        # The server ended a transaction that sat idle, or ran, too long (its connection is gone with it).
        return UnavailableError(UNREACHABLE)
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return UnavailableError(UNREACHABLE)
    if isinstance(exc, psycopg.Error):
        return InternalError(FAILED)
    if isinstance(exc, OSError | TimeoutError):
        return UnavailableError(UNREACHABLE)
    return None


class translated:  # a class, not a generator: it wraps every statement, and this costs less per use
    """``with translated():`` re-raises database errors raised inside the block as ``ComputeError`` subclasses,
    ``from`` the original.

    Raises:
        UnavailableError: The database cannot be reached, or asked for the transaction to be retried.
        ConflictError: A uniqueness rule was broken (a concurrent writer committed the same name or key first).
        InternalError: Any other database error.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if not isinstance(exc, Exception):
            return  # no error, or a cancellation or exit: not the database's to name
        error = translate(exc)
        if error is None:
            return
        if isinstance(error, InternalError):
            # A ComputeError passes the dispatcher unlogged, so this is the one place an unexpected database error
            # can be seen: by its class and SQLSTATE only, as its text may quote SQL or values.
            log.error("unexpected database error: %s (SQLSTATE %s)", type(exc).__name__, _sqlstate(exc))
        raise error from exc


def _sqlstate(exc: BaseException) -> str:
    return str(getattr(exc, "sqlstate", None) or "unknown")
