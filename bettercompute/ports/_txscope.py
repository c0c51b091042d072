"""Whether the running task is inside a store transaction: a context variable a store's ``transaction()`` sets.

The rule "no network I/O inside a database transaction" is kept by structure (the CA seals keys before its
transaction, a workflow step's writes sit in a block that closes before its outside calls); this marker lets test
doubles of the outside world (``bettercompute.testing.GuardedKms``, ``OutsideCallProbe``) fail a test that breaks it.

A context variable follows the task: a transaction open in one request does not mark a concurrent one, and a task
started inside a transaction inherits the mark (its I/O would run while the transaction is held).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["in_transaction", "transaction_scope"]

_OPEN: contextvars.ContextVar[bool] = contextvars.ContextVar("bettercompute_transaction_open", default=False)


def in_transaction() -> bool:
    """Whether a store transaction is open in the running task (or in the task that started it)."""
    return _OPEN.get()


@contextlib.contextmanager
def transaction_scope() -> Iterator[None]:
    """Mark the running task as inside a transaction until the block ends (a store's ``transaction()`` wraps its
    ``yield`` in this; nesting is fine)."""
    token = _OPEN.set(True)
    try:
        yield
    finally:
        # Closed from another context (a generator finalized late), the marked context is gone already.
        with contextlib.suppress(ValueError):
            _OPEN.reset(token)
