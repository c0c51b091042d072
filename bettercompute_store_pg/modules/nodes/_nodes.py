"""Nodes and JoinService's keys (``Nodes`` and ``JoinKeys``).

``enroll`` is one statement: it locks the pool's live node with the hardware key, if there is one, and either takes
it back (reclaim) or reports it; otherwise it inserts the new node. The partial unique index on ``(pool_id,
hardware_key)`` of live nodes makes the loser of two concurrent first enrollments of one machine a unique violation,
which the store boundary turns into ``ConflictError``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from bettercompute.errors import InternalError
from bettercompute.modules.nodes import (
    ConditionRecord,
    DesiredState,
    Enrollment,
    InventoryRecord,
    JoinKeyRecord,
    NodeRecord,
    SignedFact,
)
from bettercompute_store_pg._db import Database, dumps, utc
from bettercompute_store_pg._desired import desired_state_of
from bettercompute_store_pg._repository import PgRepository

__all__ = ["PgJoinKeys", "PgNodes"]

_COLUMNS = (
    "id, tenant, pool_id, site_id, state, hardware_key, claims, attestation, join_token_id, enrollments, "
    "session_epoch, desired_generation, observed_generation, last_seen_at, joined_at, created_at, updated_at, "
    "retired_at, state_reason, state_detail, state_changed_at, cordoned, draining, acceptance, unreachable_since, "
    "observed_epoch, observed_signature, observed_serial, observed_key, observed_checked"
)
_N_COLUMNS = ", ".join(f"n.{c.strip()}" for c in _COLUMNS.split(","))

_ENROLL = f"""
WITH live AS (
    SELECT id FROM {{s}}.nodes
    WHERE pool_id = :pool_id AND hardware_key = :hardware_key AND state <> 'retired'
    FOR UPDATE
),
reclaimed AS (
    UPDATE {{s}}.nodes AS n SET state = 'adopting', claims = CAST(:claims AS jsonb),
        attestation = CAST(:attestation AS jsonb), join_token_id = :join_token_id, enrollments = n.enrollments + 1,
        joined_at = now(), updated_at = now(), state_reason = NULL, state_detail = '{{}}', acceptance = '{{}}',
        unreachable_since = NULL,
        state_changed_at = CASE WHEN n.state <> 'adopting' THEN now() ELSE n.state_changed_at END
    FROM live WHERE n.id = live.id AND :reclaim
    RETURNING {_N_COLUMNS}
),
created AS (
    INSERT INTO {{s}}.nodes (id, tenant, pool_id, state, hardware_key, claims, attestation, join_token_id)
    SELECT :new_id, :tenant, :pool_id, 'adopting', :hardware_key, CAST(:claims AS jsonb),
        CAST(:attestation AS jsonb), :join_token_id
    WHERE NOT EXISTS (SELECT 1 FROM live)
    RETURNING {_COLUMNS}
)
SELECT 'reclaimed' AS outcome, * FROM reclaimed
UNION ALL SELECT 'created', * FROM created
UNION ALL SELECT 'conflict', {_N_COLUMNS} FROM {{s}}.nodes AS n JOIN live ON n.id = live.id WHERE NOT :reclaim
"""

_GET = f"SELECT {_COLUMNS} FROM {{s}}.nodes WHERE id = :id"
_GET_LOCKED = f"SELECT {_COLUMNS} FROM {{s}}.nodes WHERE id = :id FOR SHARE"
_GET_FOR_UPDATE = f"SELECT {_COLUMNS} FROM {{s}}.nodes WHERE id = :id FOR UPDATE"
_SAVE_LIFECYCLE = f"""
UPDATE {{s}}.nodes SET state = :state, state_reason = :state_reason, state_detail = CAST(:state_detail AS jsonb),
    state_changed_at = CASE WHEN state <> :state THEN now() ELSE state_changed_at END,
    cordoned = :cordoned, draining = :draining, acceptance = CAST(:acceptance AS jsonb),
    unreachable_since = :unreachable_since, updated_at = now()
