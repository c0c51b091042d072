"""JoinService's keys as one process holds them (``JoinKeyRing``), and their rotation with an overlap.

A join token is sealed, on the machine that joins, to the JoinService public key its join command carries. When the
key rotates, the new one is ``active`` (join commands and install scripts made from then on carry it) and the one
before is ``previous`` until ``retire_after``: commands printed before the rotation keep working for that overlap,
then fail as sealed to an unknown key. The renewal challenges' MAC key is derived from the same keys: issued with the
active one, checked with any the ring holds.

Each process reads the keys again at most every ``ttl`` (and at once when something sealed to a key it does not hold
yet arrives), and opens their private halves through the KMS, never inside a transaction.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import time
from collections.abc import Callable

from bettercompute.errors import FailedPreconditionError, InvalidConfigError, InvalidInputError, NotFoundError
from bettercompute.modules.nodes._port import JOIN_KEYS, JoinKeyRecord
from bettercompute.modules.nodes._sealing import JoinKeyPair
from bettercompute.ports import Clock, Kms, Store

__all__ = ["DEFAULT_OVERLAP", "MAX_OVERLAP", "JoinKeyRing", "join_key_context", "retire_join_key", "rotate_join_key"]

log = logging.getLogger("bettercompute.nodes")

DEFAULT_OVERLAP = dt.timedelta(days=1)
"""How long the key before a rotation still opens what was sealed to it, unless the rotation says otherwise."""
MAX_OVERLAP = dt.timedelta(days=30)


def join_key_context(key_id: str) -> str:
    """The KMS context JoinService's key ``key_id`` is sealed under."""
    return f"join-key:{key_id}"


class JoinKeyRing:
    """The JoinService keys this process can open: the active one first, then the previous ones still in their
    overlap.

    Args:
        store: Where the keys live.
        kms: Opens their private halves.
        clock: Decides which previous keys are still in their overlap.
        ttl: How long a read of the keys is reused.
        timer: Seconds of a monotonic clock (tests inject one).
    """

    def __init__(
        self,
        store: Store,
        kms: Kms,
        *,
        clock: Clock,
        ttl: dt.timedelta = dt.timedelta(seconds=5),
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._kms = kms
        self._clock = clock
        self._ttl = ttl.total_seconds()
        self._timer = timer
        self._read_at: float | None = None
        self._read_clock: dt.datetime | None = None
        self._records: list[JoinKeyRecord] = []
        self._pairs: dict[str, JoinKeyPair] = {}

    def __repr__(self) -> str:
        return f"JoinKeyRing(keys={[r.id for r in self._records]!r})"

    async def refresh(self, *, force: bool = False) -> None:
        """Read the keys again if the last read is older than ``ttl`` by the monotonic timer or by the clock (or
        ``force``), opening new ones."""
        if (
            not force
            and self._read_at is not None
            and self._read_clock is not None
            and self._timer() - self._read_at < self._ttl
            and (self._clock.now() - self._read_clock).total_seconds() < self._ttl
        ):
            return
        records = [r for r in await self._store.repository(JOIN_KEYS).list() if r.state != "retired"]
        for record in records:
            if record.id not in self._pairs:
                raw = await self._kms.decrypt(record.sealed_key, context=join_key_context(record.id))
                pair = JoinKeyPair.from_private_bytes(raw)
                if pair.public_key_text() != record.public_key:
                    raise InvalidConfigError("a stored JoinService key does not match its public key")
                self._pairs[record.id] = pair
        records.sort(key=lambda r: (r.state != "active", -r.created_at.timestamp()))
        self._records = records
        self._read_at = self._timer()
        self._read_clock = self._clock.now()

    def pairs(self) -> list[JoinKeyPair]:
        """The keys that open sealed tokens now: the active one first, then previous ones whose overlap has not
        ended (as last read)."""
        now = self._clock.now()
        return [
            self._pairs[r.id]
            for r in self._records
            if r.state == "active" or (r.retire_after is not None and r.retire_after > now)
        ]

    def active_secret(self) -> bytes:
        """The active key's private bytes (the renewal challenges' MAC key is derived from them)."""
        pairs = self.pairs()
        if not pairs:
            raise FailedPreconditionError("JoinService has no key yet", details={"reason": "no_join_key"})
        return pairs[0].private_bytes()

    def secrets(self) -> list[bytes]:
        """Every key's private bytes, the active one first."""
        return [p.private_bytes() for p in self.pairs()]


async def rotate_join_key(store: Store, kms: Kms, *, overlap: dt.timedelta, clock: Clock) -> JoinKeyRecord:
    """Make a new active JoinService key; the one before opens what was sealed to it for ``overlap`` more.

    Raises:
        InvalidInputError: ``overlap`` is negative or longer than ``MAX_OVERLAP``.
    """
    if not dt.timedelta(0) <= overlap <= MAX_OVERLAP:
        raise InvalidInputError(
            f"overlap_seconds: from 0 to {int(MAX_OVERLAP.total_seconds())}", details={"path": "overlap_seconds"}
        )
    fresh = JoinKeyPair.generate()
    key_id = f"jk_{secrets.token_hex(8)}"
    sealed = await kms.encrypt(fresh.private_bytes(), context=join_key_context(key_id))  # before any transaction
    made = await store.repository(JOIN_KEYS).rotate(
        id=key_id, public_key=fresh.public_key_text(), sealed_key=sealed, retire_after=clock.now() + overlap
    )
    log.info("JoinService key %s made active", key_id)
    return made


async def retire_join_key(store: Store, key_id: str) -> JoinKeyRecord:
    """Retire a previous JoinService key at once (before its overlap ends).

    Raises:
        NotFoundError: no such key.
        FailedPreconditionError: it is the active key.
    """
    keys = {k.id: k for k in await store.repository(JOIN_KEYS).list()}
    key = keys.get(key_id)
    if key is None:
        raise NotFoundError("no such JoinService key", details={"key_id": key_id})
    if key.state == "active":
        raise FailedPreconditionError(
            "the active JoinService key cannot be retired; rotate first", details={"key_id": key_id}
        )
    retired = await store.repository(JOIN_KEYS).retire(key_id)
    return retired if retired is not None else key
