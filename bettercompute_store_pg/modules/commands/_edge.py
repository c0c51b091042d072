"""``Edge`` on the gateway's functions (the commands module's fourth migration): each method is one call of one
``SECURITY DEFINER`` function in autocommit, then the store's pokes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from bettercompute.errors import InvalidInputError, NotFoundError
from bettercompute.modules.commands import CommandRecord, SignedAck
from bettercompute.modules.nodes import (
    ACKED_KIND,
    INVENTORY_KIND,
    LIFECYCLE_KIND,
    DesiredState,
    SignedFact,
    lifecycle_item,
)
from bettercompute_store_pg._db import Database, dumps, utc
from bettercompute_store_pg._desired import desired_state_of
from bettercompute_store_pg._repository import PokingRepository

from ._rows import command_of

__all__ = ["PgEdge"]

_OPEN = "SELECT {s}.bc_gw_session_open(:node_id, :gateway, :shard) AS epoch"
_CLOSE = "SELECT {s}.bc_gw_session_close(:node_id, :epoch, :gateway, :reason, :shard) AS current"
_SEEN = "SELECT id FROM {s}.bc_gw_seen(CAST(:node_ids AS text[]), CAST(:epochs AS bigint[]), :gateway) AS id"
_OBSERVE = """
SELECT id FROM {s}.bc_gw_observe(CAST(:node_ids AS text[]), CAST(:generations AS bigint[]),
    CAST(:epochs AS bigint[]), CAST(:signatures AS bytea[]), CAST(:serials AS text[]), CAST(:keys AS bytea[]),
    CAST(:shards AS integer[])) AS id