WHERE id = :id AND state <> 'retired' AND :state <> 'retired'
RETURNING {_COLUMNS}
"""
_FOR_POOL = f"SELECT {_COLUMNS} FROM {{s}}.nodes WHERE pool_id = :pool_id ORDER BY created_at, id LIMIT 10000"
_FOR_TENANT = f"""
SELECT {_COLUMNS} FROM {{s}}.nodes
WHERE tenant = :tenant AND (CAST(:pool_id AS text) IS NULL OR pool_id = :pool_id)
    AND (CAST(:after_at AS timestamptz) IS NULL OR (created_at, id) > (:after_at, :after_id))
ORDER BY created_at, id LIMIT :limit
"""
_RETIRE = f"""
UPDATE {{s}}.nodes SET state = 'retired', retired_at = coalesce(retired_at, now()), updated_at = now()
WHERE id = :id RETURNING {_COLUMNS}
"""

# A change of desired state is dated by the clock at the statement (``desired_at``), which gateways read back by;
# the partial index keeps that read to the nodes that were ever given one.
_SET_DESIRED = """
UPDATE {s}.nodes SET desired_state = CAST(CAST(:content AS text) AS jsonb), desired_generation = :generation,
    desired_text = CAST(:content AS text), desired_signature = :signature, desired_signer = :signer,
    desired_at = clock_timestamp(), updated_at = now()
WHERE id = :id AND state <> 'retired' AND desired_generation = :generation - 1
RETURNING id
"""
_SIGNED_BY = """
SELECT id, desired_generation, desired_state, desired_text, desired_signature, desired_signer FROM {s}.nodes
WHERE desired_signer = :signer ORDER BY id LIMIT :limit FOR UPDATE
"""
_RESIGN_DESIRED = """
UPDATE {s}.nodes SET desired_signature = :signature, desired_signer = :signer
WHERE id = :id AND desired_generation = :generation AND desired_text IS NOT DISTINCT FROM CAST(:content AS text)
RETURNING id
"""
_DESIRED_NEWER = """
SELECT n.id, n.desired_generation, n.desired_state, n.desired_text, n.desired_signature, n.desired_signer
FROM unnest(CAST(:node_ids AS text[]), CAST(:generations AS bigint[])) AS k (node_id, generation)
JOIN {s}.nodes AS n ON n.id = k.node_id
WHERE n.desired_generation > k.generation
"""
# Written by the control plane itself, not by a node: no signature, so unchecked (and refused once checked).
_RECORD_INVENTORY = """
INSERT INTO {s}.node_inventory AS i (node_id, section, content, fake, received_at)
SELECT id, :section, CAST(:content AS jsonb), :fake, now() FROM {s}.nodes WHERE id = :node_id AND state <> 'retired'
ON CONFLICT (node_id, section) DO UPDATE
    SET content = EXCLUDED.content, fake = EXCLUDED.fake, received_at = EXCLUDED.received_at, content_json = NULL,
        epoch = NULL, signature = NULL, signer_serial = NULL, signer_key = NULL, checked = NULL
