"""Sealing for Join: HPKE to JoinService's key, refused when sealed to another key, tampered, stale or replayed."""

from __future__ import annotations

import datetime as dt

import pytest

from bettercompute.errors import InvalidInputError, UnauthenticatedError
from bettercompute.modules.nodes._sealing import JoinKeyPair, Unsealer, parse_public_key, seal
from bettercompute.testing import InMemoryReplayGuard
from bettercompute_store_pg import PgStore

pytestmark = [pytest.mark.anyio]

NOW = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
AGE = dt.timedelta(minutes=5)
TOKEN = b"bcjt_abc.s3cr3t-token-value"


async def test_a_sealed_token_opens_once_with_the_right_key() -> None:
    pair = JoinKeyPair.generate()
    sealed = seal(pair.public_key_text(), TOKEN, now=NOW)
    assert TOKEN not in sealed
    opened = await Unsealer(pair, InMemoryReplayGuard()).unseal(sealed, now=NOW + dt.timedelta(seconds=3), max_age=AGE)
    assert opened.plaintext == TOKEN and opened.sealed_at == NOW
    assert "s3cr3t" not in repr(opened) and "private" not in repr(pair).lower()
    restored = JoinKeyPair.from_private_bytes(pair.private_bytes())
    assert restored.public_key_text() == pair.public_key_text()
    assert parse_public_key(pair.public_key_text()) is not None


async def _refused(unsealer: Unsealer, sealed: bytes, now: dt.datetime = NOW) -> tuple[str, str, str]:
    with pytest.raises((UnauthenticatedError, InvalidInputError)) as caught:
        await unsealer.unseal(sealed, now=now, max_age=AGE)
    return caught.value.code, caught.value.details["reason"], str(caught.value)


async def test_refusals_carry_their_code_and_reason() -> None:
    pair = JoinKeyPair.generate()
    unsealer = Unsealer(pair, InMemoryReplayGuard())
    sealed = seal(pair.public_key, TOKEN, now=NOW)
    other = seal(JoinKeyPair.generate().public_key, TOKEN, now=NOW)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    cases = {
        "wrong key": (other, NOW, ("UNAUTHENTICATED", "unopenable")),
        "tampered": (tampered, NOW, ("UNAUTHENTICATED", "unopenable")),
        "too old": (sealed, NOW + AGE + dt.timedelta(seconds=1), ("UNAUTHENTICATED", "expired")),
        "future": (sealed, NOW - dt.timedelta(minutes=2), ("UNAUTHENTICATED", "from_the_future")),
        "malformed": (b"nonsense", NOW, ("INVALID_INPUT", "malformed")),
        "other version": (b"bcj2" + sealed[4:], NOW, ("INVALID_INPUT", "malformed")),
    }
    private_hex = pair.private_bytes().hex()
    for what, (payload, now, expected) in cases.items():
        code, reason, message = await _refused(unsealer, payload, now)
        assert (code, reason) == expected, what
        assert private_hex not in message and "s3cr3t" not in message
    # None of the refusals used up the nonce: the genuine payload still opens once, then is a replay.
    assert (await unsealer.unseal(sealed, now=NOW, max_age=AGE)).plaintext == TOKEN
    assert (await _refused(unsealer, sealed))[:2] == ("UNAUTHENTICATED", "replayed")


@pytest.mark.pg
async def test_a_replay_is_refused_across_unsealers_sharing_the_database(database_url: str, fresh_schema: str) -> None:
    pair = JoinKeyPair.generate()
    one, two = PgStore(database_url, schema=fresh_schema), PgStore(database_url, schema=fresh_schema)
    await one.open()
    await two.open()
    try:
        await one.install()
        first, second = Unsealer(pair, one.nonces), Unsealer(pair, two.nonces)
        sealed = seal(pair.public_key, TOKEN, now=NOW)
        assert (await first.unseal(sealed, now=NOW, max_age=AGE)).plaintext == TOKEN
        assert (await _refused(second, sealed))[:2] == ("UNAUTHENTICATED", "replayed")
        assert (await _refused(first, sealed))[:2] == ("UNAUTHENTICATED", "replayed")
        # Another payload of the same token has its own nonce.
        again = seal(pair.public_key, TOKEN, now=NOW)
        assert (await second.unseal(again, now=NOW, max_age=AGE)).plaintext == TOKEN
        # Once every nonce's payload would be refused as expired, they can be forgotten.
        later = NOW + AGE + dt.timedelta(minutes=2)
        assert await one.nonces.purge(now=later) == 2
        assert await one.nonces.purge(now=later) == 0
    finally:
        await one.close()
        await two.close()


@pytest.mark.pg
async def test_concurrent_unseals_of_one_payload_let_exactly_one_through(pg_store: PgStore) -> None:
    import anyio

    pair = JoinKeyPair.generate()
    sealed = seal(pair.public_key, TOKEN, now=NOW)
    results: list[str] = []

    async def one() -> None:
        try:
            await Unsealer(pair, pg_store.nonces).unseal(sealed, now=NOW, max_age=AGE)
            results.append("ok")
        except UnauthenticatedError as exc:
            results.append(exc.details["reason"])

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(one)
    assert sorted(results) == ["ok", "replayed", "replayed", "replayed"]
