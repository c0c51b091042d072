"""``Reservations`` on the ``reservations`` table and the admission functions (made by the ``capacity`` module's
migrations, which the store keeps under that name).

``begin`` is transaction 1 as one statement: the pool check, the idempotency key's upsert (the same rules as
``PgIdempotencyKeys.begin``), the draft and its projection row, each a CTE that runs only when the one before allows.
``admit`` is transaction 2 as one call of ``bc_admit_reservation``, in autocommit (one round trip).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bettercompute.modules.reservations import AdmitOutcome, AdmitRequest, BeginOutcome, Draft, ReservationRecord
from bettercompute.ports import SINKS_POKE, WORK_CHANNEL
from bettercompute_store_pg._db import Database, dumps, utc
from bettercompute_store_pg._idempotency import KEY_UPSERT
from bettercompute_store_pg._notifier import channel_name
from bettercompute_store_pg._repository import PgRepository

__all__ = ["REPOSITORIES", "PgReservations"]

_COLUMNS = (
    "id, tenant, pool_id, state, gpus, constraints, start_at, end_at, labels, placement, generations, reason, history,"
    " created_by, created_at, updated_at"
)

# The key's branch is the idempotency table's upsert; with no key (NULL) it inserts nothing and ``k`` is empty.
_BEGIN = f"""
WITH pool AS (
    SELECT id FROM {{s}}.pools WHERE id = :pool_id AND tenant = ANY (CAST(:pool_tenants AS text[]))
), k AS (
    INSERT INTO {{s}}.idempotency_keys AS k (identity, key, request_hash, state, attempt, expires_at)
    SELECT :identity, :key, :request_hash, 'in_progress', :attempt, now() + :ttl
    WHERE CAST(:key AS text) IS NOT NULL AND EXISTS (SELECT 1 FROM pool)
    {KEY_UPSERT.strip()}
), d AS (
    INSERT INTO {{s}}.reservations (
        id, tenant, pool_id, state, gpus, constraints, start_at, end_at, labels, created_by, created_at, updated_at,
        draft_key
    )
    SELECT :id, :tenant, :pool_id, 'draft', :gpus, CAST(:constraints AS jsonb), :start_at, :end_at,
        CAST(:labels AS jsonb), :created_by, :now, :now,
        CASE WHEN CAST(:key AS text) IS NOT NULL
            THEN jsonb_build_object('identity', CAST(:identity AS text), 'key', CAST(:key AS text)) END
    FROM pool WHERE coalesce((SELECT won FROM k), true)
    RETURNING id
), p AS (
    INSERT INTO {{s}}.authz_resources (resource_type, resource_id, tenant_id, pool_id, owner)
    SELECT 'reservation', id, :tenant, :pool_id, :created_by FROM d
)
SELECT EXISTS (SELECT 1 FROM pool) AS pool, EXISTS (SELECT 1 FROM d) AS drafted,
    k.won, k.request_hash, k.state, k.result
FROM (SELECT 1) AS one LEFT JOIN k ON true
"""

_ABANDON = "SELECT {s}.bc_undo_draft(:id, :identity, :key)"
_ADMIT = "SELECT {s}.bc_admit_reservation(CAST(:p AS jsonb)) AS out"
_EXTEND = "SELECT {s}.bc_extend_reservation(:id, :end_at, :now) AS out"

_GET = f"SELECT {_COLUMNS} FROM {{s}}.reservations WHERE id = :id AND state <> 'draft'"
_GET_FOR_UPDATE = _GET + " FOR UPDATE"

_PAGE = f"""
SELECT {_COLUMNS} FROM {{s}}.reservations
WHERE tenant = :tenant AND state <> 'draft'
  AND (CAST(:state AS text) IS NULL OR state = :state)
  AND (CAST(:pool_id AS text) IS NULL OR pool_id = :pool_id)
  AND (CAST(:overlaps_start AS timestamptz) IS NULL OR end_at > :overlaps_start)
  AND (CAST(:overlaps_end AS timestamptz) IS NULL OR start_at < :overlaps_end)
  AND (CAST(:label AS jsonb) IS NULL OR labels @> CAST(:label AS jsonb))
  AND (CAST(:after_at AS timestamptz) IS NULL OR (created_at, id) < (:after_at, CAST(:after_id AS text)))
ORDER BY created_at DESC, id DESC
LIMIT :limit
"""

_ON_NODE = f"""
SELECT {_COLUMNS} FROM {{s}}.reservations
WHERE node_ids @> ARRAY[CAST(:node_id AS text)] AND state IN ('placed', 'bound', 'active') AND end_at > :at
ORDER BY start_at, id
"""

_TRANSITION = f"""
UPDATE {{s}}.reservations SET
    state = :state,
    reason = CASE WHEN :state = state THEN reason ELSE CAST(:reason AS text) END,
    history = CASE WHEN :state = state THEN history
        ELSE history || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
            'state', CAST(:state AS text), 'at', CAST(:at AS timestamptz), 'reason', CAST(:reason AS text)))) END,
    generations = coalesce(CAST(:generations AS jsonb), generations),
    end_at = coalesce(CAST(:end_at AS timestamptz), end_at),
    updated_at = :at
