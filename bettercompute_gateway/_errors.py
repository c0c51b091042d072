"""Errors on the wire: a ``ComputeError`` becomes a gRPC status whose message is the project's JSON envelope
(``{"error": {"code", "message", "details", "retryable"}}``), so a daemon reads the same code and reason an HTTP
caller would."""

from __future__ import annotations

import json

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from bettercompute.errors import ComputeError, InternalError

__all__ = ["STATUS_OF", "grpc_error"]

STATUS_OF: dict[str, Status] = {
    "INVALID_INPUT": Status.INVALID_ARGUMENT,
    "UNAUTHENTICATED": Status.UNAUTHENTICATED,
    "ACCESS_DENIED": Status.PERMISSION_DENIED,
    "NOT_FOUND": Status.NOT_FOUND,
    "CONFLICT": Status.ABORTED,
    "QUOTA_EXCEEDED": Status.RESOURCE_EXHAUSTED,
    "NO_CAPACITY": Status.RESOURCE_EXHAUSTED,
    "RATE_LIMITED": Status.RESOURCE_EXHAUSTED,
    "FAILED_PRECONDITION": Status.FAILED_PRECONDITION,
    "UNAVAILABLE": Status.UNAVAILABLE,
    "INTERNAL": Status.INTERNAL,
    "INVALID_CONFIG": Status.INTERNAL,
}
"""The gRPC status of each error code (an unknown code is ``INTERNAL``)."""


def grpc_error(error: ComputeError) -> GRPCError:
    """The gRPC error a caller gets for ``error``: its status, and the JSON envelope as the message."""
    status = STATUS_OF.get(error.code, Status.INTERNAL)
    return GRPCError(status, json.dumps(error.to_envelope(), separators=(",", ":"), ensure_ascii=True))


def internal() -> GRPCError:
    """The answer to a failure no one expected: nothing of it reaches the caller (it is logged by class)."""
    return grpc_error(InternalError("the gateway failed unexpectedly"))
