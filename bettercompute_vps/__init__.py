"""VPS instances at cloud providers (provider pools): the provider adapter port, its helpers, and the EC2 adapter.

The port and its helpers need the ``vps`` extra; ``Ec2Adapter`` and its settings need the ``ec2`` extra (boto3) and
are imported on first use, so a control plane without boto3 can still import this package.
"""

from __future__ import annotations

import typing
from typing import Any

from bettercompute_vps._provider import (
    MAX_USER_DATA_BYTES,
    PROVIDER_AUTH_FAILED,
    PROVIDER_ERROR_CODES,
    PROVIDER_IMAGE_NOT_FOUND,
    PROVIDER_INVALID,
    PROVIDER_NOT_FOUND,
    PROVIDER_QUOTA,
    PROVIDER_STATES,
    PROVIDER_THROTTLED,
    PROVIDER_UNAVAILABLE,
    InstanceType,
    LaunchRequest,
    ProviderAdapter,
    ProviderError,
    ProviderInstance,
    compose_user_data,
    pick_instance_type,
)

if typing.TYPE_CHECKING:
    from bettercompute_vps._ec2 import CLIENT_TOKEN_TAG, Ec2Adapter, Ec2Credentials, Ec2Settings

__version__ = "0.0.0"

__all__ = [
    "CLIENT_TOKEN_TAG",
    "MAX_USER_DATA_BYTES",
    "PROVIDER_AUTH_FAILED",
    "PROVIDER_ERROR_CODES",
    "PROVIDER_IMAGE_NOT_FOUND",
    "PROVIDER_INVALID",
    "PROVIDER_NOT_FOUND",
    "PROVIDER_QUOTA",
    "PROVIDER_STATES",
    "PROVIDER_THROTTLED",
    "PROVIDER_UNAVAILABLE",
    "Ec2Adapter",
    "Ec2Credentials",
    "Ec2Settings",
    "InstanceType",
    "LaunchRequest",
    "ProviderAdapter",
    "ProviderError",
    "ProviderInstance",
    "__version__",
    "compose_user_data",
    "pick_instance_type",
]

_EC2_NAMES = frozenset({"CLIENT_TOKEN_TAG", "Ec2Adapter", "Ec2Credentials", "Ec2Settings"})


def __getattr__(name: str) -> Any:
    if name in _EC2_NAMES:
        from bettercompute_vps import _ec2

        return getattr(_ec2, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