WHERE id = :id
RETURNING {_COLUMNS}
"""

# A booking not started by ``at`` goes (an empty range is not a booking), one running is cut at ``at``, and the
# reservation's holds on its atoms go (the placer's hints count them free again): ``bc_release`` (capacity v3).
_RELEASE = "SELECT {s}.bc_release(:id, :at) AS n"

_PLACE_PENDING = "SELECT {s}.bc_place_pending(:pool_id, :now, CAST(:horizon AS interval), :limit) AS out"

_DRAFTS = """
SELECT id FROM {s}.reservations WHERE state = 'draft' AND created_at < :before ORDER BY created_at LIMIT :limit
"""


def _when(value: Any) -> dt.datetime:
    return utc(value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value)))


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def record_of(row: Any) -> ReservationRecord:
    """A record from a row (or from ``to_jsonb`` of one, as the admission function returns it)."""
    values: Mapping[str, Any] = row if isinstance(row, Mapping) else row._asdict()

    def get(name: str) -> Any:
        return values[name]

    return ReservationRecord(
        id=get("id"),
        tenant=get("tenant"),
        pool_id=get("pool_id"),
        state=get("state"),
        gpus=int(get("gpus")),
        constraints=_json(get("constraints")) or {},
        start_at=_when(get("start_at")),
        end_at=_when(get("end_at")),
        labels=_json(get("labels")) or {},
        placement=_json(get("placement")) or {},
        generations={str(k): int(v) for k, v in (_json(get("generations")) or {}).items()},
        reason=get("reason"),
        history=list(_json(get("history")) or ()),
        created_by=get("created_by"),
        created_at=_when(get("created_at")),
        updated_at=_when(get("updated_at")),
    )


def outcome_of(out: Mapping[str, Any]) -> AdmitOutcome:
    """What the admission (or extension) function answered."""
    record = out.get("record")
    earliest = out.get("earliest_start")
    return AdmitOutcome(
        state=out["state"],
        record=record_of(record) if record is not None else None,
        excluded={str(k): int(v) for k, v in (out.get("excluded") or {}).items()},
        earliest_start=_when(earliest) if earliest is not None else None,
        detail=dict(out.get("detail") or {}),
    )


class PgReservations(PgRepository):
    """``Reservations`` on PostgreSQL."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._work_channel = channel_name(db.schema, WORK_CHANNEL)
        self._begin = db.sql(_BEGIN)
        self._abandon = db.sql(_ABANDON)
        self._admit = db.sql(_ADMIT)
        self._extend = db.sql(_EXTEND)
        self._get = db.sql(_GET)
        self._get_for_update = db.sql(_GET_FOR_UPDATE)
        self._page = db.sql(_PAGE)
        self._on_node = db.sql(_ON_NODE)
        self._transition = db.sql(_TRANSITION)
        self._release = db.sql(_RELEASE)
        self._drafts = db.sql(_DRAFTS)
        self._place_pending = db.sql(_PLACE_PENDING)

    async def begin(self, draft: Draft) -> BeginOutcome:
        """Transaction 1, one statement."""
        attempt = uuid.uuid4().hex
        params = {
            "id": draft.id,
            "tenant": draft.tenant,
            "pool_id": draft.pool_id,
            "pool_tenants": list(draft.pool_tenants),
            "gpus": draft.gpus,
            "constraints": dumps(dict(draft.constraints)),
            "start_at": draft.start_at,
            "end_at": draft.end_at,
            "labels": dumps(dict(draft.labels)),
            "created_by": draft.created_by,
            "now": draft.now,
            "identity": draft.created_by,
            "key": draft.idempotency_key,
            "request_hash": draft.request_hash or "",
            "attempt": attempt,
            "ttl": draft.ttl,
        }
        row = (await self._fetch(self._begin, params))[0]
        if not row.pool:
            return BeginOutcome(state="no_pool")
        if row.drafted:
            return BeginOutcome(state="drafted")
        if row.request_hash != draft.request_hash:
            return BeginOutcome(state="conflict")
        if row.state == "done":
            return BeginOutcome(state="replay", result=_json(row.result) or {})
        return BeginOutcome(state="in_progress")

    async def abandon(self, reservation_id: str, *, identity: str | None, key: str | None) -> None:
        """Undo a draft, one statement."""
        await self._fetch(self._abandon, {"id": reservation_id, "identity": identity, "key": key})

    async def admit(self, request: AdmitRequest) -> AdmitOutcome:
        """Transaction 2, one function call."""
        p = {
            "id": request.id,
            "share": request.share,
            "model": request.model,
            "min_memory_mib": request.min_memory_mib,
            "one_node": request.one_node,
            "nvlink": request.nvlink,
            "mig_profile": request.mig_profile,
            "now": request.now.isoformat(),
            "horizon": f"{int(request.horizon.total_seconds())} seconds",
            "actor": request.actor,
            "action": request.action,
            "decision_id": request.decision_id,
            "event_type": request.event_type,
            "work_kind": request.work.kind,
            "work_shard": request.work.shard,
            "work_key": request.work.key,
            "defer": request.defer,
            # The workers and sinks are poked inside the admission's own statement, as a transaction that enqueues
            # and publishes pokes them after its commit.
            "work_channel": self._work_channel,
            "sinks_poke": SINKS_POKE,
            "idempotency_identity": request.idempotency.identity if request.idempotency is not None else None,
            "idempotency_key": request.idempotency.key if request.idempotency is not None else None,
        }
        row = (await self._fetch(self._admit, {"p": dumps(p)}))[0]
        return outcome_of(_json(row.out))

    async def get(self, reservation_id: str) -> ReservationRecord | None:
        """One statement."""
        rows = await self._fetch(self._get, {"id": reservation_id})
        return record_of(rows[0]) if rows else None

    async def get_for_update(self, reservation_id: str) -> ReservationRecord | None:
        """One statement, in the bound transaction."""
        rows = await self._fetch_in_transaction("get_for_update", self._get_for_update, {"id": reservation_id})
        return record_of(rows[0]) if rows else None

    async def page(
        self,
        tenant: str,
        *,
        state: str | None,
        pool_id: str | None,
        overlaps_start: dt.datetime | None,
        overlaps_end: dt.datetime | None,
        label: tuple[str, str] | None,
        after: Sequence[Any] | None,
        limit: int,
    ) -> list[ReservationRecord]:
        """One statement."""
        params = {
            "tenant": tenant,
            "state": state,
            "pool_id": pool_id,
            "overlaps_start": overlaps_start,
            "overlaps_end": overlaps_end,
            "label": dumps({label[0]: label[1]}) if label is not None else None,
            "after_at": after[0] if after else None,
            "after_id": after[1] if after else None,
            "limit": limit,
        }
        return [record_of(r) for r in await self._fetch(self._page, params)]

    async def on_node(self, node_id: str, *, at: dt.datetime) -> list[ReservationRecord]:
        """One statement."""
        return [record_of(r) for r in await self._fetch(self._on_node, {"node_id": node_id, "at": at})]

    async def transition(
        self,
        record: ReservationRecord,
        *,
        state: str,
        at: dt.datetime,
        reason: str | None = None,
        generations: Mapping[str, int] | None = None,
        end_at: dt.datetime | None = None,
    ) -> ReservationRecord:
        """One statement, in the bound transaction."""
        params = {
            "id": record.id,
            "state": state,
            "at": at,
            "reason": reason,
            "generations": dumps(dict(generations)) if generations is not None else None,
            "end_at": end_at,
        }
        rows = await self._fetch_in_transaction("transition", self._transition, params)
        return record_of(rows[0])

    async def release(self, reservation_id: str, *, at: dt.datetime) -> int:
        """One statement, in the bound transaction."""
        rows = await self._fetch_in_transaction("release", self._release, {"id": reservation_id, "at": at})
        return int(rows[0].n)

    async def extend(self, reservation_id: str, *, end_at: dt.datetime, now: dt.datetime) -> AdmitOutcome:
        """One function call, in the bound transaction."""
        params = {"id": reservation_id, "end_at": end_at, "now": now}
        rows = await self._fetch_in_transaction("extend", self._extend, params)
        return outcome_of(_json(rows[0].out))

    async def place_pending(
        self, pool_id: str, *, now: dt.datetime, horizon: dt.timedelta, limit: int
    ) -> tuple[list[str], list[str], int]:
        """One function call, in autocommit."""
        params = {"pool_id": pool_id, "now": now, "horizon": f"{int(horizon.total_seconds())} seconds", "limit": limit}
        out = _json((await self._fetch(self._place_pending, params))[0].out)
        return list(out["placed"]), list(out["failed"]), int(out["left"])

    async def drafts_before(self, before: dt.datetime, *, limit: int) -> list[str]:
        """One statement."""
        return [r.id for r in await self._fetch(self._drafts, {"before": before, "limit": limit})]


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"reservations": PgReservations}
"""The adapters of this module's repositories, by ``Repository.name``."""
