"""Test doubles of the outside world that fail when they are reached from inside a store transaction.

A call to a KMS, a BMC or a provider's API made while a transaction is open holds a pooled connection and the
transaction's locks for as long as the far side takes to answer (or not). These doubles turn that mistake into a
test failure: each checks ``bettercompute.ports.in_transaction()``, which the store's ``transaction()`` sets for the
task that opened it.
"""

from __future__ import annotations

import attrs

from bettercompute.ports import Kms, in_transaction

__all__ = ["GuardedKms", "OutsideCallInTransaction", "OutsideCallProbe"]


class OutsideCallInTransaction(AssertionError):
    """A test double of an outside system was called while a store transaction was open in the calling task."""


def _refuse_in_transaction(what: str) -> None:
    if in_transaction():
        raise OutsideCallInTransaction(f"{what} was called while a store transaction is open")


class GuardedKms:
    """A test double of the ``Kms`` port: delegates to a real KMS, but raises ``OutsideCallInTransaction`` when it
    is called inside a store transaction (a remote KMS is network I/O).

    Args:
        inner: The KMS that does the work (``LocalKeyKms`` in tests).
    """

    def __init__(self, inner: Kms) -> None:
        self._inner = inner
        self.calls = 0
        """How many calls reached ``inner`` (a test can check the guard was exercised at all)."""

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        """``inner.encrypt``, refused inside a transaction."""
        _refuse_in_transaction("Kms.encrypt")
        self.calls += 1
        return await self._inner.encrypt(plaintext, context=context)

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        """``inner.decrypt``, refused inside a transaction."""
        _refuse_in_transaction("Kms.decrypt")
        self.calls += 1
        return await self._inner.decrypt(ciphertext, context=context)


@attrs.define(kw_only=True)
class OutsideCallProbe:
    """A test double of an outside system (a BMC, a provider's API): ``await probe.call(key)`` records the call and
    raises ``OutsideCallInTransaction`` when it is made inside a store transaction."""

    calls: list[str] = attrs.field(factory=list)

    async def call(self, key: str = "") -> None:
        """One call to the outside system, identified by ``key`` (an idempotency key, say)."""
        _refuse_in_transaction("an outside call")
        self.calls.append(key)
