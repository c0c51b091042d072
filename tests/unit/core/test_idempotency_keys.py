"""Which idempotency keys are accepted, whatever class of text a caller sends, and what the fingerprint compares."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bettercompute._runtime.codec import encode
from bettercompute._runtime.idempotency import checked_key, fingerprint
from bettercompute.errors import InvalidInputError

_ACCEPTED = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=255)


@given(_ACCEPTED)
def test_printable_ascii_keys_are_accepted(key: str) -> None:
    assert checked_key(key) == key


@pytest.mark.parametrize(
    "key",
    [
        "",
        " ",
        "a b",
        "nul\x00byte",
        "tab\there",
        "\ud800",  # an unpaired surrogate
        "\uff11\uff12\uff13",  # full-width digits
        "key\u202e",  # a bidirectional override
        "é",
        "x" * 256,
        None,
        42,
    ],
)
def test_every_other_key_is_invalid_input(key: object) -> None:
    with pytest.raises(InvalidInputError) as refused:
        checked_key(key)
    assert refused.value.details == {"path": "Idempotency-Key", "reason": "malformed idempotency key"}


@given(st.text(max_size=50).filter(lambda k: not _is_ascii_printable(k)))
def test_any_text_outside_printable_ascii_is_refused(key: str) -> None:
    with pytest.raises(InvalidInputError):
        checked_key(key)


def _is_ascii_printable(text: str) -> bool:
    return bool(text) and all(0x21 <= ord(c) <= 0x7E for c in text)


@attrs.frozen(kw_only=True)
class _Create:
    name: str
    value: str = attrs.field(repr=False)


def test_the_fingerprint_compares_the_request_but_never_a_hidden_field() -> None:
    one = _Create(name="a", value="s3cr3t")
    same_but_secret = _Create(name="a", value="other")
    other = _Create(name="b", value="s3cr3t")
    printed = fingerprint("/x/create", one, encode(one))
    assert printed == fingerprint("/x/create", same_but_secret, encode(same_but_secret))
    assert printed != fingerprint("/x/create", other, encode(other))
    assert printed != fingerprint("/y/create", one, encode(one))
    assert "s3cr3t" not in printed
