"""The ``inventory`` module's repository: devices and atoms (``Inventory``); each write is one statement over a JSON
array of rows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bettercompute.modules.inventory import AtomRecord, DeviceRecord, GpuOwner
from bettercompute_store_pg._db import Database, dumps, utc
from bettercompute_store_pg._repository import PgRepository

__all__ = ["REPOSITORIES", "PgInventory"]

_DEVICE_COLUMNS = (
    "id, node_id, tenant, pool_id, kind, ident, slot, model, details, state, first_seen_at, updated_at, missing_since"
)
_DEVICES = f"SELECT {_DEVICE_COLUMNS} FROM {{s}}.devices WHERE node_id = :node_id ORDER BY kind, ident"
_DEVICE = f"SELECT {_DEVICE_COLUMNS} FROM {{s}}.devices WHERE id = :id"
_DEVICES_PAGE = f"""
SELECT {_DEVICE_COLUMNS} FROM {{s}}.devices
WHERE tenant = :tenant AND (CAST(:node_id AS text) IS NULL OR node_id = :node_id)
    AND (CAST(:kind AS text) IS NULL OR kind = :kind)
    AND (CAST(:after_node AS text) IS NULL OR (node_id, kind, ident) > (:after_node, :after_kind, :after_ident))
ORDER BY node_id, kind, ident LIMIT :limit
"""
_GPU_OWNERS = """
SELECT d.ident, d.node_id, d.tenant = :tenant AS same_tenant,
    EXISTS (
        SELECT 1 FROM jsonb_each_text(n.attestation) AS a (k, v)
        WHERE right(a.k, 10) = '.gpu_uuids' AND a.k NOT IN ('claims.gpu_uuids', '.gpu_uuids')
          AND d.ident = ANY(string_to_array(a.v, ','))
    ) AS attested
FROM {s}.devices AS d JOIN {s}.nodes AS n ON n.id = d.node_id
WHERE d.kind = 'gpu' AND d.state = 'present' AND d.ident = ANY(CAST(:idents AS text[])) AND d.node_id <> :besides
    AND n.state <> 'retired'
"""
_DISPLACE = """
UPDATE {s}.devices AS d SET state = 'conflict', details = d.details || CAST(x.details AS jsonb), updated_at = now()
FROM unnest(CAST(:node_ids AS text[]), CAST(:idents AS text[]), CAST(:details AS text[])) AS x (node_id, ident, details)
WHERE d.node_id = x.node_id AND d.kind = 'gpu' AND d.ident = x.ident AND d.state = 'present'
"""
_RELEASE_RETIRED = """
UPDATE {s}.devices AS d SET state = 'missing', missing_since = now(), updated_at = now()
FROM {s}.nodes AS n
WHERE n.id = d.node_id AND n.state = 'retired' AND d.kind = 'gpu' AND d.state = 'present'
    AND d.ident = ANY(CAST(:idents AS text[]))
"""
# A device that goes missing keeps the time it first went missing; one that comes back clears it.
_SAVE_DEVICES = """
INSERT INTO {s}.devices AS d (id, node_id, tenant, pool_id, kind, ident, slot, model, details, state, missing_since)
SELECT r.id, r.node_id, r.tenant, r.pool_id, r.kind, r.ident, r.slot, r.model, coalesce(r.details, '{}'), r.state,
    CASE WHEN r.state = 'missing' THEN now() END
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r (
    id text, node_id text, tenant text, pool_id text, kind text, ident text, slot text, model text, details jsonb,
    state text)
ON CONFLICT (node_id, kind, ident) DO UPDATE SET slot = EXCLUDED.slot, model = EXCLUDED.model,
    details = EXCLUDED.details, state = EXCLUDED.state, updated_at = now(),
    missing_since = CASE WHEN EXCLUDED.state = 'missing' THEN coalesce(d.missing_since, now()) END
"""


_ATOM_COLUMNS = (
    "id, node_id, device_id, tenant, pool_id, kind, ident, model, profile, memory_mib, state, reason, created_at, "
    "updated_at"
)
_ATOMS = f"SELECT {_ATOM_COLUMNS} FROM {{s}}.atoms WHERE node_id = :node_id ORDER BY ident"
_ATOMS_OF_DEVICES = f"""
SELECT {_ATOM_COLUMNS} FROM {{s}}.atoms WHERE device_id = ANY(CAST(:device_ids AS text[])) ORDER BY device_id, ident
"""
_SAVE_ATOMS = """
INSERT INTO {s}.atoms AS a (id, node_id, device_id, tenant, pool_id, kind, ident, model, profile, memory_mib, state,
    reason)
SELECT r.id, r.node_id, r.device_id, r.tenant, r.pool_id, r.kind, r.ident, r.model, r.profile, r.memory_mib, r.state,
    r.reason
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r (
    id text, node_id text, device_id text, tenant text, pool_id text, kind text, ident text, model text,
    profile text, memory_mib bigint, state text, reason text)
ON CONFLICT (node_id, ident) DO UPDATE SET device_id = EXCLUDED.device_id, model = EXCLUDED.model,
    profile = EXCLUDED.profile, memory_mib = EXCLUDED.memory_mib, state = EXCLUDED.state, reason = EXCLUDED.reason,
    updated_at = now()
WHERE (a.device_id, a.model, a.profile, a.memory_mib, a.state, a.reason)
    IS DISTINCT FROM (EXCLUDED.device_id, EXCLUDED.model, EXCLUDED.profile, EXCLUDED.memory_mib, EXCLUDED.state,
        EXCLUDED.reason)