"""
_INVENTORY = """
SELECT {s}.bc_gw_inventory(:node_id, :section, :content_json, :fake, :epoch, :signature, :serial, :key, :shard) AS kept
"""
_EVENT = "SELECT {s}.bc_gw_event(:node_id, :type, CAST(:payload AS jsonb), :at_ms) AS kept"
_DISPATCH = "SELECT * FROM {s}.bc_gw_dispatch(CAST(:node_ids AS text[]), CAST(:epochs AS bigint[]), :limit)"
_FINISH = """
SELECT * FROM {s}.bc_gw_finish(:id, :epoch, :state, :result_json, :reason, :signature, :serial, :key)
"""
_DESIRED_NEWER = """
SELECT * FROM {s}.bc_gw_desired_newer(CAST(:node_ids AS text[]), CAST(:generations AS bigint[]), :gateway)
"""
_DESIRED_SINCE = "SELECT * FROM {s}.bc_gw_desired_since(:since, :gateway)"
_REVOKED = "SELECT serial FROM {s}.bc_gw_revoked(CAST(:serials AS text[])) AS serial"
_SIGNERS = "SELECT * FROM {s}.bc_gw_signers()"


def _shard(node_id: str) -> int:
    return lifecycle_item(node_id).shard  # every item keyed by a node id takes the same shard


class PgEdge(PokingRepository):
    """``Edge``: the gateway's door, one function call per method."""

    def __init__(self, db: Database, *, gateway: str | None = None) -> None:
        super().__init__(db)
        self._open = db.sql(_OPEN)
        self._close = db.sql(_CLOSE)
        self._seen = db.sql(_SEEN)
        self._observe = db.sql(_OBSERVE)
        self._inventory = db.sql(_INVENTORY)
        self._event = db.sql(_EVENT)
        self._dispatch = db.sql(_DISPATCH)
        self._finish = db.sql(_FINISH)
        self._desired_newer = db.sql(_DESIRED_NEWER)
        self._desired_since = db.sql(_DESIRED_SINCE)
        self._revoked = db.sql(_REVOKED)
        self._signers = db.sql(_SIGNERS)

    async def open_session(self, *, node_id: str, gateway: str) -> int:
        """Open the node's next session (``Edge.open_session``)."""
        rows = await self._fetch(self._open, {"node_id": node_id, "gateway": gateway, "shard": _shard(node_id)})
        if rows[0].epoch is None:
            raise NotFoundError("no such live node", details={"node_id": node_id})
        await self._poke(frozenset({LIFECYCLE_KIND}), True)
        return int(rows[0].epoch)

    async def close_session(self, *, node_id: str, epoch: int, gateway: str, reason: str) -> bool:
        """End a session (``Edge.close_session``)."""
        params = {"node_id": node_id, "epoch": epoch, "gateway": gateway, "reason": reason, "shard": _shard(node_id)}
        current = bool((await self._fetch(self._close, params))[0].current)
        await self._poke(frozenset({LIFECYCLE_KIND}) if current else frozenset(), current or reason == "superseded")
        return current

    async def seen(self, alive: Sequence[tuple[str, int]], *, gateway: str) -> list[str]:
        """Mark sessions seen (``Edge.seen``)."""
        if not alive:
            return []
        params = {"node_ids": [a[0] for a in alive], "epochs": [a[1] for a in alive], "gateway": gateway}
        return [r.id for r in await self._fetch(self._seen, params)]

    async def observe(self, acks: Sequence[SignedAck]) -> list[str]:
        """Record acknowledgements (``Edge.observe``)."""
        if not acks:
            return []
        params = {
            "node_ids": [a.node_id for a in acks],
            "generations": [a.generation for a in acks],
            "epochs": [a.epoch for a in acks],
            "signatures": [a.signed.signature for a in acks],
            "serials": [a.signed.serial for a in acks],
            "keys": [a.signed.key for a in acks],
            "shards": [_shard(a.node_id) for a in acks],
        }
        moved = [r.id for r in await self._fetch(self._observe, params)]
        if moved:
            await self._poke(frozenset({ACKED_KIND}), False)
        return moved

    async def record_inventory(
        self, node_id: str, section: str, content_json: str, *, fake: bool, epoch: int, signed: SignedFact
    ) -> bool:
        """Keep an inventory section (``Edge.record_inventory``)."""
        params = {
            "node_id": node_id,
            "section": section,
            "content_json": content_json,
            "fake": fake,
            "epoch": epoch,
            "signature": signed.signature,
            "serial": signed.serial,
            "key": signed.key,
            "shard": _shard(node_id),
        }
        kept = bool((await self._fetch(self._inventory, params))[0].kept)
        if kept:
            await self._poke(frozenset({INVENTORY_KIND}), True)
        return kept

    async def report_event(self, node_id: str, *, type: str, payload: Mapping[str, Any], at_ms: int) -> None:
        """Publish a daemon's event (``Edge.report_event``)."""
        params = {"node_id": node_id, "type": type, "payload": dumps(dict(payload)), "at_ms": at_ms}
        if (await self._fetch(self._event, params))[0].kept:
            await self._poke(frozenset(), True)

    async def dispatch(self, sessions: Sequence[tuple[str, int]], *, limit: int) -> list[CommandRecord]:
        """Take pending commands (``Edge.dispatch``)."""
        if not sessions:
            return []
        params = {"node_ids": [s[0] for s in sessions], "epochs": [s[1] for s in sessions], "limit": limit}
        rows = await self._fetch(self._dispatch, params)
        return sorted((command_of(r) for r in rows), key=lambda c: (c.created_at, c.id))

    async def finish(
        self, *, id: str, epoch: int, state: str, result_json: str, reason: str | None, signed: SignedFact
    ) -> CommandRecord | None:
        """Record a command's outcome (``Edge.finish``)."""
        if state not in ("succeeded", "failed"):
            raise InvalidInputError("a command finishes as succeeded or failed")
        params = {
            "id": id,
            "epoch": epoch,
            "state": state,
            "result_json": result_json,
            "reason": reason,
            "signature": signed.signature,
            "serial": signed.serial,
            "key": signed.key,
        }
        rows = await self._fetch(self._finish, params)
        if not rows:
            return None
        finished = command_of(rows[0])
        if finished.wake is not None:
            await self._poke(frozenset({finished.wake.kind}), False)
        return finished

    async def desired_newer(self, known: Sequence[tuple[str, int]], *, gateway: str) -> list[DesiredState]:
        """Desired states beyond the known generations (``Edge.desired_newer``)."""
        if not known:
            return []
        params = {"node_ids": [k[0] for k in known], "generations": [k[1] for k in known], "gateway": gateway}
        return [desired_state_of(r) for r in await self._fetch(self._desired_newer, params)]

    async def desired_since(self, since: dt.datetime, *, gateway: str) -> tuple[list[DesiredState], dt.datetime]:
        """Desired states changed after ``since`` (``Edge.desired_since``)."""
        rows = await self._fetch(self._desired_since, {"since": since, "gateway": gateway})
        return [desired_state_of(r) for r in rows if r.id is not None], utc(rows[0].at)

    async def revoked_among(self, serials: Sequence[str]) -> set[str]:
        """Revoked serials among these (``Edge.revoked_among``)."""
        if not serials:
            return set()
        return {r.serial for r in await self._fetch(self._revoked, {"serials": list(serials)})}

    async def signers(self) -> dict[str, bytes]:
        """The certificates of the instruction-signing keys not retired, by key id (``Edge.signers``)."""
        return {r.id: bytes(r.certificate_der) for r in await self._fetch(self._signers, {})}