RETURNING node_id
"""
_INVENTORY = """
SELECT node_id, section, content, fake, received_at, content_json, epoch, signature, signer_serial, signer_key, checked
FROM {s}.node_inventory WHERE node_id = :node_id ORDER BY section
"""
_CHECK_OBSERVED = """
UPDATE {s}.nodes SET observed_checked = :verdict
WHERE id = :node_id AND observed_generation = :generation AND observed_checked IS NULL
RETURNING id
"""
_CHECK_INVENTORY = """
UPDATE {s}.node_inventory SET checked = :verdict
WHERE node_id = :node_id AND section = :section AND received_at = :received_at AND checked IS NULL
RETURNING node_id
"""

_KEY_COLUMNS = "id, public_key, sealed_key, state, created_at, retire_after"
_ACTIVE_KEY = f"SELECT {_KEY_COLUMNS} FROM {{s}}.join_keys WHERE state = 'active'"
_ALL_KEYS = f"SELECT {_KEY_COLUMNS} FROM {{s}}.join_keys ORDER BY created_at, id"
_ROTATE_KEY = f"""
WITH old AS (
    UPDATE {{s}}.join_keys SET state = 'previous', retire_after = :retire_after WHERE state = 'active' RETURNING id
)
INSERT INTO {{s}}.join_keys (id, public_key, sealed_key, state)
SELECT :id, :public_key, :sealed_key, 'active' FROM (SELECT count(*) FROM old) AS moved
RETURNING {_KEY_COLUMNS}
"""
_RETIRE_KEY = f"""
UPDATE {{s}}.join_keys SET state = 'retired', retire_after = least(coalesce(retire_after, now()), now())
WHERE id = :id AND state <> 'active' RETURNING {_KEY_COLUMNS}
"""
# Insert unless an active key exists (the partial unique index settles a race); then read the active key.
_CREATE_KEY = f"""
WITH ins AS (
    INSERT INTO {{s}}.join_keys (id, public_key, sealed_key, state) VALUES (:id, :public_key, :sealed_key, 'active')
    ON CONFLICT DO NOTHING
    RETURNING {_KEY_COLUMNS}
)
SELECT * FROM ins
UNION ALL SELECT {_KEY_COLUMNS} FROM {{s}}.join_keys WHERE state = 'active' AND NOT EXISTS (SELECT 1 FROM ins)
"""


def _node(row: Any) -> NodeRecord:
    return NodeRecord(
        id=row.id,
        tenant=row.tenant,
        pool_id=row.pool_id,
        site_id=row.site_id,
        state=row.state,
        hardware_key=row.hardware_key,
        claims=dict(row.claims),
        attestation=dict(row.attestation),
        join_token_id=row.join_token_id,
        enrollments=row.enrollments,
        session_epoch=row.session_epoch,
        desired_generation=row.desired_generation,
        observed_generation=row.observed_generation,
        last_seen_at=utc(row.last_seen_at) if row.last_seen_at is not None else None,
        joined_at=utc(row.joined_at),
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
        retired_at=utc(row.retired_at) if row.retired_at is not None else None,
        state_reason=row.state_reason,
        state_detail=dict(row.state_detail),
        state_changed_at=utc(row.state_changed_at) if row.state_changed_at is not None else None,
        cordoned=row.cordoned,
        draining=row.draining,
        acceptance=dict(row.acceptance),
        unreachable_since=utc(row.unreachable_since) if row.unreachable_since is not None else None,
        observed_epoch=row.observed_epoch,
        observed_signed=SignedFact(
            signature=bytes(row.observed_signature), serial=row.observed_serial, key=bytes(row.observed_key)
        )
        if row.observed_signature is not None and row.observed_serial is not None and row.observed_key is not None
        else None,
        observed_checked=row.observed_checked,
    )


_CONDITION_COLUMNS = "node_id, type, status, reason, message, last_transition_at, updated_at"
_CONDITIONS = f"""
SELECT {_CONDITION_COLUMNS} FROM {{s}}.node_conditions WHERE node_id = ANY(CAST(:node_ids AS text[]))
ORDER BY node_id, type
"""
_SAVE_CONDITIONS = """
WITH r AS (
    SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r (type text, status text, reason text, message text)
),
before AS (SELECT type, status FROM {s}.node_conditions WHERE node_id = :node_id),
saved AS (
    INSERT INTO {s}.node_conditions AS c (node_id, type, status, reason, message, last_transition_at, updated_at)
    SELECT :node_id, r.type, r.status, r.reason, r.message, now(), now() FROM r
    ON CONFLICT (node_id, type) DO UPDATE SET status = EXCLUDED.status, reason = EXCLUDED.reason,
        message = EXCLUDED.message, updated_at = now(),
        last_transition_at = CASE WHEN c.status <> EXCLUDED.status THEN now() ELSE c.last_transition_at END
    RETURNING c.type, c.status
)
SELECT saved.type FROM saved LEFT JOIN before ON before.type = saved.type
WHERE before.status IS DISTINCT FROM saved.status ORDER BY saved.type
"""


def _maybe_utc(value: dt.datetime | None) -> dt.datetime | None:
    return utc(value) if value is not None else None


def _condition(row: Any) -> ConditionRecord:
    return ConditionRecord(
        type=row.type,
        status=row.status,
        reason=row.reason,
        message=row.message,
        last_transition_at=_maybe_utc(row.last_transition_at),
        updated_at=_maybe_utc(row.updated_at),
    )


class PgNodes(PgRepository):
    """``Nodes`` on the ``nodes`` and ``node_conditions`` tables."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._enroll = db.sql(_ENROLL)
        self._get = db.sql(_GET)
        self._get_locked = db.sql(_GET_LOCKED)
        self._get_for_update = db.sql(_GET_FOR_UPDATE)
        self._save_lifecycle = db.sql(_SAVE_LIFECYCLE)
        self._for_pool = db.sql(_FOR_POOL)
        self._for_tenant = db.sql(_FOR_TENANT)
        self._retire = db.sql(_RETIRE)
        self._set_desired = db.sql(_SET_DESIRED)
        self._signed_by = db.sql(_SIGNED_BY)
        self._resign_desired = db.sql(_RESIGN_DESIRED)
        self._desired_newer = db.sql(_DESIRED_NEWER)
        self._record_inventory = db.sql(_RECORD_INVENTORY)
        self._inventory = db.sql(_INVENTORY)
        self._check_inventory = db.sql(_CHECK_INVENTORY)
        self._check_observed = db.sql(_CHECK_OBSERVED)
        self._conditions = db.sql(_CONDITIONS)
        self._save_conditions = db.sql(_SAVE_CONDITIONS)

    async def enroll(
        self,
        *,
        new_id: str,
        pool_id: str,
        tenant: str,
        hardware_key: str,
        claims: Mapping[str, Any],
        attestation: Mapping[str, Any],
        join_token_id: str,
        reclaim: bool,
    ) -> Enrollment:
        """Create the node, or take back (or report) the pool's live node with this hardware key."""
        params = {
            "new_id": new_id,
            "pool_id": pool_id,
            "tenant": tenant,
            "hardware_key": hardware_key,
            "claims": dumps(dict(claims)),
            "attestation": dumps(dict(attestation)),
            "join_token_id": join_token_id,
            "reclaim": reclaim,
        }
        rows = await self._fetch_in_transaction("enroll", self._enroll, params)
        if not rows:  # pragma: no cover - one of the three branches always answers
            raise InternalError("enrolling a node gave no answer")
        return Enrollment(outcome=rows[0].outcome, node=_node(rows[0]))

    async def get(self, id: str, *, lock: bool = False) -> NodeRecord | None:
        """A node by id (share-locked until the transaction ends with ``lock``, which needs a transaction)."""
        if lock:
            rows = await self._fetch_in_transaction("get(lock=True)", self._get_locked, {"id": id})
        else:
            rows = await self._fetch(self._get, {"id": id})
        return _node(rows[0]) if rows else None

    async def get_for_update(self, id: str) -> NodeRecord | None:
        """A node by id, its row locked for update (in the caller's transaction)."""
        rows = await self._fetch_in_transaction("get_for_update", self._get_for_update, {"id": id})
        return _node(rows[0]) if rows else None

    async def save_lifecycle(self, node: NodeRecord) -> NodeRecord | None:
        """Write the node's lifecycle fields (in the caller's transaction)."""
        params = {
            "id": node.id,
            "state": node.state,
            "state_reason": node.state_reason,
            "state_detail": dumps(dict(node.state_detail)),
            "cordoned": node.cordoned,
            "draining": node.draining,
            "acceptance": dumps(dict(node.acceptance)),
            "unreachable_since": node.unreachable_since,
        }
        rows = await self._fetch_in_transaction("save_lifecycle", self._save_lifecycle, params)
        return _node(rows[0]) if rows else None

    async def for_pool(self, pool_id: str) -> list[NodeRecord]:
        """The pool's nodes, oldest first."""
        return [_node(r) for r in await self._fetch(self._for_pool, {"pool_id": pool_id})]

    async def for_tenant(
        self, tenant: str, *, pool_id: str | None = None, after: Sequence[Any] | None, limit: int
    ) -> list[NodeRecord]:
        """The tenant's nodes (of one pool) in ``(created_at, id)`` order, after ``after``, in one statement."""
        after_at, after_id = after if after is not None else (None, None)
        params = {"tenant": tenant, "pool_id": pool_id, "after_at": after_at, "after_id": after_id, "limit": limit}
        rows = await self._fetch(self._for_tenant, params)
        return [_node(r) for r in rows]

    async def retire(self, id: str) -> NodeRecord | None:
        """Retire a node (idempotent)."""
        rows = await self._fetch_in_transaction("retire", self._retire, {"id": id})
        return _node(rows[0]) if rows else None

    async def set_desired(self, desired: DesiredState) -> bool:
        """Replace the node's desired state if ``desired`` is its next generation (in the caller's transaction)."""
        params = {
            "id": desired.node_id,
            "generation": desired.generation,
            "content": desired.text if desired.text is not None else dumps(dict(desired.content)),
            "signature": desired.instruction.signature if desired.instruction is not None else None,
            "signer": desired.instruction.signer if desired.instruction is not None else None,
        }
        return bool(await self._fetch_in_transaction("set_desired", self._set_desired, params))

    async def signed_by(self, signer: str, *, limit: int) -> list[DesiredState]:
        """Desired states signed by ``signer``, locked (in the caller's transaction)."""
        params = {"signer": signer, "limit": limit}
        return [desired_state_of(r) for r in await self._fetch_in_transaction("signed_by", self._signed_by, params)]

    async def resign_desired(self, desired: DesiredState) -> bool:
        """Replace the signature of a desired state (in the caller's transaction)."""
        if desired.instruction is None:
            raise InternalError("a desired state is signed again with a signature")
        params = {
            "id": desired.node_id,
            "generation": desired.generation,
            "content": desired.text,
            "signature": desired.instruction.signature,
            "signer": desired.instruction.signer,
        }
        return bool(await self._fetch_in_transaction("resign_desired", self._resign_desired, params))

    async def desired_newer(self, known: Sequence[tuple[str, int]]) -> list[DesiredState]:
        """The nodes whose desired generation is beyond the one given for them, in one statement."""
        if not known:
            return []
        params = {"node_ids": [k[0] for k in known], "generations": [k[1] for k in known]}
        return [desired_state_of(r) for r in await self._fetch(self._desired_newer, params)]

    async def record_inventory(self, node_id: str, section: str, content: Any, *, fake: bool) -> bool:
        """Keep the latest content of one section (in the caller's transaction)."""
        params = {"node_id": node_id, "section": section, "content": dumps(content), "fake": fake}
        return bool(await self._fetch_in_transaction("record_inventory", self._record_inventory, params))

    async def inventory(self, node_id: str) -> list[InventoryRecord]:
        """The node's latest sections."""
        rows = await self._fetch(self._inventory, {"node_id": node_id})
        return [
            InventoryRecord(
                node_id=r.node_id,
                section=r.section,
                content=r.content,
                fake=r.fake,
                received_at=utc(r.received_at),
                content_json=r.content_json,
                epoch=r.epoch,
                signed=SignedFact(signature=bytes(r.signature), serial=r.signer_serial, key=bytes(r.signer_key))
                if r.signature is not None and r.signer_serial is not None and r.signer_key is not None
                else None,
                checked=r.checked,
            )
            for r in rows
        ]

    async def check_observed(self, node_id: str, *, generation: int, verdict: str) -> bool:
        """Note an acknowledgement's signature check (``Nodes.check_observed``)."""
        params = {"node_id": node_id, "generation": generation, "verdict": verdict}
        return bool(await self._fetch(self._check_observed, params))

    async def check_inventory(self, node_id: str, section: str, *, received_at: dt.datetime, verdict: str) -> bool:
        """Note a section's signature check (``Nodes.check_inventory``)."""
        params = {"node_id": node_id, "section": section, "received_at": received_at, "verdict": verdict}
        return bool(await self._fetch(self._check_inventory, params))

    async def conditions(self, node_ids: Sequence[str]) -> dict[str, list[ConditionRecord]]:
        """The conditions of these nodes."""
        found: dict[str, list[ConditionRecord]] = {n: [] for n in node_ids}
        if not node_ids:
            return found
        for row in await self._fetch(self._conditions, {"node_ids": list(node_ids)}):
            found.setdefault(row.node_id, []).append(_condition(row))
        return found

    async def save_conditions(self, node_id: str, conditions: Sequence[ConditionRecord]) -> list[str]:
        """Upsert the node's conditions (in the caller's transaction); the types whose status changed."""
        if not conditions:
            return []
        rows = [{"type": c.type, "status": c.status, "reason": c.reason, "message": c.message} for c in conditions]
        params = {"node_id": node_id, "rows": dumps(rows)}
        return [r.type for r in await self._fetch_in_transaction("save_conditions", self._save_conditions, params)]


