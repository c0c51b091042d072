"""A central control plane with the embedded IAM, and the principals the IAM conformance suite needs.

Principals, roles and bindings are written with SQL: the suite tests the ``Iam`` port, not IAM's admin methods.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import attrs
import psycopg
import pytest

from bettercompute import BetterCompute, Options, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_iam._credentials import mint, parse
from bettercompute_store_pg import PgStore

TENANT = "tn_acme"
OTHER_TENANT = "tn_globex"


@attrs.frozen(kw_only=True)
class Population:
    """Credentials of the principals ``populate`` wrote (shown once, as a real IAM would)."""

    root_admin: str = attrs.field(repr=False)
    tenant_admin: str = attrs.field(repr=False)
    viewer: str = attrs.field(repr=False)
    revoked: str = attrs.field(repr=False)
    expired: str = attrs.field(repr=False)
    disabled: str = attrs.field(repr=False)
    authz_client: str = attrs.field(repr=False)
    """A root service account bound on the root scope to the built-in ``compute.authz-client``: what RemoteIam uses."""


class Writer:
    """Writes IAM rows straight into a control plane's schema."""

    def __init__(self, url: str, schema: str) -> None:
        self._url = url
        self._q = f'"{schema}"'

    def tenant(self, tenant_id: str) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {self._q}.iam_tenants (id, name) VALUES (%s, %s)", (tenant_id, tenant_id))

    def principal(
        self,
        tenant: str,
        *,
        role: str | None = None,
        scope: str | None = None,
        kind: str = "user",
        disabled: bool = False,
        credential: str = "usable",
    ) -> str:
        """A principal of ``tenant`` with one credential (``usable``, ``revoked`` or ``expired``), bound to ``role``
        on ``scope`` (a tenant id; ``None`` for the root scope). Returns the credential."""
        q = self._q
        principal = f"pr_{secrets.token_hex(8)}"
        credential_id, full, secret_hash = mint()
        with psycopg.connect(self._url, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO {q}.iam_principals (id, tenant_id, kind, name, disabled_at)"
                f" VALUES (%s, %s, %s, %s, CASE WHEN %s THEN now() END)",
                (principal, tenant, kind, f"{kind}-{principal[3:]}", disabled),
            )
            conn.execute(
                f"INSERT INTO {q}.iam_credentials (id, principal_id, secret_hash, expires_at, revoked_at)"
                f" VALUES (%s, %s, %s, CASE WHEN %s THEN now() - interval '1 hour' END, CASE WHEN %s THEN now() END)",
                (credential_id, principal, secret_hash, credential == "expired", credential == "revoked"),
            )
            if role is not None:
                conn.execute(
                    f"INSERT INTO {q}.iam_bindings (id, role_id, principal_id, tenant_id, scope_type, scope_id)"
                    f" VALUES (%s, %s, %s, %s, %s, %s)",
                    (f"bd_{secrets.token_hex(8)}", role, principal, tenant, "tenant" if scope else "root", scope),
                )
        return full


def populate(url: str, schema: str, root_admin: str) -> Population:
    """Two tenants, and the principals of ``IamCase`` plus RemoteIam's service account."""
    w = Writer(url, schema)
    w.tenant(TENANT)
    w.tenant(OTHER_TENANT)
    return Population(
        root_admin=root_admin,
        tenant_admin=w.principal(TENANT, role="compute.admin", scope=TENANT),
        viewer=w.principal(TENANT, role="compute.viewer", scope=TENANT),
        revoked=w.principal(TENANT, role="compute.admin", scope=TENANT, credential="revoked"),
        expired=w.principal(TENANT, role="compute.admin", scope=TENANT, credential="expired"),
        disabled=w.principal(TENANT, role="compute.admin", scope=TENANT, disabled=True),
        authz_client=w.principal("root", role="compute.authz-client", kind="service_account"),
    )


def credential_id(credential: str) -> str:
    parsed = parse(credential)
    assert parsed is not None
    return parsed.id


class StatementCounter:
    """Counts the connections a store takes from its pool: every database access, by any path, takes one."""

    def __init__(self, store: PgStore) -> None:
        self._usage = store.pool_usage
        self._start = self._usage.checkouts

    @property
    def count(self) -> int:
        return self._usage.checkouts - self._start


@attrs.frozen(kw_only=True)
class Central:
    """The control plane that owns IAM; other processes' RemoteIam point at it."""

    compute: BetterCompute
    iam: EmbeddedIam
    store: PgStore
    url: str
    schema: str
    people: Population
    statements: StatementCounter

    async def revoke(self, credential: str) -> None:
        assert await self.iam.revoke(credential_id(credential))


@pytest.fixture
async def central(database_url: str, fresh_schema: str) -> AsyncIterator[Central]:
    store = PgStore(database_url, schema=fresh_schema, pool_size=4)
    iam = EmbeddedIam()
    compute = better_compute(Options(store=store, iam=iam, instance="central"))
    await compute.initialize()
    try:
        boot = await iam.bootstrap()
        assert boot.credential is not None
        people = populate(database_url, fresh_schema, boot.credential)
        yield Central(
            compute=compute,
            iam=iam,
            store=store,
            url=database_url,
            schema=fresh_schema,
            people=people,
            statements=StatementCounter(store),
        )
    finally:
        await compute.close()
