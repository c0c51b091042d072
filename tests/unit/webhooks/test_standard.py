"""Deliveries on the Standard Webhooks specification: what this project signs verifies with the specification's
reference library (``standardwebhooks``), and ``verify`` checks the standard headers by the same rules."""

from __future__ import annotations

import base64
import datetime as dt
import secrets

import pytest
import standardwebhooks
from hypothesis import given
from hypothesis import strategies as st

from bettercompute.modules.webhooks import (
    STANDARD_ID_HEADER,
    STANDARD_SIGNATURE_HEADER,
    STANDARD_TIMESTAMP_HEADER,
    WebhookVerificationError,
    standard_headers,
    verify,
)

NEW = "whsec_" + base64.b64encode(b"\x01" * 32).decode()  # the form webhooks.create makes now
OLD = "whsec_Ab-cd_EF" + "x" * 36  # the form earlier versions made: URL-safe base64, with '-' and '_'
BODY = b'{"id":"evt_1","type":"reservation.placed","data":{"tenant":"acme"}}'


def _now() -> int:
    return int(dt.datetime.now(dt.UTC).timestamp())


@pytest.mark.parametrize("secret", [NEW, OLD], ids=["standard secret", "earlier secret"])
def test_the_reference_library_verifies_what_we_sign(secret: str) -> None:
    headers = standard_headers([secret], "evt_1", _now(), BODY)
    assert standardwebhooks.Webhook(secret).verify(BODY, headers)["type"] == "reservation.placed"
    verify(secret, headers, BODY)


def test_the_reference_library_refuses_a_tampered_body_a_stale_timestamp_and_another_secret() -> None:
    headers = standard_headers([NEW], "evt_1", _now(), BODY)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(NEW).verify(BODY.replace(b"acme", b"evil"), headers)
    stale = standard_headers([NEW], "evt_1", _now() - 3600, BODY)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(NEW).verify(BODY, stale)
    other = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(other).verify(BODY, headers)


def test_several_secrets_sign_and_either_one_verifies() -> None:
    second = "whsec_" + base64.b64encode(b"\x02" * 32).decode()
    headers = standard_headers([NEW, second], "evt_1", _now(), BODY)
    assert len(headers[STANDARD_SIGNATURE_HEADER].split(" ")) == 2
    for secret in (NEW, second):
        standardwebhooks.Webhook(secret).verify(BODY, headers)
        verify(secret, headers, BODY)


def _reason(headers: dict[str, str], body: bytes = BODY, secret: str = NEW) -> str:
    with pytest.raises(WebhookVerificationError) as info:
        verify(secret, headers, body)
    return str(info.value.details["reason"])


def test_verify_refuses_what_the_standard_refuses_with_its_reason() -> None:
    good = standard_headers([NEW], "evt_1", _now(), BODY)
    assert _reason(good, BODY + b" ") == "mismatch"
    assert _reason(good, secret=OLD) == "mismatch"
    assert _reason({**good, STANDARD_ID_HEADER: "evt_2"}) == "mismatch"  # the id is signed
    assert _reason(standard_headers([NEW], "evt_1", _now() - 3600, BODY)) == "expired"
    assert _reason({k: v for k, v in good.items() if k != STANDARD_ID_HEADER}) == "missing"
    assert _reason({k: v for k, v in good.items() if k != STANDARD_TIMESTAMP_HEADER}) == "missing"
    full_width = "\uff11\uff17" + "\uff10" * 8
    for garbled in (full_width, "17e8", "-1", "", "9" * 13):  # full-width digits, an exponent, a sign, ...
        assert _reason({**good, STANDARD_TIMESTAMP_HEADER: garbled}) == "malformed", garbled
    for garbled in ("", "v2,abc", "v1,", "sha256=abc"):
        assert _reason({**good, STANDARD_SIGNATURE_HEADER: garbled}) == "malformed", garbled


@given(
    body=st.binary(max_size=512),
    message_id=st.text(alphabet=st.characters(codec="ascii", exclude_characters=" "), min_size=1, max_size=40),
    key=st.binary(min_size=1, max_size=64),
)
def test_any_body_and_id_sign_as_the_reference_library_signs(body: bytes, message_id: str, key: bytes) -> None:
    # NUL bytes, bytes that are not UTF-8, any id: the same signature as the specification's own code.
    secret = "whsec_" + base64.b64encode(key).decode()
    timestamp = _now()
    headers = standard_headers([secret], message_id, timestamp, body)
    expected = standardwebhooks.Webhook(secret).sign(message_id, dt.datetime.fromtimestamp(timestamp, dt.UTC), body)
    assert headers[STANDARD_SIGNATURE_HEADER] == expected
    verify(secret, headers, body)


def test_the_receivers_module_names_the_same_verify() -> None:
    import bettercompute.webhooks
    from bettercompute.modules import webhooks

    assert bettercompute.webhooks.verify is webhooks.verify
    assert bettercompute.webhooks.WebhookVerificationError is webhooks.WebhookVerificationError
