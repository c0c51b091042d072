"""The "inside a transaction" mark and the doubles that refuse outside calls under it (no database: the mark is what
a store's ``transaction()`` sets, so a block of ``transaction_scope()`` stands for one)."""

from __future__ import annotations

import contextvars

import anyio
import pytest

from bettercompute.ports import in_transaction, transaction_scope
from bettercompute.testing import GuardedKms, OutsideCallInTransaction, OutsideCallProbe

pytestmark = pytest.mark.anyio


class _PlainKms:
    """A test double of the ``Kms`` port that seals nothing (the guard around it is what is tested)."""

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        return context.encode() + b"|" + plaintext

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        return ciphertext.removeprefix(context.encode() + b"|")


async def test_the_mark_holds_in_the_block_and_in_tasks_it_starts_only() -> None:
    assert not in_transaction()
    seen: dict[str, bool] = {}
    inside = anyio.Event()
    done = anyio.Event()

    async def beside() -> None:  # a concurrent request, started outside the transaction
        await inside.wait()
        seen["beside"] = in_transaction()
        done.set()

    async def child() -> None:  # started from inside: its I/O would run while the transaction is held
        seen["child"] = in_transaction()

    async with anyio.create_task_group() as outer:
        outer.start_soon(beside)
        with transaction_scope():
            with transaction_scope():
                seen["nested"] = in_transaction()
            seen["after nested"] = in_transaction()
            async with anyio.create_task_group() as inner:
                inner.start_soon(child)
            inside.set()
            await done.wait()
        seen["after"] = in_transaction()
    assert seen == {"nested": True, "after nested": True, "child": True, "beside": False, "after": False}


async def test_the_mark_is_cleared_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), transaction_scope():
        raise RuntimeError("rolled back")
    assert not in_transaction()


async def test_a_scope_ended_from_another_context_does_not_raise() -> None:
    scope = transaction_scope()
    contextvars.copy_context().run(scope.__enter__)  # a transaction entered in one context...
    scope.__exit__(None, None, None)  # ...and finalized from another must not turn its exit into an error
    assert not in_transaction()


async def test_guarded_kms_refuses_inside_a_transaction_and_delegates_outside() -> None:
    kms = GuardedKms(_PlainKms())
    sealed = await kms.encrypt(b"k", context="ca:x")
    assert await kms.decrypt(sealed, context="ca:x") == b"k"
    with transaction_scope():
        with pytest.raises(OutsideCallInTransaction, match=r"Kms\.encrypt"):
            await kms.encrypt(b"k", context="ca:x")
        with pytest.raises(OutsideCallInTransaction, match=r"Kms\.decrypt"):
            await kms.decrypt(sealed, context="ca:x")
    assert kms.calls == 2


async def test_the_outside_call_probe_records_calls_and_refuses_inside_a_transaction() -> None:
    probe = OutsideCallProbe()
    await probe.call("wf-1/one/1")
    with transaction_scope(), pytest.raises(OutsideCallInTransaction):
        await probe.call("wf-1/one/2")
    assert probe.calls == ["wf-1/one/1"]
