"""The ``metal`` module's tables and the PostgreSQL adapter of ``Metal`` (module name ``metal``); its images are in
the core's ``images`` table (version 2 moved them there).

Only this file imports the PostgreSQL store. A site token and a ramdisk token keep only the SHA-256 of their
secret; a BMC password is kept only sealed by the KMS (``bmc_secret``).
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bettercompute.ports import Migration
from bettercompute_metal._port import MACHINE_FIELDS, MachineRecord, SiteRecord, SiteTokenUse
from bettercompute_metal._tokens import credentials_context
from bettercompute_store_pg import Database, PartialUpdate, PgRepository, sealed_column

__all__ = ["MIGRATIONS", "REPOSITORIES", "PgMetal"]

# The image registry moved to the core (module ``images``, migrated before any module of Options.modules): the
# rows move with their ids, so machines, sites and running workflows still name them; the references are checked
# against the core's table from now on (a site's ramdisk kernel and initrd had no foreign key before; create_site
# checked them, and images were never deleted, so they hold). A disk image of bare metal was always raw.
_V2 = """
INSERT INTO {schema}.images (id, tenant, name, kind, url, sha256, size, format, created_at)
SELECT id, tenant, name, kind, url, sha256, size, CASE WHEN kind = 'disk' THEN 'raw' END, created_at
FROM {schema}.metal_images;

ALTER TABLE {schema}.metal_machines DROP CONSTRAINT metal_machines_image_id_fkey;
ALTER TABLE {schema}.metal_machines
    ADD CONSTRAINT metal_machines_image_id_fkey FOREIGN KEY (image_id) REFERENCES {schema}.images (id);
ALTER TABLE {schema}.metal_sites
    ADD CONSTRAINT metal_sites_ramdisk_kernel_fkey FOREIGN KEY (ramdisk_kernel) REFERENCES {schema}.images (id),
    ADD CONSTRAINT metal_sites_ramdisk_initrd_fkey FOREIGN KEY (ramdisk_initrd) REFERENCES {schema}.images (id);

DROP TABLE {schema}.metal_images;
"""

MIGRATIONS = (
    Migration(
        version=1,
        name="sites, site tokens, images, machines and boot records",
        sql="""
CREATE TABLE {schema}.metal_sites (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    pool_id text NOT NULL REFERENCES {schema}.pools (id),
    name text NOT NULL,
    ramdisk_kernel text,
    ramdisk_initrd text,
    boot_holder text,
    boot_expires_at timestamptz,
    boot_synced_at timestamptz,
    boot_http_base text,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, name)
);
CREATE INDEX metal_sites_page ON {schema}.metal_sites (tenant, created_at, id);

CREATE TABLE {schema}.metal_site_tokens (
    id text PRIMARY KEY,
    site_id text NOT NULL REFERENCES {schema}.metal_sites (id),
    secret_hash bytea NOT NULL CHECK (octet_length(secret_hash) = 32),
    uses integer NOT NULL CHECK (uses BETWEEN 1 AND 100),
    uses_left integer NOT NULL CHECK (uses_left BETWEEN 0 AND uses),
    expires_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz
);

CREATE TABLE {schema}.metal_images (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    name text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('kernel', 'initrd', 'disk')),
    url text NOT NULL,
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, name)
);
CREATE INDEX metal_images_page ON {schema}.metal_images (tenant, created_at, id);

CREATE TABLE {schema}.metal_machines (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    pool_id text NOT NULL REFERENCES {schema}.pools (id),
    site_id text NOT NULL REFERENCES {schema}.metal_sites (id),
    name text,
    node_id text NOT NULL UNIQUE,
    state text NOT NULL CHECK (state IN ('enrolled', 'inspected', 'commissioning', 'ready', 'deploying', 'deployed',
                                         'releasing', 'failed')),
    step text,
    reason text,
    message text,
    workflow_id text,
    bmc_url text NOT NULL UNIQUE,
    bmc_username text NOT NULL,
    bmc_tls jsonb NOT NULL,
    bmc_secret bytea NOT NULL,
    system_uuid text,
    serial text,
    macs text[] NOT NULL DEFAULT '{}',
    power_state text,
    hardware jsonb NOT NULL DEFAULT '{}',
    results jsonb NOT NULL DEFAULT '{}',
    boot jsonb NOT NULL DEFAULT '{"action": "local"}',
    task jsonb,
    tasks text[] NOT NULL DEFAULT '{}',
    ramdisk_token jsonb,
    image_id text REFERENCES {schema}.metal_images (id),
    disk text,
    hardware_key text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, name)
);
CREATE INDEX metal_machines_page ON {schema}.metal_machines (tenant, created_at, id);
CREATE INDEX metal_machines_site ON {schema}.metal_machines (site_id);
CREATE INDEX metal_machines_state ON {schema}.metal_machines (state) WHERE state = 'deploying';

