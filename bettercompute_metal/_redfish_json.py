"""What a BMC answers, read as hostile input, and the error every failure to reach or understand it becomes.

Bodies are capped at ``MAX_BODY_BYTES`` and must be JSON no deeper than ``MAX_JSON_DEPTH``; links are taken only as
paths under ``/redfish/v1`` (``safe_path``), so a client follows them on the same origin only; collections are read
up to ``MAX_MEMBERS`` members; a field of the wrong type is ``BMC_BAD_RESPONSE``, never a crash. Every failure is a
``RedfishError`` whose ``reason`` a caller can act on, and whose message never holds the password, the
``Authorization`` header or more than a short, cleaned excerpt of what the BMC said (``excerpt``).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping
from typing import Any, Final

from bettercompute_metal._redfish_trust import ROOT

__all__ = [
    "BMC_AUTH_FAILED",
    "BMC_BAD_RESPONSE",
    "BMC_ERROR",
    "BMC_NOT_FOUND",
    "BMC_TLS_FAILED",
    "BMC_UNREACHABLE",
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_MEMBERS",
    "RedfishError",
    "bad_response",
    "decode",
    "excerpt",
    "integer_field",
    "json_object",
    "link",
    "mac_address",
    "members",
    "number_field",
    "optional_object",
    "safe_path",
    "text_field",
    "texts_field",
]

BMC_UNREACHABLE: Final = "BMC_UNREACHABLE"
BMC_AUTH_FAILED: Final = "BMC_AUTH_FAILED"
BMC_TLS_FAILED: Final = "BMC_TLS_FAILED"
BMC_NOT_FOUND: Final = "BMC_NOT_FOUND"
BMC_BAD_RESPONSE: Final = "BMC_BAD_RESPONSE"
BMC_ERROR: Final = "BMC_ERROR"

MAX_BODY_BYTES: Final = 1024 * 1024
MAX_JSON_DEPTH: Final = 32
MAX_MEMBERS: Final = 128

_MAC = re.compile(r"[0-9a-f]{2}([:-]?)[0-9a-f]{2}(\1[0-9a-f]{2}){4}")
# RFC 3986 path characters; a link from the BMC with anything else (a space, a backslash, a quote) is refused.
_PATH_CHARS = frozenset(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@%/")


class RedfishError(Exception):
    """A BMC could not be reached, refused us, or answered something this client cannot use.

    It does not cross the API by itself: the metal module's methods and workflows turn it into their own outcome (a
    failed step, an ``UNAVAILABLE`` or ``FAILED_PRECONDITION`` error) and may carry ``reason`` along in details.

    Args:
        reason: One of ``BMC_UNREACHABLE`` (no connection, DNS, timeout), ``BMC_AUTH_FAILED`` (401 or 403),
            ``BMC_TLS_FAILED`` (certificate not trusted, pin mismatch, handshake failure), ``BMC_NOT_FOUND`` (no
            system, or a resource the BMC does not have), ``BMC_BAD_RESPONSE`` (not JSON, the wrong shape, too large
            or too deep) and ``BMC_ERROR`` (any other error status; ``status`` holds it).
        message: One sentence for a person, with no secret in it.
        retryable: Whether the same call may succeed later unchanged (unreachable, a 5xx or 429).
        status: The HTTP status, when the BMC answered with one.
    """

    def __init__(self, reason: str, message: str, *, retryable: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retryable = retryable
        self.status = status

    def __repr__(self) -> str:
        return f"RedfishError({self.reason!r}, {self.message!r}, retryable={self.retryable}, status={self.status})"


def bad_response(message: str) -> RedfishError:
    """A ``BMC_BAD_RESPONSE``: the BMC answered something this client cannot use."""
    return RedfishError(BMC_BAD_RESPONSE, message)


def excerpt(text: str, secrets: tuple[str, ...]) -> str:
    """At most 160 printable characters of ``text``, with every secret in it replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    cleaned = "".join(char if char.isprintable() and char.isascii() else " " for char in text)
    cleaned = " ".join(cleaned.split())
    return cleaned[:157] + "..." if len(cleaned) > 160 else cleaned


