"""The ``vps`` module's tables and the PostgreSQL adapter of ``Vps`` (module name ``vps``).

Only this file imports the PostgreSQL store. A host's use is never stored: it is the sum of its live instances, read
under the pool's advisory lock by the one transaction that places an instance, so two placements cannot both take
the last room of a node and nothing can drift out of step.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from typing import Any

from bettercompute.ports import Migration
from bettercompute_store_pg import Database, PartialUpdate, PgRepository
from bettercompute_vps._port import INSTANCE_FIELDS, HostRecord, InstanceRecord, PoolSettings

__all__ = ["MIGRATIONS", "REPOSITORIES", "PgVps"]

MIGRATIONS = (
    Migration(
        version=1,
        name="VPS pools, hosts, instances and their bookings",
        sql="""
CREATE TABLE {schema}.vps_pools (
    pool_id text PRIMARY KEY REFERENCES {schema}.pools (id),
    tenant text NOT NULL,
    cpu_ratio double precision NOT NULL DEFAULT 1 CHECK (cpu_ratio BETWEEN 1 AND 16),
    memory_ratio double precision NOT NULL DEFAULT 1 CHECK (memory_ratio BETWEEN 1 AND 16),
    max_instances integer CHECK (max_instances >= 0),
    max_vcpu integer CHECK (max_vcpu >= 0),
    max_memory_mib bigint CHECK (max_memory_mib >= 0),
    provider jsonb,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.vps_hosts (
    node_id text PRIMARY KEY,
    pool_id text NOT NULL REFERENCES {schema}.pools (id),
    tenant text NOT NULL,
    vcpu integer NOT NULL CHECK (vcpu >= 0),
    memory_mib bigint NOT NULL CHECK (memory_mib >= 0),
    disk_gib integer NOT NULL CHECK (disk_gib >= 0),
    gpus text[] NOT NULL DEFAULT '{}',
    available boolean NOT NULL,
    reason text,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX vps_hosts_pool ON {schema}.vps_hosts (pool_id, node_id);

CREATE TABLE {schema}.vps_instances (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    pool_id text NOT NULL REFERENCES {schema}.pools (id),
    pool_class text NOT NULL CHECK (pool_class IN ('vps-host', 'provider')),
    name text NOT NULL,
    hostname text NOT NULL,
    state text NOT NULL
        CHECK (state IN ('pending', 'provisioning', 'running', 'stopped', 'failed', 'deleted')),
    step text,
    reason text,
    message text,
    power text NOT NULL CHECK (power IN ('running', 'stopped')),
    boot integer NOT NULL DEFAULT 0,
    spec integer NOT NULL DEFAULT 1,
    observed_spec integer NOT NULL DEFAULT 0,
    vcpu integer NOT NULL CHECK (vcpu > 0),
    memory_mib bigint NOT NULL CHECK (memory_mib > 0),
    disk_gib integer NOT NULL CHECK (disk_gib > 0),
    gpus integer NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    image_id text NOT NULL,
    ssh_keys jsonb NOT NULL DEFAULT '[]',
    user_data text NOT NULL DEFAULT '',
    ports integer[] NOT NULL DEFAULT '{}',
    labels jsonb NOT NULL DEFAULT '{}',
    node_id text,
    gpu_ids text[] NOT NULL DEFAULT '{}',
    addresses text[] NOT NULL DEFAULT '{}',
    console text NOT NULL DEFAULT '',
    console_at timestamptz,
    provider_id text,
    instance_type text,
    client_token text NOT NULL,
    workflow_id text,
    deleting boolean NOT NULL DEFAULT false,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    deleted_at timestamptz
);
CREATE UNIQUE INDEX vps_instances_name ON {schema}.vps_instances (tenant, pool_id, name) WHERE deleted_at IS NULL;
CREATE INDEX vps_instances_page ON {schema}.vps_instances (tenant, created_at, id);
CREATE INDEX vps_instances_node ON {schema}.vps_instances (node_id) WHERE deleted_at IS NULL;
CREATE INDEX vps_instances_pool_live ON {schema}.vps_instances (pool_id, tenant) WHERE deleted_at IS NULL;

CREATE TABLE {schema}.vps_bookings (
    id bigserial PRIMARY KEY,
    instance_id text NOT NULL REFERENCES {schema}.vps_instances (id),
    tenant text NOT NULL,
    pool_id text NOT NULL,
    node_id text,
    vcpu integer NOT NULL,
    memory_mib bigint NOT NULL,
    disk_gib integer NOT NULL,
    gpus integer NOT NULL,
    during tstzrange NOT NULL CHECK (NOT isempty(during) AND NOT lower_inf(during))
);
CREATE INDEX vps_bookings_instance ON {schema}.vps_bookings (instance_id) WHERE upper_inf(during);
CREATE INDEX vps_bookings_tenant ON {schema}.vps_bookings USING gist (tenant, during);
""",
    ),
)

_POOL = "pool_id, tenant, cpu_ratio, memory_ratio, max_instances, max_vcpu, max_memory_mib, provider, updated_at"
_INSTANCE = (
    "id, tenant, pool_id, pool_class, name, hostname, state, step, reason, message, power, boot, spec, observed_spec,"
    " vcpu, memory_mib, disk_gib, gpus, image_id, ssh_keys, user_data, ports, labels, node_id, gpu_ids, addresses,"
    " console, console_at, provider_id, instance_type, client_token, workflow_id, deleting, created_by, created_at,"
    " updated_at, deleted_at"
)
_CASTS = {"gpu_ids": "text[]", "addresses": "text[]"}
"""The casts of the instance fields ``update_instance`` sets that are not taken as they are."""


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    return value.astimezone(dt.UTC) if value is not None else None


def _pool(row: Any) -> PoolSettings:
    return PoolSettings(
        pool_id=row.pool_id,
        tenant=row.tenant,
        cpu_ratio=float(row.cpu_ratio),
        memory_ratio=float(row.memory_ratio),
        max_instances=row.max_instances,
        max_vcpu=row.max_vcpu,
        max_memory_mib=row.max_memory_mib,
        provider=row.provider,
        updated_at=row.updated_at.astimezone(dt.UTC),
    )


def _instance(row: Any) -> InstanceRecord:
    return InstanceRecord(
        id=row.id,
        tenant=row.tenant,
        pool_id=row.pool_id,
        pool_class=row.pool_class,
        name=row.name,
        hostname=row.hostname,
        state=row.state,
        step=row.step,
        reason=row.reason,
        message=row.message,
        power=row.power,
        boot=row.boot,
        spec=row.spec,
        observed_spec=row.observed_spec,
        vcpu=row.vcpu,
        memory_mib=row.memory_mib,
        disk_gib=row.disk_gib,
        gpus=row.gpus,
        image_id=row.image_id,
        ssh_keys=tuple(row.ssh_keys),
        user_data=row.user_data,
        ports=tuple(row.ports),
        labels=dict(row.labels),
        node_id=row.node_id,
        gpu_ids=tuple(row.gpu_ids),
        addresses=tuple(row.addresses),
        console=row.console,
        console_at=_utc(row.console_at),
        provider_id=row.provider_id,
        instance_type=row.instance_type,
        client_token=row.client_token,
        workflow_id=row.workflow_id,
        deleting=row.deleting,
        created_by=row.created_by,
        created_at=row.created_at.astimezone(dt.UTC),
        updated_at=row.updated_at.astimezone(dt.UTC),
        deleted_at=_utc(row.deleted_at),
    )


def _host(row: Any) -> HostRecord:
    return HostRecord(
        node_id=row.node_id,
        pool_id=row.pool_id,
        tenant=row.tenant,
        vcpu=row.vcpu,
        memory_mib=row.memory_mib,
        disk_gib=row.disk_gib,
        gpus=tuple(row.gpus),
        available=row.available,
        reason=row.reason,
        used_vcpu=int(row.used_vcpu or 0),
        used_memory_mib=int(row.used_memory_mib or 0),
        used_disk_gib=int(row.used_disk_gib or 0),
        used_gpus=tuple(row.used_gpus or ()),
    )


_HOST_WITH_USE = """
SELECT h.node_id, h.pool_id, h.tenant, h.vcpu, h.memory_mib, h.disk_gib, h.gpus, h.available, h.reason,
       u.used_vcpu, u.used_memory_mib, u.used_disk_gib, u.used_gpus
FROM {s}.vps_hosts AS h
LEFT JOIN LATERAL (
    SELECT sum(i.vcpu) AS used_vcpu, sum(i.memory_mib) AS used_memory_mib, sum(i.disk_gib) AS used_disk_gib,
           array_agg(g) FILTER (WHERE g IS NOT NULL) AS used_gpus
    FROM {s}.vps_instances AS i LEFT JOIN LATERAL unnest(i.gpu_ids) AS g ON true
    WHERE i.node_id = h.node_id AND i.deleted_at IS NULL
) AS u ON true
"""

_CONFIGURE = f"""
INSERT INTO {{s}}.vps_pools
    (pool_id, tenant, cpu_ratio, memory_ratio, max_instances, max_vcpu, max_memory_mib, provider, updated_at)
VALUES (:pool_id, :tenant, :cpu_ratio, :memory_ratio, :max_instances, :max_vcpu, :max_memory_mib,
        CAST(:provider AS jsonb), now())
ON CONFLICT (pool_id) DO UPDATE SET cpu_ratio = EXCLUDED.cpu_ratio, memory_ratio = EXCLUDED.memory_ratio,
    max_instances = EXCLUDED.max_instances, max_vcpu = EXCLUDED.max_vcpu, max_memory_mib = EXCLUDED.max_memory_mib,
    provider = EXCLUDED.provider, updated_at = now()
RETURNING {_POOL}"""

_TOTALS = """
SELECT count(*) AS n, coalesce(sum(vcpu), 0) AS vcpu, coalesce(sum(memory_mib), 0) AS memory_mib
FROM {s}.vps_instances WHERE pool_id = :pool_id AND tenant = :tenant AND deleted_at IS NULL"""

_UPSERT_HOST = """
INSERT INTO {s}.vps_hosts AS h (node_id, pool_id, tenant, vcpu, memory_mib, disk_gib, gpus, available, reason)
VALUES (:node_id, :pool_id, :tenant, :vcpu, :memory_mib, :disk_gib, CAST(:gpus AS text[]), :available, :reason)
ON CONFLICT (node_id) DO UPDATE SET pool_id = EXCLUDED.pool_id, tenant = EXCLUDED.tenant, vcpu = EXCLUDED.vcpu,
    memory_mib = EXCLUDED.memory_mib, disk_gib = EXCLUDED.disk_gib, gpus = EXCLUDED.gpus,
    available = EXCLUDED.available, reason = EXCLUDED.reason, updated_at = now()
WHERE (h.pool_id, h.tenant, h.vcpu, h.memory_mib, h.disk_gib, h.gpus, h.available, h.reason)
    IS DISTINCT FROM (EXCLUDED.pool_id, EXCLUDED.tenant, EXCLUDED.vcpu, EXCLUDED.memory_mib, EXCLUDED.disk_gib,
                      EXCLUDED.gpus, EXCLUDED.available, EXCLUDED.reason)"""

# A host offers only what its node signed: a ``vm`` section the inventory controller has not found good (unchecked, or
# refused) offers nothing.
_OFFERS = """
SELECT n.id AS node_id, n.pool_id, n.tenant, n.state, n.cordoned, i.content AS vm
FROM {s}.nodes AS n
JOIN {s}.pools AS p ON p.id = n.pool_id AND p.pool_class = 'vps-host'
LEFT JOIN {s}.node_inventory AS i ON i.node_id = n.id AND i.section = 'vm' AND i.checked = 'ok'
ORDER BY n.id LIMIT :limit"""

_INSERT = f"""
INSERT INTO {{s}}.vps_instances
    (id, tenant, pool_id, pool_class, name, hostname, state, step, reason, message, power, vcpu, memory_mib,
     disk_gib, gpus, image_id, ssh_keys, user_data, ports, labels, node_id, gpu_ids, instance_type, client_token,
     created_by)
VALUES (:id, :tenant, :pool_id, :pool_class, :name, :hostname, :state, :step, :reason, :message, :power, :vcpu,
        :memory_mib, :disk_gib, :gpus, :image_id, CAST(:ssh_keys AS jsonb), :user_data, CAST(:ports AS integer[]),
        CAST(:labels AS jsonb), :node_id, CAST(:gpu_ids AS text[]), :instance_type, :client_token, :created_by)
ON CONFLICT DO NOTHING RETURNING {_INSTANCE}"""

_LIST = f"""
SELECT {_INSTANCE} FROM {{s}}.vps_instances
WHERE tenant = :tenant AND (CAST(:pool_id AS text) IS NULL OR pool_id = :pool_id)
  AND (:include_deleted OR deleted_at IS NULL)
  AND (CAST(:after_at AS timestamptz) IS NULL OR (created_at, id) > (:after_at, :after_id))
ORDER BY created_at, id LIMIT :limit"""

_ON_GONE = f"""
SELECT {", ".join("i." + c for c in _INSTANCE.split(", "))} FROM {{s}}.vps_instances AS i
JOIN {{s}}.nodes AS n ON n.id = i.node_id
WHERE i.deleted_at IS NULL AND n.state IN ('failed', 'retired', 'unreachable')
ORDER BY i.id LIMIT :limit"""

_OPEN = """
INSERT INTO {s}.vps_bookings (instance_id, tenant, pool_id, node_id, vcpu, memory_mib, disk_gib, gpus, during)
VALUES (:id, :tenant, :pool_id, :node_id, :vcpu, :memory_mib, :disk_gib, :gpus, tstzrange(:at, NULL))"""

_CLOSE = """
UPDATE {s}.vps_bookings SET during = tstzrange(lower(during), greatest(lower(during) + interval '1 microsecond', :at))
WHERE instance_id = :id AND upper_inf(during)"""

_USAGE = """
SELECT pool_id,
       sum(vcpu * hours) AS vcpu_hours, sum(memory_mib / 1024.0 * hours) AS memory_gib_hours,
       sum(disk_gib * hours) AS disk_gib_hours, sum(gpus * hours) AS gpu_hours
FROM (
    SELECT pool_id, vcpu, memory_mib, disk_gib, gpus,
           extract(epoch FROM upper(r) - lower(r)) / 3600.0 AS hours
    FROM (
        SELECT pool_id, vcpu, memory_mib, disk_gib, gpus, during * tstzrange(:start, :end) AS r
        FROM {s}.vps_bookings
        WHERE tenant = :tenant AND during && tstzrange(:start, :end)
          AND (CAST(:pool_id AS text) IS NULL OR pool_id = :pool_id)
    ) AS clipped WHERE NOT isempty(r)
) AS b
GROUP BY pool_id ORDER BY pool_id"""


class PgVps(PgRepository):
    """``Vps`` on the ``vps_*`` tables; one statement per call."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._update_instance = PartialUpdate(
            db, "vps_instances", {name: _CASTS.get(name) for name in INSTANCE_FIELDS}, returning=_INSTANCE
        )
        self._pool = db.sql(f"SELECT {_POOL} FROM {{s}}.vps_pools WHERE pool_id = :pool_id")
        self._configure = db.sql(_CONFIGURE)
        # The lock's key is the pool's, in a space of its own (the first int4 names this module's locks).
        self._lock_pool = db.sql("SELECT pg_advisory_xact_lock(1447121747, hashtext(:pool_id))")
        self._totals = db.sql(_TOTALS)
        self._hosts = db.sql(_HOST_WITH_USE + " WHERE h.pool_id = :pool_id ORDER BY h.node_id")
        self._host = db.sql(_HOST_WITH_USE + " WHERE h.node_id = :node_id")
        self._upsert_host = db.sql(_UPSERT_HOST)
        self._offers = db.sql(_OFFERS)
        self._insert = db.sql(_INSERT)
        self._get = db.sql(f"SELECT {_INSTANCE} FROM {{s}}.vps_instances WHERE id = :id")
        self._get_locked = db.sql(f"SELECT {_INSTANCE} FROM {{s}}.vps_instances WHERE id = :id FOR UPDATE")
        self._list = db.sql(_LIST)
        self._on_node = db.sql(
            f"SELECT {_INSTANCE} FROM {{s}}.vps_instances WHERE node_id = :node_id AND deleted_at IS NULL ORDER BY id"
        )
        self._on_gone = db.sql(_ON_GONE)
        self._open = db.sql(_OPEN)
        self._close = db.sql(_CLOSE)
        self._usage = db.sql(_USAGE)

    async def pool(self, pool_id: str) -> PoolSettings | None:
        rows = await self._fetch(self._pool, {"pool_id": pool_id})
        return _pool(rows[0]) if rows else None

    async def configure_pool(self, settings: PoolSettings) -> PoolSettings:
        params = {
            "pool_id": settings.pool_id,
            "tenant": settings.tenant,
            "cpu_ratio": settings.cpu_ratio,
            "memory_ratio": settings.memory_ratio,
            "max_instances": settings.max_instances,
            "max_vcpu": settings.max_vcpu,
            "max_memory_mib": settings.max_memory_mib,
            "provider": json.dumps(dict(settings.provider)) if settings.provider is not None else None,
        }
        rows = await self._fetch_in_transaction("configure_pool", self._configure, params)
        return _pool(rows[0])

    async def lock_pool(self, pool_id: str) -> None:
        await self._fetch_in_transaction("lock_pool", self._lock_pool, {"pool_id": pool_id})

    async def tenant_totals(self, pool_id: str, tenant: str) -> tuple[int, int, int]:
        rows = await self._fetch(self._totals, {"pool_id": pool_id, "tenant": tenant})
        return int(rows[0].n), int(rows[0].vcpu), int(rows[0].memory_mib)

    async def hosts(self, pool_id: str) -> list[HostRecord]:
        return [_host(r) for r in await self._fetch(self._hosts, {"pool_id": pool_id})]

    async def host(self, node_id: str) -> HostRecord | None:
        rows = await self._fetch(self._host, {"node_id": node_id})
        return _host(rows[0]) if rows else None

    async def host_offers(self, *, limit: int) -> list[dict[str, Any]]:
        rows = await self._fetch(self._offers, {"limit": limit})
        return [
            {
                "node_id": r.node_id,
                "pool_id": r.pool_id,
                "tenant": r.tenant,
                "state": r.state,
                "cordoned": r.cordoned,
                "vm": r.vm,
            }
            for r in rows
        ]

    async def upsert_host(self, host: HostRecord) -> bool:
        params = {
            "node_id": host.node_id,
            "pool_id": host.pool_id,
            "tenant": host.tenant,
            "vcpu": host.vcpu,
            "memory_mib": host.memory_mib,
            "disk_gib": host.disk_gib,
            "gpus": list(host.gpus),
            "available": host.available,
            "reason": host.reason,
        }
        return await self._rowcount(self._upsert_host, params) > 0

    async def insert_instance(self, record: InstanceRecord) -> InstanceRecord | None:
        params = {
            "id": record.id,
            "tenant": record.tenant,
            "pool_id": record.pool_id,
            "pool_class": record.pool_class,
            "name": record.name,
            "hostname": record.hostname,
            "state": record.state,
            "step": record.step,
            "reason": record.reason,
            "message": record.message,
            "power": record.power,
            "vcpu": record.vcpu,
            "memory_mib": record.memory_mib,
            "disk_gib": record.disk_gib,
            "gpus": record.gpus,
            "image_id": record.image_id,
            "ssh_keys": json.dumps(list(record.ssh_keys)),
            "user_data": record.user_data,
            "ports": list(record.ports),
            "labels": json.dumps(dict(record.labels)),
            "node_id": record.node_id,
            "gpu_ids": list(record.gpu_ids),
            "instance_type": record.instance_type,
            "client_token": record.client_token,
            "created_by": record.created_by,
        }
        rows = await self._fetch_in_transaction("insert_instance", self._insert, params)
        return _instance(rows[0]) if rows else None

    async def get_instance(self, instance_id: str, *, lock: bool = False) -> InstanceRecord | None:
        if lock:
            rows = await self._fetch_in_transaction("get_instance", self._get_locked, {"id": instance_id})
        else:
            rows = await self._fetch(self._get, {"id": instance_id})
        return _instance(rows[0]) if rows else None

    async def update_instance(self, instance_id: str, **fields: Any) -> InstanceRecord | None:
        statement, params = self._update_instance.prepare(instance_id, fields)
        rows = await self._fetch_in_transaction("update_instance", statement, params)
        return _instance(rows[0]) if rows else None

    async def list_instances(
        self,
        tenant: str,
        *,
        pool_id: str | None,
        include_deleted: bool,
        after: Sequence[Any] | None,
        limit: int,
    ) -> list[InstanceRecord]:
        after_at, after_id = after if after is not None else (None, None)
        params = {
            "tenant": tenant,
            "pool_id": pool_id,
            "include_deleted": include_deleted,
            "after_at": after_at,
            "after_id": after_id,
            "limit": limit,
        }
        return [_instance(r) for r in await self._fetch(self._list, params)]

    async def on_node(self, node_id: str) -> list[InstanceRecord]:
        return [_instance(r) for r in await self._fetch(self._on_node, {"node_id": node_id})]

    async def on_gone_nodes(self, *, limit: int) -> list[InstanceRecord]:
        return [_instance(r) for r in await self._fetch(self._on_gone, {"limit": limit})]

    async def open_booking(self, record: InstanceRecord, *, at: dt.datetime) -> None:
        params = {
            "id": record.id,
            "tenant": record.tenant,
            "pool_id": record.pool_id,
            "node_id": record.node_id,
            "vcpu": record.vcpu,
            "memory_mib": record.memory_mib,
            "disk_gib": record.disk_gib,
            "gpus": record.gpus,
            "at": at,
        }
        await self._fetch_in_transaction("open_booking", self._open, params)

    async def close_booking(self, instance_id: str, *, at: dt.datetime) -> None:
        await self._fetch_in_transaction("close_booking", self._close, {"id": instance_id, "at": at})

    async def usage(
        self, tenant: str, *, pool_id: str | None, start: dt.datetime, end: dt.datetime
    ) -> list[dict[str, Any]]:
        rows = await self._fetch(self._usage, {"tenant": tenant, "pool_id": pool_id, "start": start, "end": end})
        return [
            {
                "pool_id": r.pool_id,
                "vcpu_hours": float(r.vcpu_hours or 0),
                "memory_gib_hours": float(r.memory_gib_hours or 0),
                "disk_gib_hours": float(r.disk_gib_hours or 0),
                "gpu_hours": float(r.gpu_hours or 0),
            }
            for r in rows
        ]


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"vps": PgVps}
"""The adapters by ``Repository.name``, found by the PostgreSQL store through ``VPS.adapters``."""