def _key(row: Any) -> JoinKeyRecord:
    return JoinKeyRecord(
        id=row.id,
        public_key=row.public_key,
        sealed_key=bytes(row.sealed_key),
        state=row.state,
        created_at=utc(row.created_at),
        retire_after=utc(row.retire_after) if row.retire_after is not None else None,
    )


class PgJoinKeys(PgRepository):
    """``JoinKeys`` on the ``join_keys`` table."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._active = db.sql(_ACTIVE_KEY)
        self._all = db.sql(_ALL_KEYS)
        self._create = db.sql(_CREATE_KEY)
        self._rotate = db.sql(_ROTATE_KEY)
        self._retire = db.sql(_RETIRE_KEY)

    async def rotate(self, *, id: str, public_key: str, sealed_key: bytes, retire_after: dt.datetime) -> JoinKeyRecord:
        """Make this key the active one; the one before is previous until ``retire_after``."""
        params = {"id": id, "public_key": public_key, "sealed_key": sealed_key, "retire_after": retire_after}
        return _key((await self._fetch(self._rotate, params))[0])

    async def retire(self, id: str) -> JoinKeyRecord | None:
        """Retire a key that is not the active one."""
        rows = await self._fetch(self._retire, {"id": id})
        return _key(rows[0]) if rows else None

    async def list(self) -> list[JoinKeyRecord]:
        """Every key, oldest first."""
        return [_key(r) for r in await self._fetch(self._all, {})]

    async def active(self) -> JoinKeyRecord | None:
        """The active key, if any."""
        rows = await self._fetch(self._active, {})
        return _key(rows[0]) if rows else None

    async def create_if_none(self, *, id: str, public_key: str, sealed_key: bytes) -> JoinKeyRecord:
        """Store this key as the active one unless one exists; the active key either way."""
        rows = await self._fetch(self._create, {"id": id, "public_key": public_key, "sealed_key": sealed_key})
        if not rows:  # pragma: no cover - the insert or the existing row always answers
            raise InternalError("no active join key after creating one")
        return _key(rows[0])