def _depth_within(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(body: bytes, what: str) -> Any:
    """The JSON of a body (``what`` names the request in messages): no NaN or Infinity, no deeper than
    ``MAX_JSON_DEPTH``."""
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except RecursionError:
        raise bad_response(f"The BMC's answer to {what} is JSON nested too deeply.") from None
    except ValueError:
        raise bad_response(f"The BMC's answer to {what} is not JSON.") from None
    if not _depth_within(value, MAX_JSON_DEPTH):
        raise bad_response(f"The BMC's answer to {what} is JSON nested deeper than {MAX_JSON_DEPTH} levels.")
    return value


def json_object(value: Any, what: str) -> dict[str, Any]:
    """``value``, which must be a JSON object."""
    if not isinstance(value, dict):
        raise bad_response(f"The BMC's {what} is not a JSON object.")
    return value


def optional_object(resource: Mapping[str, Any], key: str, what: str) -> dict[str, Any]:
    """The object under ``key``, or an empty one when the BMC leaves it out."""
    value = resource.get(key)
    if value is None:
        return {}
    return json_object(value, f"{what}'s {key}")


def text_field(resource: Mapping[str, Any], key: str, what: str) -> str | None:
    """The string under ``key``, stripped and cut to 256 characters; ``None`` when absent or blank."""
    value = resource.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_response(f"The BMC's {what} has a {key} that is not a string.")
    value = value.strip()
    return value[:256] if value else None


def integer_field(resource: Mapping[str, Any], key: str, what: str) -> int | None:
    """The non-negative integer under ``key``, or ``None`` when absent."""
    value = resource.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_response(f"The BMC's {what} has a {key} that is not a non-negative integer.")
    return value


def number_field(resource: Mapping[str, Any], key: str, what: str) -> float | None:
    """The non-negative number under ``key``, or ``None`` when absent."""
    value = resource.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise bad_response(f"The BMC's {what} has a {key} that is not a non-negative number.")
    return float(value)


def texts_field(resource: Mapping[str, Any], key: str, what: str) -> tuple[str, ...]:
    """The list of strings under ``key`` (at most ``MAX_MEMBERS``, each cut to 64 characters)."""
    value = resource.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise bad_response(f"The BMC's {what} has a {key} that is not a list of strings.")
    return tuple(item[:64] for item in value[:MAX_MEMBERS])


def mac_address(value: str | None) -> str | None:
    """A MAC address as lowercase hex pairs joined by colons; ``None`` for a placeholder or none."""
    if not value:
        return None
    compact = value.strip().lower()
    if not _MAC.fullmatch(compact):
        return None  # A BMC's placeholder ("", "N/A", all zeros in odd forms): the NIC is listed without a MAC.
    digits = re.sub(r"[^0-9a-f]", "", compact)
    mac = ":".join(digits[index : index + 2] for index in range(0, 12, 2))
    return None if mac == "00:00:00:00:00:00" else mac


def safe_path(value: Any, what: str) -> str:
    """A link the BMC gave, as a path under ``/redfish/v1`` of the same origin (its fragment dropped)."""
    if not isinstance(value, str):
        raise bad_response(f"The BMC's link for {what} is not a string.")
    path = value.partition("#")[0]
    segments = path.split("/")
    if (
        not path.startswith(ROOT)
        or path[len(ROOT) : len(ROOT) + 1] not in ("", "/")
        or len(path) > 512
        or not set(path) <= _PATH_CHARS
        or "//" in path
        or any(segment in (".", "..") for segment in segments)
    ):
        raise bad_response(f"The BMC's link for {what} is not a path under {ROOT}.")
    return path.rstrip("/") or ROOT


def link(resource: Mapping[str, Any], key: str, what: str) -> str | None:
    """The checked path of the ``{"@odata.id": ...}`` link under ``key``, or ``None`` when absent."""
    value = resource.get(key)
    if value is None:
        return None
    return safe_path(json_object(value, f"{what}'s {key} link").get("@odata.id"), f"{what}'s {key}")


def members(collection: Mapping[str, Any], what: str) -> list[str]:
    """The checked paths of a collection's first ``MAX_MEMBERS`` members."""
    listed = collection.get("Members")
    if listed is None:
        return []
    if not isinstance(listed, list):
        raise bad_response(f"The BMC's {what} collection has Members that is not a list.")
    return [safe_path(json_object(member, f"{what} member").get("@odata.id"), what) for member in listed[:MAX_MEMBERS]]
