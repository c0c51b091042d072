"""The daemon's errors, one tree under ``DaemonError`` (a failure to report to the operator in one line, no
secret)::

    DaemonError
    |-- JoinRefused         the control plane refused the join for good
    |-- ConfigError         a configuration that cannot be used, every problem listed
    |-- CallError           a call the control plane (or the gateway) refused, with its envelope
    `-- GatewayUnreachable  a call that got no answer
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

__all__ = ["CallError", "ConfigError", "DaemonError", "GatewayUnreachable", "JoinRefused"]

_PASSING = frozenset({Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED, Status.RESOURCE_EXHAUSTED, Status.ABORTED})


class DaemonError(Exception):
    """A failure to report to the operator: one line, no secret."""


class JoinRefused(DaemonError):
    """The control plane refused the join, and asking again would not change its answer."""


class ConfigError(DaemonError):
    """The join configuration cannot be used: every problem, one line each."""

    def __init__(self, problems: list[str], *, subject: str = "the join configuration") -> None:
        self.problems = problems
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{subject} has {len(problems)} {noun}:\n  " + "\n  ".join(problems))


class CallError(DaemonError):
    """The control plane (or the gateway) refused a call.

    Attributes:
        method: The method called.
        status: The gRPC status.
        code: The envelope's code (``INVALID_INPUT``, ``ACCESS_DENIED``, ...), or the status's name when the refusal
            carried no envelope.
        message: The envelope's message (or the status's message).
        details: The envelope's details (``{}`` when none).
        retryable: Whether asking again later may succeed: the envelope says so, or the status is a passing one.
    """

    def __init__(
        self,
        method: str,
        *,
        status: Status,
        code: str,
        message: str,
        details: Mapping[str, Any],
        retryable: bool,
    ) -> None:
        self.method = method
        self.status = status
        self.code = code
        self.message = message
        self.details = dict(details)
        self.retryable = retryable
        super().__init__(f"{method} was refused: {message} ({code}{', ' + self.reason if self.reason else ''})")

    @property
    def reason(self) -> str | None:
        """``details.reason`` when the envelope gives one."""
        reason = self.details.get("reason")
        return reason if isinstance(reason, str) else None

    @classmethod
    def from_grpc(cls, method: str, error: GRPCError) -> CallError:
        """The ``CallError`` a gRPC error says."""
        try:
            body = json.loads(error.message or "")["error"]
            if not isinstance(body, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            body = {}
        code = body.get("code")
        message = body.get("message")
        details = body.get("details")
        return cls(
            method,
            status=error.status,
            code=code if isinstance(code, str) else error.status.name,
            message=message if isinstance(message, str) else (error.message or "no message"),
            details=details if isinstance(details, dict) else {},
            retryable=body.get("retryable") is True or error.status in _PASSING,
        )


class GatewayUnreachable(DaemonError):
    """The call did not get an answer: the gateway could not be reached, the connection broke, or it timed out."""
