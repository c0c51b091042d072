"""KMS adapters beyond a local key file, behind the core's ``Kms`` port (``Options.kms``).

- ``AwsKms``: AWS KMS (or an API-compatible service), envelope encryption under a KMS key: a data key per secret from
  ``GenerateDataKey``, bound to the secret's context as KMS encryption context. Needs the ``kms-aws`` extra (boto3).

``bettercompute.LocalKeyKms`` (a key in a local file) stays the choice for one machine and for development; the KMS
page of the docs says which to use when.
"""

from bettercompute_kms._aws import AwsKms as AwsKms

__all__ = ["AwsKms"]
