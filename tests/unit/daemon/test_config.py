"""``bcd join``'s configuration: flags, a pinned configuration file, or both; each problem reported on its own line,
and nothing accepted that is not the field's shape (types, ASCII, no NUL or control character)."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bettercompute_daemon._agent import DaemonError
from bettercompute_daemon._config import ConfigError, parse_join_command, read_config_file, resolve
from bettercompute_daemon._pin import bundle_pin, parse_pin


def ca_pem(name: str = "test CA") -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


BUNDLE = ca_pem()
PIN = "sha256:" + "ab" * 32
JOIN_KEY = base64.urlsafe_b64encode(b"k" * 32).decode().rstrip("=")
GOOD: dict[str, Any] = {
    "gateway": "gw.example.com:443",
    "trust_domain": "example.com",
    "pool": "pool_0123",
    "join_key": JOIN_KEY,
    "ca_pin": PIN,
}
NO_FLAGS: dict[str, str | None] = {}


def problems(flags: dict[str, str | None], file: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        resolve(flags, file, path="join.json")
    assert str(raised.value).count("\n") == len(raised.value.problems)  # one line each, after the heading
    return raised.value.problems


def test_the_file_alone_equals_the_flags_alone() -> None:
    from_file = resolve(NO_FLAGS, GOOD, path="join.json")
    from_flags = resolve(dict(GOOD))
    assert from_file == from_flags
    assert from_file.ca_pin == PIN and from_file.ca_bundle_pem is None and from_file.pool == "pool_0123"
    assert from_file.node_config().gateway == "gw.example.com:443"


def test_a_bundle_is_base64_of_its_pem_in_the_file_as_on_the_command_line() -> None:
    encoded = base64.b64encode(BUNDLE.encode()).decode()
    file = {k: v for k, v in GOOD.items() if k != "ca_pin"} | {"ca_bundle": encoded}
    config = resolve(NO_FLAGS, file, path="join.json")
    assert config.ca_bundle_pem == BUNDLE and config.ca_pin is None


def test_a_flag_may_repeat_the_file_but_not_contradict_it() -> None:
    assert resolve({"pool": "pool_0123"}, GOOD, path="join.json").pool == "pool_0123"
    [problem] = problems({"pool": "pool_other"}, GOOD)
    assert problem == "--pool says otherwise than pool in join.json: give one or make them agree"


def test_a_pool_may_be_null_or_left_out() -> None:
    assert resolve(NO_FLAGS, {**GOOD, "pool": None}, path="join.json").pool is None
    assert resolve(NO_FLAGS, {k: v for k, v in GOOD.items() if k != "pool"}, path="join.json").pool is None


def test_every_problem_is_reported_at_once() -> None:
    file = {
        "gateway": "gw:\uff14\uff14\uff13",  # full-width digits
        "trust_domain": "Example.COM",
        "pool": 5,
        "join_key": "short",
        "ca_pin": "sha256:xyz",
        "extra\x00": True,
    }
    found = problems(NO_FLAGS, file)
    assert found == [
        "join.json: extra\\u0000: not a field of the join configuration "
        "(gateway, trust_domain, pool, join_key, ca_bundle, ca_pin)",
        "join.json: gateway: only printable ASCII is allowed (no NUL, control or non-ASCII character)",
        "join.json: trust_domain: must be a lower-case DNS name",
        "join.json: pool: expected a string, not a number",
        "join.json: join_key: must be a 32-byte key in URL-safe base64 (43 characters)",
        "join.json: ca_pin: a CA pin is sha256: followed by 64 hex digits (0-9, a-f)",
    ]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("gateway", "gw.example.com", "must be host:port, the port a number from 1 to 65535"),
        ("gateway", "gw.example.com:0", "must be host:port, the port a number from 1 to 65535"),
        ("gateway", "gw.example.com:65536", "must be host:port, the port a number from 1 to 65535"),
        ("gateway", "gw ex:443", "must be host:port, the port a number from 1 to 65535"),
        (
            "gateway",
            "gw.example.com:443\x00",
            "only printable ASCII is allowed (no NUL, control or non-ASCII character)",
        ),
        ("gateway", "gw\n.example.com:443", "only printable ASCII is allowed (no NUL, control or non-ASCII character)"),
        ("gateway", "", "empty"),
        ("gateway", ["gw:443"], "expected a string, not a list"),
        ("trust_domain", True, "expected a string, not a boolean"),
        ("trust_domain", "-example.com", "must be a lower-case DNS name"),
        ("pool", "pool 1", "must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', '-'"),
        ("pool", "p" * 129, "must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', '-'"),
        ("join_key", JOIN_KEY[:-1] + "+", "must be a 32-byte key in URL-safe base64 (43 characters)"),
        ("join_key", {"k": 1}, "expected a string, not an object"),
        (
            "ca_pin",
            "sha256:" + "\uff10" * 64,
            "only printable ASCII is allowed (no NUL, control or non-ASCII character)",
        ),
        ("ca_pin", "SHA256:" + "ab" * 32, "a CA pin is sha256: followed by 64 hex digits (0-9, a-f)"),
        ("ca_pin", "sha256:" + "ab" * 31, "a CA pin is sha256: followed by 64 hex digits (0-9, a-f)"),
        (
            "ca_pin",
            "sha256:" + "ab" * 32 + "\n",
            "only printable ASCII is allowed (no NUL, control or non-ASCII character)",
        ),
        ("ca_pin", 12, "expected a string, not a number"),
    ],
)
def test_each_malformed_field_is_named_with_its_rule(field: str, value: Any, expected: str) -> None:
    assert problems(NO_FLAGS, {**GOOD, field: value}) == [f"join.json: {field}: {expected}"]


def test_a_malformed_flag_is_named_by_its_flag() -> None:
    assert problems({**GOOD, "gateway": "gw:\u0664\u0664\u0663"}) == [
        "--gateway: only printable ASCII is allowed (no NUL, control or non-ASCII character)"
    ]


def test_a_bundle_that_is_not_base64_of_certificates_is_refused() -> None:
    file = {k: v for k, v in GOOD.items() if k != "ca_pin"}
    for bundle in ("not base64!", base64.b64encode(b"no certificate here").decode(), BUNDLE.replace("\n", " ")):
        assert problems(NO_FLAGS, {**file, "ca_bundle": bundle}) == [
            "join.json: ca_bundle: must be base64 of a PEM bundle of CA certificates"
        ]


def test_missing_fields_and_the_ca_rule() -> None:
    assert problems(NO_FLAGS, {}) == [
        "gateway: missing (give --gateway or put it in --config)",
        "trust_domain: missing (give --trust-domain or put it in --config)",
        "join_key: missing (give --join-key or put it in --config)",
        "ca_bundle or ca_pin: missing (give --ca-pin or --ca-bundle, or put one in --config)",
    ]
    both = {**GOOD, "ca_bundle": base64.b64encode(BUNDLE.encode()).decode()}
    assert problems(NO_FLAGS, both) == [
        "join.json: ca_bundle and join.json: ca_pin: give a CA bundle or a CA pin, not both"
    ]
    assert problems({"ca_bundle": base64.b64encode(BUNDLE.encode()).decode()}, GOOD) == [
        "--ca-bundle and join.json: ca_pin: give a CA bundle or a CA pin, not both"
    ]


def test_reading_the_file(tmp_path: Path) -> None:
    path = tmp_path / "join.json"
    path.write_text(json.dumps(GOOD))
    assert read_config_file(path) == GOOD
    cases = {
        b'{"gateway": "a:1", "gateway": "b:2"}': f"{path}: gateway: given more than once",
        b'{"gateway": ': f"{path}: not JSON (line 1, column 13)",
        b'["gateway"]': f"{path}: expected a JSON object",
        b'{"pool": "\xff"}': f"{path}: not UTF-8 text",
        b"x" * (1024 * 1024 + 1): f"{path}: larger than 1048576 bytes",
    }
    for content, expected in cases.items():
        path.write_bytes(content)
        with pytest.raises(ConfigError) as raised:
            read_config_file(path)
        assert raised.value.problems == [expected]
    with pytest.raises(ConfigError, match="cannot be read"):
        read_config_file(tmp_path / "missing.json")


def test_a_pin_is_sha256_of_the_sorted_der_certificates() -> None:
    der = x509.load_pem_x509_certificate(BUNDLE.encode()).public_bytes(serialization.Encoding.DER)
    assert bundle_pin(BUNDLE) == "sha256:" + hashlib.sha256(der).hexdigest()  # one CA: its fingerprint
    other = ca_pem("next CA")
    assert bundle_pin(BUNDLE + other) == bundle_pin(other + BUNDLE)  # the bundle's order does not matter
    assert bundle_pin(BUNDLE + other) not in (bundle_pin(BUNDLE), bundle_pin(other))
    assert bundle_pin(BUNDLE.replace("\n", "\r\n")) == bundle_pin(BUNDLE)  # nor its line endings
    with pytest.raises(DaemonError, match="no readable certificate"):
        bundle_pin("")


def test_a_pin_is_ascii_hex_in_either_case() -> None:
    assert parse_pin("sha256:" + "AB" * 32) == "sha256:" + "ab" * 32
    for bad in (
        "sha256:" + "\uff10" * 64,
        "sha256:" + "\uff21" * 64,
        "sha256:" + "g" * 64,
        "sha1:" + "ab" * 32,
        "sha256:" + "ab" * 33,
        "",
    ):
        with pytest.raises(DaemonError, match="64 hex digits"):
            parse_pin(bad)


def test_a_printed_join_command_parses_into_its_token_and_configuration() -> None:
    key = "-" + JOIN_KEY[1:]  # a key may start with '-': join-tokens.create prints it attached
    bundle = base64.b64encode(BUNDLE.encode()).decode()
    pinned = ["--pool", "pool_1", "--gateway", "gw.example.com:443", "--trust-domain", "example.com"]
    command = shlex.join(["bcd", "join", "--token", "bcjt_a.b", *pinned, "--ca-bundle", bundle, f"--join-key={key}"])
    token, config = parse_join_command(command)
    assert token == "bcjt_a.b"
    assert (config.gateway, config.trust_domain, config.pool, config.join_key) == (
        "gw.example.com:443",
        "example.com",
        "pool_1",
        key,
    )
    assert config.ca_bundle_pem == BUNDLE
    for bad in ("bcd node", "bcd join --pool p", "bcd join --token t --nope x", "bcd join --token"):
        with pytest.raises(ConfigError):
            parse_join_command(bad)
