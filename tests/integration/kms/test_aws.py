"""``AwsKms`` against moto's KMS server (a real process on loopback, the same ``moto_server`` the EC2 tests start):
secrets of every shape round-trip, a blob opens only under its key and context, a changed byte anywhere is refused,
a key that cannot be used is a configuration error, a KMS that cannot be reached is ``UNAVAILABLE`` at once, and a
control plane keeps its CA and JoinService keys sealed by it across processes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import boto3.session
import pytest

from bettercompute import JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute.errors import InternalError, InvalidConfigError, UnavailableError
from bettercompute_iam import EmbeddedIam
from bettercompute_kms import AwsKms
from bettercompute_store_pg import PgStore

from ..vps._moto import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, MotoServer, free_port, start_moto
from ._rewrap import rewrap_every_blob

pytestmark = [pytest.mark.anyio]


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto(tmp_path_factory.mktemp("moto-kms") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


def _client(moto: MotoServer):  # type: ignore[no-untyped-def]
    session = boto3.session.Session(
        aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=SECRET_ACCESS_KEY, region_name=REGION
    )
    return session.client("kms", endpoint_url=moto.url)


def _key(moto: MotoServer) -> str:
    with contextlib.closing(_client(moto)) as client:
        return str(client.create_key(Description="bettercompute test")["KeyMetadata"]["KeyId"])


def _kms(moto: MotoServer, key_id: str) -> AwsKms:
    return AwsKms(
        key_id,
        region=REGION,
        endpoint_url=moto.url,
        access_key_id=ACCESS_KEY_ID,
        secret_access_key=SECRET_ACCESS_KEY,
    )


SECRETS = [b"", b"x", b"\x00" * 33, "pâssw\u00f6rd \u202e".encode(), bytes(range(256)) * 256]


async def test_every_secret_round_trips_and_no_two_blobs_are_alike(moto: MotoServer) -> None:
    kms = _kms(moto, _key(moto))
    for secret in SECRETS:
        first = await kms.encrypt(secret, context="webhook:acme:wh_1")
        second = await kms.encrypt(secret, context="webhook:acme:wh_1")
        assert first != second
        if len(secret) >= 16:  # a longer plaintext never shows in the blob (a short one could by chance)
            assert secret not in first
        assert await kms.decrypt(first, context="webhook:acme:wh_1") == secret
        assert await kms.decrypt(second, context="webhook:acme:wh_1") == secret
    assert "SECRET" not in repr(kms) and SECRET_ACCESS_KEY not in repr(kms)


async def test_a_blob_opens_only_under_its_context_and_key_and_unchanged(moto: MotoServer) -> None:
    kms = _kms(moto, _key(moto))
    blob = await kms.encrypt(b"db-password", context="secret:acme:db")
    with pytest.raises(InternalError):
        await kms.decrypt(blob, context="secret:globex:db")  # copied onto another row
    other = _kms(moto, _key(moto))
    # A blob of another key: AWS answers IncorrectKeyException (InternalError here), moto AccessDeniedException.
    with pytest.raises((InternalError, InvalidConfigError)):
        await other.decrypt(blob, context="secret:acme:db")
    size = int.from_bytes(blob[4:6], "big")
    # A changed byte of the header, the nonce or the sealed value: this adapter's own checks refuse it.
    for at in (0, 5, 6 + size + 3, len(blob) - 1):
        changed = bytearray(blob)
        changed[at] ^= 0x01
        with pytest.raises(InternalError):
            await kms.decrypt(bytes(changed), context="secret:acme:db")
    # A changed byte of the wrapped data key: KMS refuses to unwrap it (moto answers AccessDenied where AWS answers
    # InvalidCiphertext); either way no plaintext comes out.
    for at in (6, 6 + size // 2, 6 + size - 1):
        changed = bytearray(blob)
        changed[at] ^= 0x01
        with pytest.raises((InternalError, InvalidConfigError)):
            await kms.decrypt(bytes(changed), context="secret:acme:db")
    for cut in (b"", blob[:3], blob[:6], blob[: 6 + size], blob[:-1]):
        with pytest.raises(InternalError):
            await kms.decrypt(cut, context="secret:acme:db")


async def test_a_key_that_cannot_be_used_is_a_configuration_error(moto: MotoServer) -> None:
    # An unknown key. (moto does not refuse a disabled key's GenerateDataKey, so that case is AWS's alone.)
    with pytest.raises(InvalidConfigError) as unknown:
        await _kms(moto, "00000000-0000-0000-0000-000000000000").encrypt(b"x", context="c")
    assert "00000000-0000-0000-0000-000000000000" in str(unknown.value.details)
    assert SECRET_ACCESS_KEY not in str(unknown.value.details) and SECRET_ACCESS_KEY not in str(unknown.value)
    with pytest.raises(InvalidConfigError):
        AwsKms("")


async def test_a_kms_that_cannot_be_reached_is_unavailable_at_once(moto: MotoServer) -> None:
    down = AwsKms(
        _key(moto),
        region=REGION,
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        access_key_id=ACCESS_KEY_ID,
        secret_access_key=SECRET_ACCESS_KEY,
        timeout=2,
    )
    with pytest.raises(UnavailableError) as refused:
        await down.encrypt(b"x", context="c")
    assert refused.value.details == {"reason": "kms"}
    # One attempt a call: the caller decides whether to try again, no retries pile up inside (no clock asserted).
    assert getattr(down._kms().meta.config, "retries")["total_max_attempts"] == 1  # noqa: B009 - not in the stubs


@pytest.mark.pg
async def test_a_control_plane_keeps_its_keys_sealed_by_aws_kms_across_processes(
    moto: MotoServer, database_url: str, fresh_schema: str, tmp_path: Path
) -> None:
    key = _key(moto)
    join = JoinSettings(gateway_address="gw.example.com:7443", trust_domain="kms.example.test")

    async def plane_trust_bundle() -> str:
        store = PgStore(database_url, schema=fresh_schema, pool_size=2)
        compute = better_compute(Options(store=store, iam=EmbeddedIam(), kms=_kms(moto, key), join=join))
        await compute.initialize()
        try:
            # Minting a gateway enrolment token seals with the KMS.
            assert compute.gateway_services.enrolment is not None
            token = await compute.gateway_services.enrolment.mint("gw-kms")
            assert token.startswith("bcgw_")
            return await compute.gateway_services.trust_bundle_pem()
        finally:
            await compute.close()

    # The first makes the CA key and JoinService's key, sealed; the second (a restart) opens them.
    assert await plane_trust_bundle() == await plane_trust_bundle()


@pytest.mark.pg
async def test_every_stored_blob_moves_from_a_key_file_to_aws_kms_and_between_aws_keys(
    moto: MotoServer, database_url: str, fresh_schema: str, empty_schema: str, tmp_path: Path
) -> None:
    """A re-wrap through this adapter: from a local key file to an AWS KMS key, then from that key to another."""
    first, second = _kms(moto, _key(moto)), _kms(moto, _key(moto))
    done, total = await rewrap_every_blob(database_url, fresh_schema, LocalKeyKms(tmp_path / "kms.key"), first)
    assert (done.resealed, done.failed) == (total, 0)
    done, total = await rewrap_every_blob(database_url, empty_schema, first, second)
    assert (done.resealed, done.failed) == (total, 0)
