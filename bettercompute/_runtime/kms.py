"""``LocalKeyKms``: the ``Kms`` port on a key kept in a local file (AES-256-GCM, envelope style).

Each ``encrypt`` makes a fresh 256-bit data key, seals the plaintext with it, and seals the data key with the file's
key; both seals carry the caller's ``context`` as associated data. A blob::

    b"bck1" | nonce of the key seal (12) | sealed data key (48) | nonce of the data seal (12) | sealed plaintext

The file holds the base64 of 32 random bytes and must be readable by its owner only (mode 0600). Every process that
reads what another wrote (an ``api`` process creating webhooks, a ``worker`` sending them) needs the same file.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import stat
from pathlib import Path

import anyio
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bettercompute.errors import InternalError, InvalidConfigError
from bettercompute.ports.kms import Kms

__all__ = ["KmsRing", "LocalKeyKms"]

_MAGIC = b"bck1"
_NONCE = 12
_KEY = 32
_SEALED_KEY = _KEY + 16
_HEADER = len(_MAGIC) + _NONCE + _SEALED_KEY + _NONCE


def _aad(kind: bytes, context: str) -> bytes:
    return b"bettercompute.kms." + kind + b"\x00" + context.encode()


class LocalKeyKms:
    """Envelope encryption under a 256-bit key read from ``key_file``, created (mode 0600) if it is missing.

    Nothing is read or written before the first ``encrypt`` or ``decrypt``, so building one does no I/O.

    Args:
        key_file: Where the key lives. Its folder is created (mode 0700) when missing.

    Raises (on first use):
        InvalidConfigError: the file is not a key (wrong size, not base64), or group or others may read it.
    """

    def __init__(self, key_file: str | os.PathLike[str]) -> None:
        self.key_file = Path(key_file)
        self._key: AESGCM | None = None
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"LocalKeyKms(key_file={str(self.key_file)!r})"

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        """Seal ``plaintext`` under a fresh data key, both bound to ``context``."""
        master = await self._master()
        data_key = AESGCM.generate_key(bit_length=256)
        key_nonce, data_nonce = secrets.token_bytes(_NONCE), secrets.token_bytes(_NONCE)
        sealed_key = master.encrypt(key_nonce, data_key, _aad(b"key", context))
        sealed = AESGCM(data_key).encrypt(data_nonce, plaintext, _aad(b"data", context))
        return _MAGIC + key_nonce + sealed_key + data_nonce + sealed

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        """Open a blob made by ``encrypt`` under the same key and ``context``.

        Raises:
            InternalError: the blob is malformed, tampered with, or was made under another key or context.
        """
        master = await self._master()
        if len(ciphertext) < _HEADER + 16 or not ciphertext.startswith(_MAGIC):
            raise InternalError("a stored secret is not a blob of this KMS")
        at = len(_MAGIC)
        key_nonce = ciphertext[at : at + _NONCE]
        sealed_key = ciphertext[at + _NONCE : at + _NONCE + _SEALED_KEY]
        data_nonce = ciphertext[at + _NONCE + _SEALED_KEY : _HEADER]
        try:
            data_key = master.decrypt(key_nonce, sealed_key, _aad(b"key", context))
            return AESGCM(data_key).decrypt(data_nonce, ciphertext[_HEADER:], _aad(b"data", context))
        except InvalidTag:
            raise InternalError("a stored secret does not decrypt under this key and context") from None

    async def _master(self) -> AESGCM:
        if self._key is None:
            async with self._lock:
                if self._key is None:
                    self._key = AESGCM(await anyio.to_thread.run_sync(self._load_or_create))
        return self._key

    def _load_or_create(self) -> bytes:
        path = self.key_file
        if not path.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            encoded = base64.b64encode(secrets.token_bytes(_KEY)) + b"\n"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass  # another process created it a moment ago: read theirs
            else:
                with os.fdopen(fd, "wb") as file:
                    file.write(encoded)
                    file.flush()
                    os.fsync(file.fileno())
        problem = {"path": "kms", "key_file": str(path)}
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InvalidConfigError(
                "the KMS key file may be read by group or others; make it 0600", details={"problems": [problem]}
            )
        try:
            key = base64.b64decode(path.read_bytes().strip(), validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != _KEY:
            raise InvalidConfigError(
                "the KMS key file does not hold a base64 256-bit key", details={"problems": [problem]}
            )
        return key


class KmsRing:
    """A KMS key rotation: seals with ``current``, opens what ``current`` or any of ``previous`` sealed.

    Give it to every process as ``Options.kms`` once the new key exists, then re-seal what is stored
    (``keys.rewrap``); drop the previous key once that has finished and a day has passed (gateway enrolment tokens,
    which are not stored, live that long). Any adapters mix: moving from a local key file to AWS KMS or an HSM is
    the same rotation.

    ``decrypt`` tries ``current`` first, then each previous one in order, while the one it tried says the blob does
    not open under its key (``InternalError``) or refuses the key for it (``InvalidConfigError``: some KMS services
    answer "access denied" for a blob of another key). When none opens it, the current key's error is raised. An
    ``UnavailableError`` is raised at once, so a KMS that cannot be reached is never taken for a blob that opens
    nowhere.
    """

    def __init__(self, current: Kms, *previous: Kms) -> None:
        self.current = current
        self.previous = tuple(previous)

    def __repr__(self) -> str:
        return f"KmsRing(current={self.current!r}, previous={self.previous!r})"

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        """Seal under the current key."""
        return await self.current.encrypt(plaintext, context=context)

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        """Open under the current key or, failing that, under a previous one.

        Raises:
            InternalError: no key of the ring opens it under ``context``.
            InvalidConfigError: none opens it, and the current key was refused for it.
            UnavailableError: a KMS tried could not be reached.
        """
        try:
            return await self.current.decrypt(ciphertext, context=context)
        except (InternalError, InvalidConfigError) as exc:
            first: InternalError | InvalidConfigError = exc
        for kms in self.previous:
            try:
                return await kms.decrypt(ciphertext, context=context)
            except (InternalError, InvalidConfigError):
                continue
        raise first
