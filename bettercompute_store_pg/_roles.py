"""One database role per process mode, with the grants that mode needs and no more (``PgStore.grant_roles``).

- ``<prefix>_api`` and ``<prefix>_worker`` read and write the tables, run the store's functions and use its
  sequences; neither owns anything, so neither can change the schema, and neither may UPDATE, DELETE or TRUNCATE the
  audit tables. Both run the service layer (an api process runs jobs too), so their table grants are the same.
- ``<prefix>_gateway`` holds no grant on any table or sequence: it may only execute the gateway's functions (the
  commands module's fourth migration), which run as their owner and write only what a gateway may say.

The roles are made with LOGIN and no password: they can be used with trust, peer or certificate authentication as
they are, and an operator gives them a password (``ALTER ROLE ... PASSWORD``) where that is the method. A role that
exists already (made by a DBA beforehand) is kept as it is and only granted to.
"""

from __future__ import annotations

import re
from typing import ClassVar

import attrs

from bettercompute.errors import InvalidConfigError

from ._db import Connection, Statement, fetch_in
from ._schema import migration_lock_key, quote_schema

__all__ = ["GATEWAY_FUNCTIONS", "RoleNames"]

_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,49}")

GATEWAY_FUNCTIONS = (
    "bc_gw_session_open(text, text, integer)",
    "bc_gw_session_close(text, bigint, text, text, integer)",
    "bc_gw_seen(text[], bigint[], text)",
    "bc_gw_observe(text[], bigint[], bigint[], bytea[], text[], bytea[], integer[])",
    "bc_gw_inventory(text, text, text, boolean, bigint, bytea, text, bytea, integer)",
    "bc_gw_event(text, text, jsonb, bigint)",
    "bc_gw_dispatch(text[], bigint[], integer)",
    "bc_gw_finish(text, bigint, text, text, text, bytea, text, bytea)",
    "bc_gw_desired_newer(text[], bigint[], text)",
    "bc_gw_desired_since(timestamptz, text)",
    "bc_gw_revoked(text[])",
    "bc_gw_signers()",
)
"""The functions the gateway role may execute: its whole access to the database."""

_AUDIT_TABLES = ("audit", "audit_chain")


@attrs.frozen
class RoleNames:
    """The three roles of one deployment, named ``<prefix>_api``, ``<prefix>_worker`` and ``<prefix>_gateway``."""

    prefix: str
    gateway_functions: ClassVar[tuple[str, ...]] = GATEWAY_FUNCTIONS
    """The functions the gateway role may execute, by signature."""

    def __attrs_post_init__(self) -> None:
        if not _PREFIX.fullmatch(self.prefix) or self.prefix.startswith("pg_"):
            raise InvalidConfigError(
                "a role prefix is a lower-case identifier of at most 50 characters, not starting with pg_",
                details={"problems": ["database_role_prefix"]},
            )

    @property
    def api(self) -> str:
        return f"{self.prefix}_api"

    @property
    def worker(self) -> str:
        return f"{self.prefix}_worker"

    @property
    def gateway(self) -> str:
        return f"{self.prefix}_gateway"

    def all(self) -> tuple[str, str, str]:
        """The three names: api, worker, gateway."""
        return self.api, self.worker, self.gateway


def _role_statements(schema: str, names: RoleNames) -> list[str]:
    """The statements that make the roles (where missing) and set their grants on ``schema``; idempotent."""
    s = quote_schema(schema)
    api, worker, gateway = (f'"{n}"' for n in names.all())
    writers = f"{api}, {worker}"
    made = [
        f"""DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{name}') THEN CREATE ROLE "{name}" LOGIN; END IF;
END $$"""
        for name in names.all()
    ]
    audit = [
        f"""DO $$ BEGIN
    IF to_regclass('{s}.{table}') IS NOT NULL THEN
        REVOKE UPDATE, DELETE, TRUNCATE ON {s}.{table} FROM {writers};
    END IF;
END $$"""
        for table in _AUDIT_TABLES
    ]
    functions = ", ".join(f"{s}.{f}" for f in GATEWAY_FUNCTIONS)
    return [
        *made,
        f"GRANT USAGE ON SCHEMA {s} TO {writers}, {gateway}",
        f"REVOKE CREATE ON SCHEMA {s} FROM {writers}, {gateway}",
        # The api and worker roles: rows, sequences and functions, now and in later migrations.
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {writers}",
        f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {s} TO {writers}",
        f"REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} FROM PUBLIC",
        f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {writers}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {writers}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {writers}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT EXECUTE ON FUNCTIONS TO {writers}",
        *audit,
        # The gateway role: its functions and nothing else (a grant made by hand earlier is taken back).
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {gateway}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {s} FROM {gateway}",
        f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {s} FROM {gateway}",
        f"GRANT EXECUTE ON FUNCTION {functions} TO {gateway}",
    ]


async def grant_roles_in(conn: Connection, schema: str, names: RoleNames) -> None:
    """Make the roles and set their grants in the transaction open on ``conn``, under the schema's migration lock
    (so that a migration running meanwhile is not half granted)."""
    await fetch_in(conn, Statement.of("SELECT pg_advisory_xact_lock(:key)"), {"key": migration_lock_key(schema)})
    for statement in _role_statements(schema, names):
        await conn.execute(statement, prepare=False)
