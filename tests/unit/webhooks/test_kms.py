"""``LocalKeyKms``: envelope encryption bound to a context, under a 0600 key file it creates."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bettercompute import LocalKeyKms
from bettercompute.errors import InternalError, InvalidConfigError

pytestmark = pytest.mark.anyio


async def test_a_round_trip_gives_the_plaintext_back(tmp_path: Path) -> None:
    kms = LocalKeyKms(tmp_path / "keys" / "kms.key")
    sealed = await kms.encrypt(b"whsec_abc", context="webhook:acme:wh_1")
    assert b"whsec_abc" not in sealed
    assert await kms.decrypt(sealed, context="webhook:acme:wh_1") == b"whsec_abc"
    # A fresh data key each time: the same plaintext never gives the same blob.
    assert await kms.encrypt(b"whsec_abc", context="webhook:acme:wh_1") != sealed


async def test_another_context_is_refused(tmp_path: Path) -> None:
    kms = LocalKeyKms(tmp_path / "kms.key")
    sealed = await kms.encrypt(b"secret", context="webhook:acme:wh_1")
    with pytest.raises(InternalError):
        await kms.decrypt(sealed, context="webhook:acme:wh_2")
    with pytest.raises(InternalError):
        await kms.decrypt(sealed, context="webhook:evil:wh_1")


async def test_a_tampered_or_foreign_blob_is_refused(tmp_path: Path) -> None:
    kms = LocalKeyKms(tmp_path / "kms.key")
    sealed = await kms.encrypt(b"secret", context="c")
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(InternalError):
        await kms.decrypt(tampered, context="c")
    with pytest.raises(InternalError):
        await kms.decrypt(b"not a blob", context="c")
    other = LocalKeyKms(tmp_path / "other.key")
    with pytest.raises(InternalError):
        await other.decrypt(sealed, context="c")


async def test_the_key_file_is_created_0600_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "state" / "kms.key"
    kms = LocalKeyKms(path)
    assert not path.exists()  # nothing happens before first use
    sealed = await kms.encrypt(b"secret", context="c")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # Another process (another instance) reading the same file opens what the first sealed.
    assert await LocalKeyKms(path).decrypt(sealed, context="c") == b"secret"


async def test_a_key_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kms.key"
    await LocalKeyKms(path).encrypt(b"x", context="c")
    os.chmod(path, 0o644)
    with pytest.raises(InvalidConfigError) as info:
        await LocalKeyKms(path).encrypt(b"x", context="c")
    assert "0600" in info.value.message


async def test_a_file_that_is_not_a_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kms.key"
    path.write_text("not base64 at all!\n")
    os.chmod(path, 0o600)
    with pytest.raises(InvalidConfigError):
        await LocalKeyKms(path).encrypt(b"x", context="c")
