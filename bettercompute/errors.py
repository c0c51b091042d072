"""The errors a caller of Better Compute can see.

Every error that crosses the API carries a wire ``code`` (the spec's names) and one HTTP status::

    ComputeError                      (base; never raised itself)
    ├── InvalidConfigError            INVALID_CONFIG        500
    ├── InvalidInputError             INVALID_INPUT         400
    ├── UnauthenticatedError          UNAUTHENTICATED       401
    ├── AccessDeniedError             ACCESS_DENIED         403
    ├── NotFoundError                 NOT_FOUND             404
    ├── ConflictError                 CONFLICT              409
    ├── QuotaExceededError            QUOTA_EXCEEDED        403
    ├── NoCapacityError               NO_CAPACITY           409  (retryable)
    ├── FailedPreconditionError       FAILED_PRECONDITION   409
    ├── RateLimitedError              RATE_LIMITED          429  (retryable)
    ├── UnavailableError              UNAVAILABLE           503  (retryable)
    └── InternalError                 INTERNAL              500

The same classes are raised by the in-process ``api``, by the HTTP handler (as the JSON envelope
``{"error": {"code", "message", "details", "retryable"}}``) and by the typed client, which turns the envelope back
into the class registered for its code. Foreign exceptions (database drivers, HTTP libraries) are translated at one
boundary each and never reach a caller: their text may hold SQL or secrets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "AccessDeniedError",
    "ComputeError",
    "ConflictError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidConfigError",
    "InvalidInputError",
    "NoCapacityError",
    "NotFoundError",
    "QuotaExceededError",
    "RateLimitedError",
    "UnauthenticatedError",
    "UnavailableError",
    "error_class_for_code",
]

_BY_CODE: dict[str, type[ComputeError]] = {}


class ComputeError(Exception):
    """The root of every error a caller can see.

    Args:
        message: One sentence for a person; never SQL, a stack trace or a secret.
        details: Machine-readable facts (a field path, a resource id); JSON-serializable.
    """

    code: ClassVar[str] = ""
    http_status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Only a class that declares a code registers it: a subclass of a coded class (a more precise error for
        # one caller, like ``WebhookVerificationError``) keeps its parent's code and is not a second owner of it.
        if "code" in cls.__dict__ and cls.code:
            if cls.code in _BY_CODE:
                raise TypeError(f"error code {cls.code} is registered twice")
            _BY_CODE[cls.code] = cls

    def __init__(self, message: str, *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def to_envelope(self) -> dict[str, Any]:
        """The JSON body the HTTP transport sends for this error."""
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "details": self.details,
                "retryable": self.retryable,
            }
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, details={self.details!r})"


class InvalidConfigError(ComputeError):
    """The options given to ``better_compute()`` (or a module's declaration) are wrong.

    ``details["problems"]`` lists every problem found, not just the first.
    """

    code = "INVALID_CONFIG"
    http_status = 500


class InvalidInputError(ComputeError):
    """The request is malformed: bad JSON, an unknown or ill-typed field (its path in ``details["path"]``)."""

    code = "INVALID_INPUT"
    http_status = 400


class UnauthenticatedError(ComputeError):
    """No credential, or one that is garbled, unknown, expired or revoked."""

    code = "UNAUTHENTICATED"
    http_status = 401


class AccessDeniedError(ComputeError):
    """The caller is known but may not do this."""

    code = "ACCESS_DENIED"
    http_status = 403


class NotFoundError(ComputeError):
    """The method or the resource does not exist (or the caller may not know it does)."""

    code = "NOT_FOUND"
    http_status = 404


class ConflictError(ComputeError):
    """The request collides with existing state, e.g. an idempotency key reused for another request."""

    code = "CONFLICT"
    http_status = 409


class QuotaExceededError(ComputeError):
    """The tenant's quota does not allow this."""

    code = "QUOTA_EXCEEDED"
    http_status = 403


class NoCapacityError(ComputeError):
    """No capacity matches the request now; it may later."""

    code = "NO_CAPACITY"
    http_status = 409
    retryable = True


class FailedPreconditionError(ComputeError):
    """The resource is not in a state that allows this operation."""

    code = "FAILED_PRECONDITION"
    http_status = 409


class RateLimitedError(ComputeError):
    """Too many requests; retry after a pause."""

    code = "RATE_LIMITED"
    http_status = 429
    retryable = True


class UnavailableError(ComputeError):
    """A dependency (the database, IAM) cannot be reached now; the request may be retried."""

    code = "UNAVAILABLE"
    http_status = 503
    retryable = True


class InternalError(ComputeError):
    """A bug or an unexpected failure. The message never includes the cause's text."""

    code = "INTERNAL"
    http_status = 500


def error_class_for_code(code: str) -> type[ComputeError]:
    """The class registered for a wire code; ``InternalError`` for a code this version does not know."""
    return _BY_CODE.get(code, InternalError)
