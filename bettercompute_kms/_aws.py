"""``AwsKms``: the ``Kms`` port on AWS KMS, envelope style.

Each ``encrypt`` asks KMS for a fresh 256-bit data key (``GenerateDataKey``) under the configured key, with the
caller's context as KMS encryption context, seals the plaintext with it locally (AES-256-GCM, the context as
associated data) and keeps only the wrapped copy of the data key. ``decrypt`` asks KMS to unwrap that copy, which it
does only under the same key and encryption context. A blob::

    b"bca1" | length of the wrapped data key (2 bytes, big-endian) | wrapped data key | nonce (12) | sealed plaintext

The plaintext never leaves the process; KMS sees data keys only. boto3 is synchronous: each call runs in a worker
thread, with boto3's own retries off and short timeouts, so a KMS that does not answer costs a call, not a thread.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import anyio
import boto3.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bettercompute.errors import InternalError, InvalidConfigError, UnavailableError

if TYPE_CHECKING:
    from mypy_boto3_kms import KMSClient

__all__ = ["AwsKms"]

_MAGIC = b"bca1"
_NONCE = 12
_CONTEXT_KEY = "bettercompute:context"
# Codes that mean the key itself cannot be used (an operator's fix, not a retry).
_KEY_PROBLEMS = frozenset(
    {
        "NotFoundException",
        "DisabledException",
        "KMSInvalidStateException",
        "AccessDeniedException",
        "InvalidKeyUsageException",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "IncorrectKeyException",
    }
)
# Codes that mean this blob does not open under this key and context (stored state is wrong).
_BLOB_PROBLEMS = frozenset({"InvalidCiphertextException"})
# In a decrypt, a wrapped key made under another KMS key is a blob of another key (one a ``KmsRing`` may open under
# a previous key), not a key that cannot be used.
_DECRYPT_BLOB_PROBLEMS = _BLOB_PROBLEMS | {"IncorrectKeyException"}


def _aad(context: str) -> bytes:
    return b"bettercompute.kms.aws\x00" + context.encode()


class AwsKms:
    """Envelope encryption under the AWS KMS key ``key_id`` (a key id, ARN or alias).

    Building one does no I/O; the client is made on first use. Credentials come from boto3's usual chain
    (environment, profile, instance role) unless given.

    Args:
        key_id: The KMS key that wraps the data keys.
        region: Its region (boto3's default when ``None``).
        endpoint_url: Another endpoint than AWS's (a VPC endpoint, or an API-compatible service).
        access_key_id / secret_access_key: Explicit credentials (the secret is never shown in ``repr``).
        timeout: Seconds to connect and to read, each.

    Raises (on use): ``UnavailableError`` when KMS cannot be reached or throttles; ``InvalidConfigError`` when the
    key is missing, disabled or not allowed to this caller; ``decrypt`` raises ``InternalError`` for a blob that is
    malformed, tampered with, or made under another key or context.
    """

    def __init__(
        self,
        key_id: str,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        if not key_id:
            raise InvalidConfigError("kms: AwsKms needs a key id", details={"problems": ["key_id"]})
        self.key_id = key_id
        self.region = region
        self.endpoint_url = endpoint_url
        self._access_key_id = access_key_id
        self._secret_access_key = secret_access_key
        self._timeout = timeout
        self._client: KMSClient | None = None

    def __repr__(self) -> str:
        return f"AwsKms(key_id={self.key_id!r}, region={self.region!r}, endpoint_url={self.endpoint_url!r})"

    def _kms(self) -> KMSClient:
        if self._client is None:
            session = boto3.session.Session(
                aws_access_key_id=self._access_key_id,
                aws_secret_access_key=self._secret_access_key,
                region_name=self.region,
            )
            config = Config(
                retries={"total_max_attempts": 1, "mode": "standard"},  # one attempt: no retry inside a call
                connect_timeout=self._timeout,
                read_timeout=self._timeout,
            )
            self._client = session.client("kms", endpoint_url=self.endpoint_url, config=config)
        return self._client

    async def _call(self, name: str, *, blob_codes: frozenset[str] = _BLOB_PROBLEMS, **request: Any) -> Any:
        def run() -> Any:
            return getattr(self._kms(), name)(**request)

        try:
            return await anyio.to_thread.run_sync(run)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in blob_codes:
                raise InternalError("a stored secret does not decrypt under this KMS key and context") from None
            if code in _KEY_PROBLEMS:
                raise InvalidConfigError(
                    f"kms: the AWS KMS key cannot be used ({code})",
                    details={"problems": [{"path": "kms", "key_id": self.key_id, "code": code}]},
                ) from None
            raise UnavailableError(
                "the KMS refused for now; try again", details={"reason": "kms", "code": code}
            ) from None
        except BotoCoreError as exc:  # no connection, a timeout, no credentials at all
            if type(exc).__name__ in ("NoCredentialsError", "NoRegionError", "PartialCredentialsError"):
                raise InvalidConfigError(
                    f"kms: AWS KMS is not configured here ({type(exc).__name__})",
                    details={"problems": [{"path": "kms", "key_id": self.key_id}]},
                ) from None
            raise UnavailableError("the KMS cannot be reached; try again", details={"reason": "kms"}) from None

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        """Seal ``plaintext`` under a fresh data key from KMS, both bound to ``context``."""
        answer = await self._call(
            "generate_data_key", KeyId=self.key_id, KeySpec="AES_256", EncryptionContext={_CONTEXT_KEY: context}
        )
        data_key, wrapped = bytes(answer["Plaintext"]), bytes(answer["CiphertextBlob"])
        if len(data_key) != 32 or not 0 < len(wrapped) < 1 << 16:
            raise UnavailableError("the KMS gave an unusable data key", details={"reason": "kms"})
        nonce = secrets.token_bytes(_NONCE)
        sealed = AESGCM(data_key).encrypt(nonce, plaintext, _aad(context))
        return _MAGIC + len(wrapped).to_bytes(2, "big") + wrapped + nonce + sealed

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        """Open a blob made by ``encrypt`` under the same key and ``context``.

        Raises:
            InternalError: the blob is malformed, tampered with, or was made under another key or context.
        """
        head = len(_MAGIC) + 2
        if len(ciphertext) < head or not ciphertext.startswith(_MAGIC):
            raise InternalError("a stored secret is not a blob of this KMS")
        size = int.from_bytes(ciphertext[len(_MAGIC) : head], "big")
        if size == 0 or len(ciphertext) < head + size + _NONCE + 16:
            raise InternalError("a stored secret is not a blob of this KMS")
        wrapped = ciphertext[head : head + size]
        nonce = ciphertext[head + size : head + size + _NONCE]
        answer = await self._call(
            "decrypt",
            blob_codes=_DECRYPT_BLOB_PROBLEMS,
            CiphertextBlob=wrapped,
            KeyId=self.key_id,
            EncryptionContext={_CONTEXT_KEY: context},
        )
        try:
            return AESGCM(bytes(answer["Plaintext"])).decrypt(nonce, ciphertext[head + size + _NONCE :], _aad(context))
        except (InvalidTag, ValueError):
            raise InternalError("a stored secret does not decrypt under this KMS key and context") from None
