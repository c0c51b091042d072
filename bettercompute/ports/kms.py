"""Envelope encryption of secrets at rest."""

from __future__ import annotations

from typing import Protocol

import attrs

__all__ = ["Kms", "Sealed", "SealedBlob"]


class Kms(Protocol):
    """Envelope encryption of secrets at rest (webhook signing secrets, later BMC credentials).

    ``encrypt`` returns one self-contained blob (the data key, wrapped by the KMS's key, travels with the
    ciphertext); ``decrypt`` reverses it. ``context`` is bound to the ciphertext as associated data: a blob only
    decrypts under the context it was made with (say ``webhook:<tenant>:<id>``), so a ciphertext copied onto another
    row is refused. Both are safe to retry; ``encrypt`` never returns the same blob twice.

    Raises (both): ``UnavailableError`` when a remote KMS cannot be reached; ``InvalidConfigError`` when the key
    itself is missing or unusable. ``decrypt`` raises ``InternalError`` for a blob that is malformed, tampered with,
    made under another key or bound to another context (stored state is wrong; no caller input can cause it).
    """

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        """Seal ``plaintext`` for storage, bound to ``context``."""
        ...

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        """Open a blob made by ``encrypt`` with the same ``context``."""
        ...


@attrs.frozen(kw_only=True)
class SealedBlob:
    """One stored blob a re-wrap opens and seals again: ``key`` names its row in its column (ordered, for paging),
    ``context`` is what it was sealed under."""

    key: str
    context: str
    blob: bytes = attrs.field(repr=False)


class Sealed(Protocol):
    """A stored column of KMS blobs, walked by a re-wrap (``keys.rewrap``) in ``key`` order.

    A module that keeps blobs in its tables lists one ``Repository[Sealed]`` per column in its ``sealed`` member.
    """

    async def sealed(self, *, after: str | None, limit: int) -> list[SealedBlob]:
        """Up to ``limit`` blobs whose key is after ``after`` (from the first when ``None``), in key order."""
        ...

    async def reseal(self, key: str, *, old: bytes, new: bytes) -> bool:
        """Put ``new`` in place of ``old`` in row ``key``; ``False`` (nothing written) when the row no longer holds
        ``old`` (rotated or deleted meanwhile: what replaced it was sealed by the current key)."""
        ...
