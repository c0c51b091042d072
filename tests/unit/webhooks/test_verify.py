"""The receiver helper: ``verify`` accepts what Better Compute signs and refuses everything else."""

from __future__ import annotations

import datetime as dt

import pytest

from bettercompute.errors import InvalidInputError
from bettercompute.modules.webhooks import (
    EVENT_ID_HEADER,
    SIGNATURE_HEADER,
    WebhookVerificationError,
    sign,
    signature_header,
    verify,
)

SECRET = "whsec_test-secret"
BODY = b'{"id":"evt_1","type":"reservation.created","data":{"tenant":"acme"}}'
NOW = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
T = int(NOW.timestamp())


def _headers(value: str) -> dict[str, str]:
    return {SIGNATURE_HEADER: value, EVENT_ID_HEADER: "evt_1"}


def _reason(secret: str, headers: dict[str, str], body: bytes, **kwargs: dt.datetime) -> str:
    with pytest.raises(WebhookVerificationError) as info:
        verify(secret, headers, body, now=kwargs.get("now", NOW))
    assert isinstance(info.value, InvalidInputError) and info.value.code == "INVALID_INPUT"
    reason: str = info.value.details["reason"]
    return reason


def test_a_good_signature_is_accepted_whatever_the_header_case() -> None:
    verify(SECRET, _headers(signature_header(SECRET, T, BODY)), BODY, now=NOW)
    verify(SECRET, {SIGNATURE_HEADER.lower(): signature_header(SECRET, T, BODY)}, BODY.decode(), now=NOW)


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    import hashlib
    import hmac

    expected = hmac.new(SECRET.encode(), f"{T}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, T, BODY) == expected
    assert signature_header(SECRET, T, BODY) == f"t={T},v1={expected}"


def test_one_matching_signature_among_several_is_enough() -> None:
    value = f"t={T},v1={'0' * 64},v1={sign(SECRET, T, BODY)}"
    verify(SECRET, _headers(value), BODY, now=NOW)


def test_a_tampered_body_is_refused() -> None:
    assert _reason(SECRET, _headers(signature_header(SECRET, T, BODY)), BODY.replace(b"acme", b"evil")) == "mismatch"


def test_a_wrong_secret_is_refused() -> None:
    assert _reason("whsec_other", _headers(signature_header(SECRET, T, BODY)), BODY) == "mismatch"


def test_a_changed_timestamp_breaks_the_signature() -> None:
    value = f"t={T + 1},v1={sign(SECRET, T, BODY)}"
    assert _reason(SECRET, _headers(value), BODY) == "mismatch"


def test_an_old_or_future_timestamp_is_refused_outside_the_window() -> None:
    old = T - 301
    assert _reason(SECRET, _headers(signature_header(SECRET, old, BODY)), BODY) == "expired"
    future = T + 301
    assert _reason(SECRET, _headers(signature_header(SECRET, future, BODY)), BODY) == "expired"
    # Inside the window, and with a wider tolerance, the same old signature passes.
    verify(SECRET, _headers(signature_header(SECRET, T - 299, BODY)), BODY, now=NOW)
    verify(SECRET, _headers(signature_header(SECRET, old, BODY)), BODY, now=NOW, tolerance=dt.timedelta(minutes=10))


def test_a_missing_header_is_refused() -> None:
    assert _reason(SECRET, {EVENT_ID_HEADER: "evt_1"}, BODY) == "missing"


@pytest.mark.parametrize(
    "value",
    ["", "garbage", "t=abc,v1=00", f"v1={'0' * 64}", f"t={T}", f"t={T},v0=00", "t=-5,v1=00", "t=1e9,v1=00"],
)
def test_a_garbled_header_is_refused(value: str) -> None:
    assert _reason(SECRET, _headers(value), BODY) == "malformed"


def test_the_error_message_never_holds_the_secret_or_the_expected_signature() -> None:
    with pytest.raises(WebhookVerificationError) as info:
        verify(SECRET, _headers(f"t={T},v1={'0' * 64}"), BODY, now=NOW)
    text = f"{info.value} {info.value.details}"
    assert SECRET not in text and sign(SECRET, T, BODY) not in text
