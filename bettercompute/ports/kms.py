"""Envelope encryption of secrets at rest."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Kms"]


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