"""


def _at(value: dt.datetime | None) -> dt.datetime | None:
    return utc(value) if value is not None else None


def _device(row: Any) -> DeviceRecord:
    return DeviceRecord(
        id=row.id,
        node_id=row.node_id,
        tenant=row.tenant,
        pool_id=row.pool_id,
        kind=row.kind,
        ident=row.ident,
        slot=row.slot,
        model=row.model,
        details=dict(row.details),
        state=row.state,
        first_seen_at=_at(row.first_seen_at),
        updated_at=_at(row.updated_at),
        missing_since=_at(row.missing_since),
    )


def _atom(row: Any) -> AtomRecord:
    return AtomRecord(
        id=row.id,
        node_id=row.node_id,
        device_id=row.device_id,
        tenant=row.tenant,
        pool_id=row.pool_id,
        kind=row.kind,
        ident=row.ident,
        model=row.model,
        profile=row.profile,
        memory_mib=row.memory_mib,
        state=row.state,
        reason=row.reason,
        created_at=_at(row.created_at),
        updated_at=_at(row.updated_at),
    )


class PgInventory(PgRepository):
    """``Inventory`` on the ``devices`` and ``atoms`` tables."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._devices = db.sql(_DEVICES)
        self._device = db.sql(_DEVICE)
        self._devices_page = db.sql(_DEVICES_PAGE)
        self._gpu_owners = db.sql(_GPU_OWNERS)
        self._save_devices = db.sql(_SAVE_DEVICES)
        self._release_retired = db.sql(_RELEASE_RETIRED)
        self._displace = db.sql(_DISPLACE)
        self._atoms = db.sql(_ATOMS)
        self._atoms_of_devices = db.sql(_ATOMS_OF_DEVICES)
        self._save_atoms = db.sql(_SAVE_ATOMS)

    async def devices(self, node_id: str) -> list[DeviceRecord]:
        """The node's devices."""
        return [_device(r) for r in await self._fetch(self._devices, {"node_id": node_id})]

    async def device(self, id: str) -> DeviceRecord | None:
        """A device by id."""
        rows = await self._fetch(self._device, {"id": id})
        return _device(rows[0]) if rows else None

    async def devices_page(
        self, tenant: str, *, node_id: str | None, kind: str | None, after: Sequence[Any] | None, limit: int
    ) -> list[DeviceRecord]:
        """A page of the tenant's devices."""
        after_node, after_kind, after_ident = after if after is not None else (None, None, None)
        params = {
            "tenant": tenant,
            "node_id": node_id,
            "kind": kind,
            "after_node": after_node,
            "after_kind": after_kind,
            "after_ident": after_ident,
            "limit": limit,
        }
        return [_device(r) for r in await self._fetch(self._devices_page, params)]

    async def gpu_owners(self, idents: Sequence[str], *, besides: str, tenant: str) -> dict[str, GpuOwner]:
        """GPU UUIDs present on other live nodes, and who holds each."""
        if not idents:
            return {}
        rows = await self._fetch(self._gpu_owners, {"idents": list(idents), "besides": besides, "tenant": tenant})
        return {
            r.ident: GpuOwner(node_id=r.node_id, same_tenant=bool(r.same_tenant), attested=bool(r.attested))
            for r in rows
        }

    async def displace(self, held: Sequence[tuple[str, str, Mapping[str, Any]]]) -> int:
        """Put these GPUs in conflict (in the caller's transaction)."""
        if not held:
            return 0
        self._transaction("displace")
        params = {
            "node_ids": [h[0] for h in held],
            "idents": [h[1] for h in held],
            "details": [dumps(dict(h[2])) for h in held],
        }
        return await self._rowcount(self._displace, params)

    async def release_retired(self, idents: Sequence[str]) -> int:
        """Release retired nodes' GPUs with these UUIDs (in the caller's transaction)."""
        if not idents:
            return 0
        self._transaction("release_retired")
        return await self._rowcount(self._release_retired, {"idents": list(idents)})

    async def save_devices(self, devices: Sequence[DeviceRecord]) -> None:
        """Upsert devices (in the caller's transaction)."""
        if not devices:
            return
        rows = [
            {
                "id": d.id,
                "node_id": d.node_id,
                "tenant": d.tenant,
                "pool_id": d.pool_id,
                "kind": d.kind,
                "ident": d.ident,
                "slot": d.slot,
                "model": d.model,
                "details": dict(d.details),
                "state": d.state,
            }
            for d in devices
        ]
        await self._fetch_in_transaction("save_devices", self._save_devices, {"rows": dumps(rows)})

    async def atoms(self, node_id: str) -> list[AtomRecord]:
        """The node's atoms."""
        return [_atom(r) for r in await self._fetch(self._atoms, {"node_id": node_id})]

    async def atoms_of_devices(self, device_ids: Sequence[str]) -> list[AtomRecord]:
        """The atoms of these devices."""
        if not device_ids:
            return []
        return [_atom(r) for r in await self._fetch(self._atoms_of_devices, {"device_ids": list(device_ids)})]

    async def save_atoms(self, atoms: Sequence[AtomRecord]) -> None:
        """Upsert atoms (in the caller's transaction)."""
        if not atoms:
            return
        rows = [
            {
                "id": a.id,
                "node_id": a.node_id,
                "device_id": a.device_id,
                "tenant": a.tenant,
                "pool_id": a.pool_id,
                "kind": a.kind,
                "ident": a.ident,
                "model": a.model,
                "profile": a.profile,
                "memory_mib": a.memory_mib,
                "state": a.state,
                "reason": a.reason,
            }
            for a in atoms
        ]
        await self._fetch_in_transaction("save_atoms", self._save_atoms, {"rows": dumps(rows)})


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"inventory": PgInventory}
"""The adapters of this module's repositories, by ``Repository.name``."""
