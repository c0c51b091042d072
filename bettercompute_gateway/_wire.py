"""Reading the wire: a message refused by its length before it is read, a unary call whose every failure becomes one
error envelope, the connection's client certificate, and JSON from the daemon checked for what PostgreSQL can hold.

Every handler is a raw grpclib handler (not the generated base class) for these reasons: grpclib reads any length
it is sent, the client certificate is read from the TLS connection, and every failure must become one envelope.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import betterproto2
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from bettercompute._runtime.codec import storable_json
from bettercompute.errors import ComputeError, InvalidInputError, UnauthenticatedError

from ._errors import grpc_error, internal

__all__ = ["client_certificate", "json_object", "json_value", "ms", "receive", "unary"]

log = logging.getLogger("bettercompute.gateway")

M = TypeVar("M", bound=betterproto2.Message)


async def receive(stream: Stream[Any, Any], kind: type[M], most: int) -> M | None:
    """The next message of ``stream`` (``None`` at its end), refused by its length before it is read.

    Raises:
        GRPCError: ``RESOURCE_EXHAUSTED`` for a message over ``most`` bytes, ``INVALID_ARGUMENT`` for one that does
            not parse or is compressed.
    """
    raw = stream._stream
    head = await raw.recv_data(5)
    if not head:
        return None
    if len(head) != 5:
        raise grpc_error(InvalidInputError("a message was cut short", details={"reason": "malformed"}))
    compressed, length = struct.unpack(">?I", head)
    if compressed:
        raise grpc_error(InvalidInputError("compressed messages are not taken", details={"reason": "malformed"}))
    if length > most:
        raise GRPCError(
            Status.RESOURCE_EXHAUSTED,
            json.dumps(
                {
                    "error": {
                        "code": "INVALID_INPUT",
                        "message": f"a message is at most {most} bytes",
                        "details": {"reason": "too_large", "max_bytes": most},
                        "retryable": False,
                    }
                }
            ),
        )
    body = await raw.recv_data(length)
    if len(body) != length:
        raise grpc_error(InvalidInputError("a message was cut short", details={"reason": "malformed"}))
    try:
        return kind.parse(body)
    except Exception:
        raise grpc_error(InvalidInputError("a message does not parse", details={"reason": "malformed"})) from None


async def unary(stream: Stream[Any, Any], kind: type[M], answer: Callable[[M], Awaitable[Any]], *, most: int) -> None:
    """Answer a unary call: read its request, send ``answer``'s reply; a ``ComputeError`` becomes its envelope, any
    other failure an ``INTERNAL`` that says nothing of it (the log names its class)."""
    try:
        request = await receive(stream, kind, most)
        if request is None:
            raise grpc_error(InvalidInputError("no request was sent", details={"reason": "malformed"}))
        reply = await answer(request)
    except GRPCError:
        raise
    except ComputeError as exc:
        raise grpc_error(exc) from None
    except Exception as exc:
        log.error("%s failed: %s", kind.__name__, type(exc).__name__)
        raise internal() from None
    await stream.send_message(reply)


@overload
def client_certificate(stream: Stream[Any, Any]) -> str: ...
@overload
def client_certificate(stream: Stream[Any, Any], *, required: bool) -> str | None: ...
def client_certificate(stream: Stream[Any, Any], *, required: bool = True) -> str | None:
    """The PEM of the connection's client certificate (verified against the trust bundle by the handshake).

    Raises:
        UnauthenticatedError: the connection presented none and ``required``.
    """
    transport = stream.peer._transport
    ssl_object = transport.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        if not required:
            return None
        raise UnauthenticatedError(
            "this call needs the node's client certificate", details={"reason": "no_certificate"}
        )
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM).decode()


def json_value(text: str, path: str) -> Any:
    """Any JSON value from the wire, refused when it does not parse or holds text PostgreSQL cannot store.

    Raises:
        InvalidInputError: either.
    """
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError):
        raise InvalidInputError(f"{path}: not JSON", details={"path": path}) from None
    if not storable_json(value):
        raise InvalidInputError(
            f"{path}: holds a NUL character or an unpaired surrogate", details={"path": path, "reason": "unstorable"}
        )
    return value


def json_object(text: str, path: str) -> dict[str, Any]:
    """A JSON object from the wire, refused when it is not one or holds text PostgreSQL cannot store (a NUL, an
    unpaired surrogate from a ``\\ud800`` escape), anywhere, keys included.

    Raises:
        InvalidInputError: either.
    """
    try:
        # NaN, Infinity and numbers too large for a float (1e999) are refused: PostgreSQL's jsonb cannot hold them.
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise InvalidInputError(f"{path}: expected a JSON object", details={"path": path})
    if not storable_json(value):
        raise InvalidInputError(
            f"{path}: holds a NUL character or an unpaired surrogate", details={"path": path, "reason": "unstorable"}
        )
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number too large")
    return value


def ms(seconds: float) -> int:
    """Seconds as the wire's whole milliseconds."""
    return round(seconds * 1000)
