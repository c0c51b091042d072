"""``Pkcs11Kms`` against SoftHSM2 (Debian's ``softhsm2``: a real PKCS#11 token library, with a token made for the
test in a folder of its own): secrets of every shape round-trip, a blob opens only under its key and context, a
changed byte anywhere is refused, a wrong PIN, token or key label is a configuration error, the key cannot be read
out of the token, and a control plane keeps its CA and JoinService keys sealed by it across a restart."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import pkcs11
import pytest

from bettercompute import JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute.errors import InternalError, InvalidConfigError
from bettercompute_iam import EmbeddedIam
from bettercompute_kms import Pkcs11Kms
from bettercompute_store_pg import PgStore

from ._rewrap import rewrap_every_blob

pytestmark = [pytest.mark.anyio]

MODULE = "/usr/lib/softhsm/libsofthsm2.so"
TOKEN = "bettercompute-test"
PIN = "4821-test"
SO_PIN = "9953-test-so"
KEY = "bc-master"


@attrs.frozen
class Token:
    label: str
    pin: str

    def kms(self, key_label: str = KEY) -> Pkcs11Kms:
        return Pkcs11Kms(MODULE, token_label=self.label, pin=self.pin, key_label=key_label)


@pytest.fixture(scope="module")
def token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Token]:
    util = shutil.which("softhsm2-util")
    if util is None or not os.path.exists(MODULE):
        if os.environ.get("CI"):
            pytest.fail("softhsm2 is not installed (apt-get install softhsm2); CI must run this test")
        pytest.skip("softhsm2 is not installed (apt-get install softhsm2)")
    folder = tmp_path_factory.mktemp("softhsm")
    (folder / "tokens").mkdir()
    conf = folder / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {folder / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n")
    before = os.environ.get("SOFTHSM2_CONF")
    os.environ["SOFTHSM2_CONF"] = str(conf)  # read by the library when it loads, in this process
    try:
        subprocess.run(
            [util, "--init-token", "--free", "--label", TOKEN, "--pin", PIN, "--so-pin", SO_PIN],
            check=True,
            capture_output=True,
        )
        Pkcs11Kms.create_key(MODULE, token_label=TOKEN, pin=PIN, key_label=KEY)
        Pkcs11Kms.create_key(MODULE, token_label=TOKEN, pin=PIN, key_label="bc-other")
        yield Token(TOKEN, PIN)
    finally:
        if before is None:
            os.environ.pop("SOFTHSM2_CONF", None)
        else:
            os.environ["SOFTHSM2_CONF"] = before


SECRETS = [b"", b"x", b"\x00" * 33, "pâssw\u00f6rd \u202e".encode(), bytes(range(256)) * 256]


async def test_every_secret_round_trips_and_no_two_blobs_are_alike(token: Token) -> None:
    kms = token.kms()
    try:
        for secret in SECRETS:
            first = await kms.encrypt(secret, context="webhook:acme:wh_1")
            second = await kms.encrypt(secret, context="webhook:acme:wh_1")
            assert first != second
            if len(secret) >= 16:
                assert secret not in first
            assert await kms.decrypt(first, context="webhook:acme:wh_1") == secret
            assert await kms.decrypt(second, context="webhook:acme:wh_1") == secret
        assert PIN not in repr(kms)
    finally:
        kms.close()


async def test_a_blob_opens_only_under_its_context_and_key_and_unchanged(token: Token) -> None:
    kms, other = token.kms(), token.kms("bc-other")
    try:
        blob = await kms.encrypt(b"db-password", context="secret:acme:db")
        with pytest.raises(InternalError):
            await kms.decrypt(blob, context="secret:globex:db")
        with pytest.raises(InternalError):
            await other.decrypt(blob, context="secret:acme:db")
        for at in (0, 3, 4, 4 + 12, 4 + 12 + 47, 4 + 12 + 48, 4 + 12 + 48 + 12, len(blob) - 1):
            changed = bytearray(blob)
            changed[at] ^= 0x01
            with pytest.raises(InternalError):
                await kms.decrypt(bytes(changed), context="secret:acme:db")
        for cut in (b"", blob[:3], blob[:40], blob[:76], blob[:-1]):
            with pytest.raises(InternalError):
                await kms.decrypt(cut, context="secret:acme:db")
        assert await kms.decrypt(blob, context="secret:acme:db") == b"db-password"
    finally:
        kms.close()
        other.close()


async def test_a_wrong_pin_token_or_key_is_a_configuration_error(token: Token) -> None:
    cases = [
        Pkcs11Kms(MODULE, token_label=token.label, pin="0000-wrong", key_label=KEY),
        Pkcs11Kms(MODULE, token_label="no-such-token", pin=token.pin, key_label=KEY),
        Pkcs11Kms(MODULE, token_label=token.label, pin=token.pin, key_label="no-such-key"),
        Pkcs11Kms("/nonexistent/libpkcs11.so", token_label=token.label, pin=token.pin, key_label=KEY),
    ]
    for kms in cases:
        with pytest.raises(InvalidConfigError) as refused:
            await kms.encrypt(b"x", context="c")
        assert "0000-wrong" not in str(refused.value) and "0000-wrong" not in str(refused.value.details)
        kms.close()
    with pytest.raises(InvalidConfigError):
        Pkcs11Kms.create_key(MODULE, token_label=token.label, pin=token.pin, key_label=KEY)  # one of that label


def test_the_key_cannot_be_read_out_of_the_token(token: Token) -> None:
    with pkcs11.lib(MODULE).get_token(token_label=token.label).open(user_pin=token.pin) as session:
        key = session.get_key(object_class=pkcs11.ObjectClass.SECRET_KEY, label=KEY)
        assert key[pkcs11.Attribute.EXTRACTABLE] is False and key[pkcs11.Attribute.SENSITIVE] is True
        with pytest.raises(pkcs11.exceptions.AttributeSensitive):
            key[pkcs11.Attribute.VALUE]


@pytest.mark.pg
async def test_a_control_plane_keeps_its_keys_sealed_by_the_token_across_a_restart(
    token: Token, database_url: str, fresh_schema: str, tmp_path: Path
) -> None:
    join = JoinSettings(gateway_address="gw.example.com:7443", trust_domain="hsm.example.test")

    async def plane_trust_bundle() -> str:
        kms = token.kms()
        store = PgStore(database_url, schema=fresh_schema, pool_size=2)
        compute = better_compute(Options(store=store, iam=EmbeddedIam(), kms=kms, join=join))
        await compute.initialize()
        try:
            assert compute.gateway_services.enrolment is not None
            assert (await compute.gateway_services.enrolment.mint("gw-hsm")).startswith("bcgw_")
            return await compute.gateway_services.trust_bundle_pem()
        finally:
            await compute.close()
            kms.close()

    # The first makes the CA key and JoinService's key, sealed; the second (a restart) opens them.
    assert await plane_trust_bundle() == await plane_trust_bundle()


@pytest.mark.pg
async def test_every_stored_blob_moves_from_a_key_file_to_the_token_and_between_its_keys(
    token: Token, database_url: str, fresh_schema: str, empty_schema: str, tmp_path: Path
) -> None:
    """A re-wrap through this adapter: from a local key file to the HSM's key, then to another key of the HSM."""
    done, total = await rewrap_every_blob(database_url, fresh_schema, LocalKeyKms(tmp_path / "kms.key"), token.kms())
    assert (done.resealed, done.failed) == (total, 0)
    done, total = await rewrap_every_blob(database_url, empty_schema, token.kms(), token.kms("bc-other"))
    assert (done.resealed, done.failed) == (total, 0)
