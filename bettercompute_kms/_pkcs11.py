"""``Pkcs11Kms``: the ``Kms`` port on a key that never leaves a PKCS#11 token (an HSM, or SoftHSM).

Each ``encrypt`` makes a fresh 256-bit data key here, seals the plaintext with it (AES-256-GCM) and has the token
seal the data key with its AES key (``CKM_AES_GCM``); both seals carry the caller's context as associated data. A
blob::

    b"bcp1" | nonce of the key seal (12) | sealed data key (48) | nonce of the data seal (12) | sealed plaintext

The token's key is found by its label and never read out (it may be, and should be, non-extractable). python-pkcs11
calls block: they run in worker threads, one at a time on the one logged-in session this object keeps.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

import anyio
import pkcs11
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pkcs11 import exceptions as p11
from pkcs11.mechanisms import GCMParams

from bettercompute.errors import InternalError, InvalidConfigError, UnavailableError

__all__ = ["Pkcs11Kms"]

_MAGIC = b"bcp1"
_NONCE = 12
_SEALED_KEY = 32 + 16
_HEADER = len(_MAGIC) + _NONCE + _SEALED_KEY + _NONCE
# The token is not there, the PIN is wrong, the key is missing or of the wrong kind: an operator's fix.
_SETUP = (
    p11.NoSuchToken,
    p11.NoSuchKey,
    p11.MultipleTokensReturned,
    p11.MultipleObjectsReturned,
    p11.PinIncorrect,
    p11.PinInvalid,
    p11.PinLenRange,
    p11.PinLocked,
    p11.PinExpired,
    p11.UserPinNotInitialized,
    p11.MechanismInvalid,
    p11.KeyTypeInconsistent,
)
# What the token says of a ciphertext that does not open (tampered with, another key or context).
_BLOB = (p11.EncryptedDataInvalid, p11.EncryptedDataLenRange, p11.DataInvalid, p11.DataLenRange)


def _aad(kind: bytes, context: str) -> bytes:
    return b"bettercompute.kms.pkcs11." + kind + b"\x00" + context.encode()


class Pkcs11Kms:
    """Envelope encryption under the AES key labelled ``key_label`` on the PKCS#11 token ``token_label``.

    Building one does no I/O: the module is loaded and the session opened on first use.

    Args:
        module: The PKCS#11 library (``/usr/lib/softhsm/libsofthsm2.so``, a vendor's HSM library).
        token_label: The token (slot) holding the key.
        pin: The user PIN (never shown in ``repr``).
        key_label: The AES key's label on the token (256-bit; made with ``create_key`` or the vendor's tools).

    PKCS#11 logs in an application, not a session: once one session of this process is logged in to the token, a
    second object on the same token works without its own login, whatever PIN it was given.

    Raises (on use): ``InvalidConfigError`` when the library, token, PIN or key is wrong; ``UnavailableError`` when
    the token fails otherwise; ``decrypt`` raises ``InternalError`` for a blob that is malformed, tampered with, or
    made under another key or context.
    """

    def __init__(self, module: str, *, token_label: str, pin: str, key_label: str) -> None:
        self.module = module
        self.token_label = token_label
        self.key_label = key_label
        self._pin = pin
        self._lock = threading.Lock()
        self._session: Any = None
        self._key: Any = None

    def __repr__(self) -> str:
        return f"Pkcs11Kms(module={self.module!r}, token_label={self.token_label!r}, key_label={self.key_label!r})"

    def _problem(self, what: str) -> InvalidConfigError:
        details = {"problems": [{"path": "kms", "token": self.token_label, "key": self.key_label}]}
        return InvalidConfigError(f"kms: the PKCS#11 token cannot be used ({what})", details=details)

    def _open(self) -> Any:
        """The key object on a logged-in session (under the lock)."""
        if self._key is None:
            try:
                library = pkcs11.lib(self.module)
            except (RuntimeError, OSError, p11.PKCS11Error):
                raise self._problem("the library does not load") from None
            token = library.get_token(token_label=self.token_label)
            try:
                self._session = token.open(user_pin=self._pin)
            except p11.UserAlreadyLoggedIn:
                # PKCS#11 logs in the application, not a session: another session of this process already did.
                self._session = token.open()
            self._key = self._session.get_key(
                object_class=pkcs11.ObjectClass.SECRET_KEY, key_type=pkcs11.KeyType.AES, label=self.key_label
            )
        return self._key

    def _run(self, step: str, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        with self._lock:
            try:
                key = self._open()
            except _SETUP as exc:
                raise self._problem(type(exc).__name__) from None
            except p11.PKCS11Error as exc:
                raise self._unavailable(exc) from None
            params = GCMParams(nonce, aad, 128)
            # A tag that does not verify: SoftHSM says GeneralError, the standard EncryptedDataInvalid.
            refusals = _BLOB if step == "seal" else (*_BLOB, p11.GeneralError)
            try:
                if step == "seal":
                    return bytes(key.encrypt(data, mechanism=pkcs11.Mechanism.AES_GCM, mechanism_param=params))
                return bytes(key.decrypt(data, mechanism=pkcs11.Mechanism.AES_GCM, mechanism_param=params))
            except refusals:
                raise InternalError("a stored secret does not decrypt under this token's key and context") from None
            except _SETUP as exc:
                raise self._problem(type(exc).__name__) from None
            except p11.PKCS11Error as exc:
                raise self._unavailable(exc) from None

    def _unavailable(self, exc: Exception) -> UnavailableError:
        # The session may be gone (the token was removed, the HSM restarted): open a new one next time.
        self._session, self._key = None, None
        return UnavailableError(
            "the PKCS#11 token failed; try again", details={"reason": "kms", "error": type(exc).__name__}
        )

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        """Seal ``plaintext`` under a fresh data key, and the data key on the token, both bound to ``context``."""
        data_key = AESGCM.generate_key(bit_length=256)
        key_nonce, data_nonce = secrets.token_bytes(_NONCE), secrets.token_bytes(_NONCE)
        sealed_key = await anyio.to_thread.run_sync(self._run, "seal", key_nonce, data_key, _aad(b"key", context))
        if len(sealed_key) != _SEALED_KEY:
            raise UnavailableError("the PKCS#11 token sealed the data key oddly", details={"reason": "kms"})
        sealed = AESGCM(data_key).encrypt(data_nonce, plaintext, _aad(b"data", context))
        return _MAGIC + key_nonce + sealed_key + data_nonce + sealed

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        """Open a blob made by ``encrypt`` under the same token key and ``context``.

        Raises:
            InternalError: the blob is malformed, tampered with, or was made under another key or context.
        """
        if len(ciphertext) < _HEADER + 16 or not ciphertext.startswith(_MAGIC):
            raise InternalError("a stored secret is not a blob of this KMS")
        at = len(_MAGIC)
        key_nonce = ciphertext[at : at + _NONCE]
        sealed_key = ciphertext[at + _NONCE : at + _NONCE + _SEALED_KEY]
        data_nonce = ciphertext[at + _NONCE + _SEALED_KEY : _HEADER]
        data_key = await anyio.to_thread.run_sync(self._run, "open", key_nonce, sealed_key, _aad(b"key", context))
        try:
            return AESGCM(data_key).decrypt(data_nonce, ciphertext[_HEADER:], _aad(b"data", context))
        except (InvalidTag, ValueError):
            raise InternalError("a stored secret does not decrypt under this token's key and context") from None

    def close(self) -> None:
        """Close the session (a later call opens a new one)."""
        with self._lock:
            session, self._session, self._key = self._session, None, None
        if session is not None:
            session.close()

    @staticmethod
    def create_key(module: str, *, token_label: str, pin: str, key_label: str) -> None:
        """Make a 256-bit AES key labelled ``key_label`` on the token, non-extractable, for encrypting and decrypting
        only (an operator's set-up step; refused with ``InvalidConfigError`` if one with that label exists)."""
        token = pkcs11.lib(module).get_token(token_label=token_label)
        with token.open(rw=True, user_pin=pin) as session:
            try:
                session.get_key(object_class=pkcs11.ObjectClass.SECRET_KEY, label=key_label)
            except p11.NoSuchKey:
                pass
            else:
                raise InvalidConfigError(f"kms: the token already has a key labelled {key_label!r}")
            session.generate_key(
                pkcs11.KeyType.AES,
                256,
                label=key_label,
                store=True,
                capabilities=pkcs11.MechanismFlag.ENCRYPT | pkcs11.MechanismFlag.DECRYPT,
                template={pkcs11.Attribute.EXTRACTABLE: False, pkcs11.Attribute.SENSITIVE: True},
            )
