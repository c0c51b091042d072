"""KMS adapters beyond a local key file, behind the core's ``Kms`` port (``Options.kms``).

- ``AwsKms``: AWS KMS (or an API-compatible service): a data key per value from ``GenerateDataKey``, bound to the
  value's context as KMS encryption context. Extra ``kms-aws`` (boto3).
- ``Pkcs11Kms``: a key that never leaves a PKCS#11 token (an HSM, or SoftHSM): the token seals each value's data key
  with AES-GCM, the context as associated data. Extra ``kms-pkcs11`` (python-pkcs11).

Each is imported on first use, so either extra works without the other. ``bettercompute.LocalKeyKms`` (a key in a
local file) stays the choice for one machine and for development; ``docs/operations.md`` says which to use when.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bettercompute_kms._aws import AwsKms as AwsKms
    from bettercompute_kms._pkcs11 import Pkcs11Kms as Pkcs11Kms

__all__ = ["AwsKms", "Pkcs11Kms"]


def __getattr__(name: str) -> Any:
    if name == "AwsKms":
        from bettercompute_kms._aws import AwsKms

        return AwsKms
    if name == "Pkcs11Kms":
        from bettercompute_kms._pkcs11 import Pkcs11Kms

        return Pkcs11Kms
    raise AttributeError(f"module 'bettercompute_kms' has no attribute {name!r}")
