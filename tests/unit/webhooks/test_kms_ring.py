"""``KmsRing``: seals with the current key, opens with the current or a previous one, and never takes an outage for
a blob that opens nowhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from bettercompute import KmsRing, LocalKeyKms
from bettercompute.errors import InternalError, InvalidConfigError, UnavailableError

pytestmark = pytest.mark.anyio


class _Down:
    """A KMS double that cannot be reached."""

    def __init__(self) -> None:
        self.calls = 0

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        self.calls += 1
        raise UnavailableError("down")

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        self.calls += 1
        raise UnavailableError("down")


class _Denies:
    """A KMS double that refuses its key for any blob (as some services answer a blob of another key)."""

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        raise InvalidConfigError("denied")

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        raise InvalidConfigError("denied")


async def test_new_blobs_are_sealed_by_the_current_key_and_old_ones_still_open(tmp_path: Path) -> None:
    old, new, third = (LocalKeyKms(tmp_path / f"{n}.key") for n in ("old", "new", "third"))
    before = await old.encrypt(b"made before", context="secret:acme:db")
    ring = KmsRing(new, third, old)
    assert await ring.decrypt(before, context="secret:acme:db") == b"made before"
    now = await ring.encrypt(b"made now", context="secret:acme:db")
    assert await new.decrypt(now, context="secret:acme:db") == b"made now"
    with pytest.raises(InternalError):
        await old.decrypt(now, context="secret:acme:db")
    # The context still binds: under another one, no key opens it.
    with pytest.raises(InternalError):
        await ring.decrypt(before, context="secret:globex:db")
    # A key that is not in the ring opens nothing.
    with pytest.raises(InternalError):
        await KmsRing(new, third).decrypt(before, context="secret:acme:db")


async def test_an_unreachable_kms_is_an_outage_not_a_blob_that_opens_nowhere(tmp_path: Path) -> None:
    old = LocalKeyKms(tmp_path / "old.key")
    before = await old.encrypt(b"x", context="c")
    down = _Down()
    with pytest.raises(UnavailableError):
        await KmsRing(down, old).decrypt(before, context="c")  # not tried further: the current key may hold it
    with pytest.raises(UnavailableError):
        await KmsRing(LocalKeyKms(tmp_path / "new.key"), down, old).decrypt(before, context="c")
    with pytest.raises(UnavailableError):
        await KmsRing(down, old).encrypt(b"x", context="c")


async def test_a_current_key_refused_for_a_blob_of_another_key_still_lets_a_previous_one_open_it(
    tmp_path: Path,
) -> None:
    old = LocalKeyKms(tmp_path / "old.key")
    before = await old.encrypt(b"x", context="c")
    assert await KmsRing(_Denies(), old).decrypt(before, context="c") == b"x"
    with pytest.raises(InvalidConfigError):  # opens nowhere: the current key's own refusal is what is raised
        await KmsRing(_Denies(), LocalKeyKms(tmp_path / "other.key")).decrypt(before, context="c")
