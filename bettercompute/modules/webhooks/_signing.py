"""Signed webhooks: how Better Compute signs a delivery, and ``verify`` for the receiving side.

Deliveries follow the Standard Webhooks specification (https://www.standardwebhooks.com), so a receiver in any
language can check them with that project's libraries (``standardwebhooks`` for Python, Svix's for others). Every
delivery is a ``POST`` of a JSON body (``id``, ``type`` -- the event's type, ``webhook.test`` for ``webhooks.test``
--, ``key``, ``seq``, ``tenant``, ``created_at`` and the payload under ``data``) with these headers:

- ``webhook-id``: the event's id, the same on every retry of it; use it to drop duplicates (delivery is at least
  once).
- ``webhook-timestamp``: the attempt's time in unix seconds; a new one on every attempt, so a receiver may refuse
  old ones (the replay window).
- ``webhook-signature``: ``v1,<base64 of HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">``, keyed by the
  subscription's secret ``whsec_<base64>`` decoded; several, separated by spaces, when more than one secret signs.

The headers of earlier versions are sent too, for receivers written against them: ``Bettercompute-Event-Id``,
``Bettercompute-Event-Type`` and ``Bettercompute-Signature`` (``t=<unix seconds>,v1=<hex>``, HMAC-SHA256 of
``<t>.<body>`` keyed by the whole secret string). ``verify`` checks the standard headers when they are there and
those otherwise. Secrets made by earlier versions (``whsec_`` and URL-safe base64) sign the standard headers too,
keyed as the reference library decodes them; a receiver in another language should replace such a secret
(``webhooks.rotate_secret``) to get one in standard base64.

A receiver reads the raw body (before any JSON parsing) and calls::

    from bettercompute.modules.webhooks import verify
    verify(secret, request.headers, body)  # raises WebhookVerificationError

or, with the Standard Webhooks library, ``standardwebhooks.Webhook(secret).verify(body, request.headers)``.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
from collections.abc import Mapping, Sequence

import attrs
import httpx

from bettercompute.errors import InvalidInputError

__all__ = [
    "EVENT_ID_HEADER",
    "EVENT_TYPE_HEADER",
    "SIGNATURE_HEADER",
    "STANDARD_ID_HEADER",
    "STANDARD_SIGNATURE_HEADER",
    "STANDARD_TIMESTAMP_HEADER",
    "WebhookSettings",
    "WebhookVerificationError",
    "sign",
    "signature_header",
    "standard_headers",
    "standard_signature",
    "verify",
]

SIGNATURE_HEADER = "Bettercompute-Signature"
EVENT_ID_HEADER = "Bettercompute-Event-Id"
EVENT_TYPE_HEADER = "Bettercompute-Event-Type"
STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"
_SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
DEFAULT_TOLERANCE = dt.timedelta(minutes=5)
_MAX_RETENTION = dt.timedelta(days=36525)  # beyond, the database's timestamps would overflow


@attrs.frozen(kw_only=True)
class WebhookSettings:
    """How the ``sinks`` role sends webhooks (``Options.webhooks``).

    Args:
        max_attempts: A delivery that failed this many times is ``dead`` (the dead letter; it stays in the log).
            A pass of a worker that cannot decrypt the signing secret (it lacks the deployment's key) sends nothing
            and is not an attempt: the delivery waits as after a failure, never becoming ``dead`` for it.
        backoff: The wait after the first failure; it doubles after each further one, up to ``max_backoff``, and
            is jittered to between half and all of that.
        max_backoff: The longest wait between two attempts.
        timeout: The whole of one attempt (connect, send, answer); a slower receiver counts as a failure.
        batch_size: Deliveries claimed per pass of the sender.
        max_per_tenant: At most this many of one tenant's deliveries per pass. A pass takes the tenants in turns
            (each one's oldest due delivery, then each one's second, ...), so a tenant whose receivers fail or hang
            holds a bounded share of a pass and never delays another tenant's delivery to a later pass.
        max_per_webhook: At most this many of one subscription's deliveries per pass; a tenant's subscriptions take
            turns within the tenant's share the same way.
        concurrency: Deliveries sent at once by one pass.
        allow_private_destinations: Let subscriptions reach internal addresses. Off (the default), ``create``
            refuses a URL naming ``localhost`` or a loopback, private, link-local (``169.254.169.254``), multicast,
            reserved or unspecified address, and the sender resolves the host right before each attempt and refuses
            it (``last_error`` "destination address not allowed", no request made) when any address it resolves to
            is one of those, then connects to the address it checked. Turn it on only where every tenant is trusted
            to reach your internal network (tests with a loopback receiver, a single-team installation).
        allow_loopback_destinations: Let subscriptions reach this machine's loopback addresses and ``localhost``
            (``better-compute dev`` sets it, for a receiver under development on the same machine); every other
            internal address stays refused, at ``create`` and before each attempt.
        transport: The HTTP transport the sender posts through (httpx's own when ``None``): an egress proxy, a
            custom TLS setup, or a test's transport. The sender never closes it; its owner does, after ``close()``.
        retention: How long a ``delivered`` delivery stays in the delivery log after it finished: 7 days, enough to
            answer "did my receiver get last week's event?". The job ``sinks/webhooks-retention`` deletes older
            ones every 10 minutes, a bounded batch at a time.
        dead_retention: The same for ``dead`` deliveries (the dead letters): 30 days, so a receiver that was broken
            for a while can still be diagnosed from its log well after the fact. A ``pending`` delivery is never
            deleted, whatever its age.
    """

    max_attempts: int = 12
    backoff: dt.timedelta = dt.timedelta(seconds=10)
    max_backoff: dt.timedelta = dt.timedelta(hours=1)
    timeout: dt.timedelta = dt.timedelta(seconds=10)
    batch_size: int = 50
    max_per_tenant: int = 16
    max_per_webhook: int = 8
    concurrency: int = 8
    allow_private_destinations: bool = False
    allow_loopback_destinations: bool = False
    transport: httpx.AsyncBaseTransport | None = attrs.field(default=None, eq=False, repr=False)
    retention: dt.timedelta = dt.timedelta(days=7)
    dead_retention: dt.timedelta = dt.timedelta(days=30)

    def problems(self) -> list[str]:
        """What is wrong with these settings (``better_compute()`` reports it as ``INVALID_CONFIG``)."""
        problems = []
        if self.max_attempts < 1:
            problems.append("webhooks.max_attempts: must be at least 1")
        if self.backoff <= dt.timedelta(0) or self.max_backoff < self.backoff:
            problems.append("webhooks.backoff: must be positive and at most max_backoff")
        if self.timeout <= dt.timedelta(0):
            problems.append("webhooks.timeout: must be positive")
        if self.batch_size < 1 or self.concurrency < 1:
            problems.append("webhooks.batch_size, webhooks.concurrency: must be at least 1")
        if self.max_per_tenant < 1 or self.max_per_webhook < 1:
            problems.append("webhooks.max_per_tenant, webhooks.max_per_webhook: must be at least 1")
        for name, kept in (("retention", self.retention), ("dead_retention", self.dead_retention)):
            if not dt.timedelta(0) < kept <= _MAX_RETENTION:
                problems.append(f"webhooks.{name}: must be positive and at most 100 years")
        return problems


class WebhookVerificationError(InvalidInputError):
    """A webhook delivery failed verification: no or a garbled signature header, a signature that does not match,
    or a timestamp outside the replay window. ``details["reason"]`` says which (``missing``, ``malformed``,
    ``mismatch``, ``expired``). Answer it with 400 and do not act on the body."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``<timestamp>.<body>`` keyed by ``secret``."""
    return hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def signature_header(secret: str, timestamp: int, body: bytes) -> str:
    """The value of ``Bettercompute-Signature`` for ``body`` sent at ``timestamp`` (unix seconds)."""
    return f"t={timestamp},v1={sign(secret, timestamp, body)}"


def _standard_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret, decoded as the specification's reference library decodes it
    (padding added, characters outside the alphabet skipped), so that every secret this project ever made verifies
    with it."""
    encoded = secret[len(_SECRET_PREFIX) :] if secret.startswith(_SECRET_PREFIX) else secret
    try:
        return base64.b64decode(encoded + "==")
    except (binascii.Error, ValueError):
        return secret.encode()


def standard_signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """One entry of ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">``."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(_standard_key(secret), signed, hashlib.sha256).digest()).decode()


def standard_headers(secrets: Sequence[str], message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of a delivery, signed by each of ``secrets``."""
    return {
        STANDARD_ID_HEADER: message_id,
        STANDARD_TIMESTAMP_HEADER: str(timestamp),
        STANDARD_SIGNATURE_HEADER: " ".join(standard_signature(s, message_id, timestamp, body) for s in secrets),
    }


def _header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    tolerance: dt.timedelta = DEFAULT_TOLERANCE,
    now: dt.datetime | None = None,
) -> None:
    """Check that ``body`` was signed with ``secret`` within ``tolerance`` of ``now``; return quietly if so.

    Args:
        secret: The subscription's signing secret (``whsec_...``), as ``webhooks.create`` showed it.
        headers: The request's headers (any mapping; names are matched case-insensitively).
        body: The raw request body, exactly as received.
        tolerance: How far the signature's timestamp may be from ``now``, either way.
        now: The current time (timezone-aware); the system clock when left out.

    Raises:
        WebhookVerificationError: the signature header is missing or garbled, no ``v1`` signature matches (compared
            in constant time), or the timestamp is outside the window.
    """
    raw = body.encode() if isinstance(body, str) else body
    standard = _header(headers, STANDARD_SIGNATURE_HEADER)
    if standard is not None:
        timestamp, candidates, expected = _standard_parts(secret, headers, standard, raw)
    else:
        timestamp, candidates, expected = _legacy_parts(secret, headers, raw)
    # Every candidate is compared, so the time taken does not depend on which one matched.
    matched = False
    for candidate in candidates:
        matched |= hmac.compare_digest(expected.encode(), candidate.encode())
    if not matched:
        raise WebhookVerificationError("the webhook signature does not match", details={"reason": "mismatch"})
    current = (now or dt.datetime.now(dt.UTC)).timestamp()
    if abs(current - timestamp) > tolerance.total_seconds():
        raise WebhookVerificationError(
            "the webhook signature's timestamp is outside the replay window",
            details={"reason": "expired", "tolerance_seconds": tolerance.total_seconds()},
        )


def _unix(value: str | None, header: str) -> int:
    if value is None:
        raise WebhookVerificationError(
            f"the {header} header is missing", details={"reason": "missing", "header": header}
        )
    if not (value.isascii() and value.isdigit() and len(value) <= 12):
        raise WebhookVerificationError(
            f"the {header} header is not unix seconds", details={"reason": "malformed", "header": header}
        )
    return int(value)


def _standard_parts(
    secret: str, headers: Mapping[str, str], signatures: str, body: bytes
) -> tuple[int, list[str], str]:
    """The timestamp, the ``v1`` signatures offered and the one expected, from the Standard Webhooks headers."""
    message_id = _header(headers, STANDARD_ID_HEADER)
    if not message_id:
        raise WebhookVerificationError(
            f"the {STANDARD_ID_HEADER} header is missing", details={"reason": "missing", "header": STANDARD_ID_HEADER}
        )
    timestamp = _unix(_header(headers, STANDARD_TIMESTAMP_HEADER), STANDARD_TIMESTAMP_HEADER)
    candidates = [token for token in signatures.split(" ") if token.startswith("v1,") and len(token) > 3]
    if not candidates:
        raise WebhookVerificationError(
            f"the {STANDARD_SIGNATURE_HEADER} header holds no 'v1,<base64>' signature",
            details={"reason": "malformed", "header": STANDARD_SIGNATURE_HEADER},
        )
    return timestamp, candidates, standard_signature(secret, message_id, timestamp, body)


def _legacy_parts(secret: str, headers: Mapping[str, str], body: bytes) -> tuple[int, list[str], str]:
    """The same from the headers of earlier versions (``Bettercompute-Signature: t=<unix>,v1=<hex>``)."""
    value = _header(headers, SIGNATURE_HEADER)
    if value is None:
        raise WebhookVerificationError(
            f"the {STANDARD_SIGNATURE_HEADER} header is missing",
            details={"reason": "missing", "header": STANDARD_SIGNATURE_HEADER},
        )
    timestamp: int | None = None
    candidates: list[str] = []
    for part in value.split(","):
        key, sep, item = part.strip().partition("=")
        if not sep:
            continue
        if key == "t" and item.isascii() and item.isdigit() and len(item) <= 12:
            timestamp = int(item)
        elif key == "v1":
            candidates.append(item)
    if timestamp is None or not candidates:
        raise WebhookVerificationError(
            f"the {SIGNATURE_HEADER} header is not 't=<unix>,v1=<hex>'",
            details={"reason": "malformed", "header": SIGNATURE_HEADER},
        )
    return timestamp, candidates, sign(secret, timestamp, body)