-- What sites' boot servers saw (DHCP, TFTP, script and file requests): kept for metal.get, a week (metal-boot-records).
CREATE TABLE {schema}.metal_boot_records (
    id bigserial PRIMARY KEY,
    site_id text NOT NULL REFERENCES {schema}.metal_sites (id),
    machine_id text,
    kind text NOT NULL,
    mac text,
    system_uuid text,
    detail text NOT NULL,
    at timestamptz NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX metal_boot_records_machine ON {schema}.metal_boot_records (machine_id, id);
CREATE INDEX metal_boot_records_age ON {schema}.metal_boot_records (received_at);
""",
    ),
    Migration(
        version=2,
        name="images move to the core's images table",
        sql=_V2,
    ),
)

_SITE = (
    "id, tenant, pool_id, name, ramdisk_kernel, ramdisk_initrd, boot_holder, boot_expires_at, boot_synced_at,"
    " boot_http_base, created_at"
)
_MACHINE = (
    "id, tenant, pool_id, site_id, name, node_id, state, step, reason, message, workflow_id, bmc_url, bmc_username,"
    " bmc_tls, bmc_secret, system_uuid, serial, macs, power_state, hardware, results, boot, task, tasks,"
    " ramdisk_token, image_id, disk, hardware_key, created_at, updated_at"
)
_CASTS = {
    **dict.fromkeys(("hardware", "results", "boot", "task", "ramdisk_token"), "jsonb"),
    **dict.fromkeys(("macs", "tasks"), "text[]"),
}
"""The casts of the machine fields ``update_machine`` sets that are not taken as they are."""


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    return value.astimezone(dt.UTC) if value is not None else None


def _site(row: Any) -> SiteRecord:
    return SiteRecord(
        id=row.id,
        tenant=row.tenant,
        pool_id=row.pool_id,
        name=row.name,
        ramdisk_kernel=row.ramdisk_kernel,
        ramdisk_initrd=row.ramdisk_initrd,
        boot_holder=row.boot_holder,
        boot_expires_at=_utc(row.boot_expires_at),
        boot_synced_at=_utc(row.boot_synced_at),
        boot_http_base=row.boot_http_base,
        created_at=row.created_at.astimezone(dt.UTC),
    )


def _machine(row: Any) -> MachineRecord:
    return MachineRecord(
        id=row.id,
        tenant=row.tenant,
        pool_id=row.pool_id,
        site_id=row.site_id,
        name=row.name,
        node_id=row.node_id,
        state=row.state,
        step=row.step,
        reason=row.reason,
        message=row.message,
        workflow_id=row.workflow_id,
        bmc_url=row.bmc_url,
        bmc_username=row.bmc_username,
        bmc_tls=row.bmc_tls,
        bmc_secret=bytes(row.bmc_secret),
        system_uuid=row.system_uuid,
        serial=row.serial,
        macs=tuple(row.macs),
        power_state=row.power_state,
        hardware=row.hardware,
        results=row.results,
        boot=row.boot,
        task=row.task,
        tasks=tuple(row.tasks),
        ramdisk_token=row.ramdisk_token,
        image_id=row.image_id,
        disk=row.disk,
        hardware_key=row.hardware_key,
        created_at=row.created_at.astimezone(dt.UTC),
        updated_at=row.updated_at.astimezone(dt.UTC),
    )


def _page(after: Sequence[Any] | None) -> dict[str, Any]:
    after_at, after_id = after if after is not None else (None, None)
    return {"after_at": after_at, "after_id": after_id}


_PAGED = "(CAST(:after_at AS timestamptz) IS NULL OR (created_at, id) > (:after_at, :after_id))"


class PgMetal(PgRepository):
    """``Metal`` on the ``metal_*`` tables; one statement per call."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._update_machine = PartialUpdate(
            db, "metal_machines", {name: _CASTS.get(name) for name in MACHINE_FIELDS}, returning=_MACHINE
        )
        self._create_site = db.sql(f"""
INSERT INTO {{s}}.metal_sites (id, tenant, pool_id, name, ramdisk_kernel, ramdisk_initrd)
VALUES (:id, :tenant, :pool_id, :name, :kernel, :initrd) ON CONFLICT (tenant, name) DO NOTHING RETURNING {_SITE}""")
        self._get_site = db.sql(f"SELECT {_SITE} FROM {{s}}.metal_sites WHERE id = :id")
        self._list_sites = db.sql(
            f"SELECT {_SITE} FROM {{s}}.metal_sites WHERE tenant = :tenant AND {_PAGED} ORDER BY created_at, id"
            " LIMIT :limit"
        )
        self._create_token = db.sql("""
INSERT INTO {s}.metal_site_tokens (id, site_id, secret_hash, uses, uses_left, expires_at)
VALUES (:id, :site_id, :hash, :uses, :uses, :expires_at)""")
        # Locked, then spent only if it still may be: of two joins racing for the last use, one gets it.
        self._use_token = db.sql(f"""
WITH t AS (SELECT * FROM {{s}}.metal_site_tokens WHERE id = :id FOR UPDATE),
u AS (
    UPDATE {{s}}.metal_site_tokens AS k SET uses_left = k.uses_left - 1, last_used_at = :now
    FROM t WHERE k.id = t.id AND t.secret_hash = :hash AND t.uses_left > 0 AND t.expires_at > :now
    RETURNING k.site_id
)
SELECT t.secret_hash, t.uses_left, t.expires_at, u.site_id AS spent,
       s.{_SITE.replace(", ", ", s.")}
FROM t LEFT JOIN u ON true LEFT JOIN {{s}}.metal_sites AS s ON s.id = t.site_id""")
        self._lease = db.sql("""
UPDATE {s}.metal_sites SET boot_holder = :agent, boot_expires_at = CAST(:now AS timestamptz) + :ttl,
    boot_synced_at = :now, boot_http_base = coalesce(CAST(:http_base AS text), boot_http_base)
WHERE id = :id AND (boot_holder IS NULL OR boot_holder = :agent OR boot_expires_at <= :now)
RETURNING boot_holder, boot_expires_at""")
        self._create_machine = db.sql(f"""
INSERT INTO {{s}}.metal_machines
    (id, tenant, pool_id, site_id, name, node_id, state, bmc_url, bmc_username, bmc_tls, bmc_secret)
VALUES (:id, :tenant, :pool_id, :site_id, :name, :node_id, 'enrolled', :bmc_url, :bmc_username,
        CAST(:bmc_tls AS jsonb), :bmc_secret)
ON CONFLICT DO NOTHING RETURNING {_MACHINE}""")
        self._get_machine = db.sql(f"SELECT {_MACHINE} FROM {{s}}.metal_machines WHERE id = :id")
        self._lock_machine = db.sql(f"SELECT {_MACHINE} FROM {{s}}.metal_machines WHERE id = :id FOR UPDATE")
        self._list_machines = db.sql(
            f"SELECT {_MACHINE} FROM {{s}}.metal_machines WHERE tenant = :tenant"
            f" AND (CAST(:site_id AS text) IS NULL OR site_id = :site_id) AND {_PAGED} ORDER BY created_at, id"
            " LIMIT :limit"
        )
        self._deploying = db.sql(
            f"SELECT {_MACHINE} FROM {{s}}.metal_machines WHERE state = 'deploying' ORDER BY updated_at LIMIT 1000"
        )
        self._at_site = db.sql(f"SELECT {_MACHINE} FROM {{s}}.metal_machines WHERE site_id = :site_id ORDER BY id")
        self._add_records = db.sql("""
INSERT INTO {s}.metal_boot_records (site_id, machine_id, kind, mac, system_uuid, detail, at)
SELECT :site_id, r.machine_id, r.kind, r.mac, r.system_uuid, r.detail, r.at
FROM jsonb_to_recordset(CAST(:records AS jsonb))
    AS r(machine_id text, kind text, mac text, system_uuid text, detail text, at timestamptz)""")
        self._trim = db.sql("DELETE FROM {s}.metal_boot_records WHERE received_at < :before")
        self._records = db.sql("""
SELECT kind, mac, system_uuid, detail, at FROM {s}.metal_boot_records WHERE machine_id = :machine_id
ORDER BY id DESC LIMIT :limit""")

    async def create_site(
        self, *, id: str, tenant: str, pool_id: str, name: str, kernel: str | None, initrd: str | None
    ) -> SiteRecord | None:
        rows = await self._fetch_in_transaction(
            "create_site",
            self._create_site,
            {"id": id, "tenant": tenant, "pool_id": pool_id, "name": name, "kernel": kernel, "initrd": initrd},
        )
        return _site(rows[0]) if rows else None

    async def get_site(self, id: str) -> SiteRecord | None:
        rows = await self._fetch(self._get_site, {"id": id})
        return _site(rows[0]) if rows else None

    async def list_sites(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[SiteRecord]:
        rows = await self._fetch(self._list_sites, {"tenant": tenant, "limit": limit, **_page(after)})
        return [_site(r) for r in rows]

    async def create_site_token(
        self, *, id: str, site_id: str, secret_hash: bytes, uses: int, expires_at: dt.datetime
    ) -> None:
        params = {"id": id, "site_id": site_id, "hash": secret_hash, "uses": uses, "expires_at": expires_at}
        await self._fetch_in_transaction("create_site_token", self._create_token, params)

    async def use_site_token(self, id: str, secret_hash: bytes, *, now: dt.datetime) -> SiteTokenUse:
        rows = await self._fetch_in_transaction(
            "use_site_token", self._use_token, {"id": id, "hash": secret_hash, "now": now}
        )
        if not rows or not hmac.compare_digest(bytes(rows[0].secret_hash), secret_hash):
            return SiteTokenUse(site=None, refusal="unknown_token")
        row = rows[0]
        if row.spent is not None:
            return SiteTokenUse(site=_site(row), refusal=None)
        if row.expires_at <= now:
            return SiteTokenUse(site=None, refusal="token_expired")
        return SiteTokenUse(site=None, refusal="token_used")

    async def sync_boot_lease(
        self, site_id: str, agent: str, *, ttl: dt.timedelta, now: dt.datetime, http_base: str | None = None
    ) -> tuple[bool, str | None, dt.datetime | None]:
        params = {"id": site_id, "agent": agent, "ttl": ttl, "now": now, "http_base": http_base}
        rows = await self._fetch(self._lease, params)
        if rows:
            return True, rows[0].boot_holder, _utc(rows[0].boot_expires_at)
        site = await self.get_site(site_id)
        return False, site.boot_holder if site else None, site.boot_expires_at if site else None

    async def create_machine(
        self,
        *,
        id: str,
        tenant: str,
        pool_id: str,
        site_id: str,
        name: str | None,
        node_id: str,
        bmc_url: str,
        bmc_username: str,
        bmc_tls: Mapping[str, Any],
        bmc_secret: bytes,
    ) -> MachineRecord | None:
        params = {
            "id": id,
            "tenant": tenant,
            "pool_id": pool_id,
            "site_id": site_id,
            "name": name,
            "node_id": node_id,
            "bmc_url": bmc_url,
            "bmc_username": bmc_username,
            "bmc_tls": json.dumps(dict(bmc_tls)),
            "bmc_secret": bmc_secret,
        }
        rows = await self._fetch_in_transaction("create_machine", self._create_machine, params)
        return _machine(rows[0]) if rows else None

    async def get_machine(self, id: str) -> MachineRecord | None:
        rows = await self._fetch(self._get_machine, {"id": id})
        return _machine(rows[0]) if rows else None

    async def lock_machine(self, id: str) -> MachineRecord | None:
        rows = await self._fetch_in_transaction("lock_machine", self._lock_machine, {"id": id})
        return _machine(rows[0]) if rows else None

    async def list_machines(
        self, tenant: str, *, site_id: str | None, after: Sequence[Any] | None, limit: int
    ) -> list[MachineRecord]:
        params = {"tenant": tenant, "site_id": site_id, "limit": limit, **_page(after)}
        rows = await self._fetch(self._list_machines, params)
        return [_machine(r) for r in rows]

    async def deploying(self) -> list[MachineRecord]:
        rows = await self._fetch(self._deploying, {})
        return [_machine(r) for r in rows]

    async def machines_at_site(self, site_id: str) -> list[MachineRecord]:
        rows = await self._fetch(self._at_site, {"site_id": site_id})
        return [_machine(r) for r in rows]

    async def update_machine(self, id: str, **fields: Any) -> MachineRecord | None:
        statement, params = self._update_machine.prepare(id, fields)
        rows = await self._fetch_in_transaction("update_machine", statement, params)
        return _machine(rows[0]) if rows else None

    async def add_boot_records(self, site_id: str, records: Sequence[Mapping[str, Any]]) -> int:
        if not records:
            return 0
        payload = json.dumps([dict(r) for r in records])
        await self._fetch_in_transaction(
            "add_boot_records", self._add_records, {"site_id": site_id, "records": payload}
        )
        return len(records)

    async def trim_boot_records(self, *, before: dt.datetime) -> int:
        return await self._rowcount(self._trim, {"before": before})

    async def boot_records(self, machine_id: str, *, limit: int) -> list[dict[str, Any]]:
        rows = await self._fetch(self._records, {"machine_id": machine_id, "limit": limit})
        return [
            {"kind": r.kind, "mac": r.mac, "system_uuid": r.system_uuid, "detail": r.detail, "at": r.at.isoformat()}
            for r in rows
        ]


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {
    "metal": PgMetal,
    "sealed_bmc_credentials": sealed_column("metal_machines", "bmc_secret", lambda r: credentials_context(r.id)),
}
"""The adapters by ``Repository.name``, found by the PostgreSQL store through ``METAL.adapters``."""
