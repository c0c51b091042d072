"""Principals made with SQL, so these tests do not depend on the IAM methods they check."""

from __future__ import annotations

import secrets

import psycopg

from bettercompute_iam._credentials import mint


def add_tenant(url: str, schema: str, name: str) -> str:
    """A tenant; returns its id."""
    tenant = f"tn_{secrets.token_hex(8)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{schema}".iam_tenants (id, name) VALUES (%s, %s)', (tenant, name))
    return tenant


def add_principal(
    url: str, schema: str, tenant: str, patterns: list[str], *, scope_type: str = "root", scope_id: str | None = None
) -> str:
    """A principal of ``tenant`` bound on a scope to a role of exactly ``patterns``; returns its credential."""
    principal = f"pr_{secrets.token_hex(8)}"
    role = f"ro_{secrets.token_hex(8)}"
    credential_id, credential, secret_hash = mint()
    q = f'"{schema}"'
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {q}.iam_principals (id, tenant_id, kind, name) VALUES (%s, %s, 'service_account', %s)",
            (principal, tenant, principal),
        )
        conn.execute(
            f"INSERT INTO {q}.iam_credentials (id, principal_id, secret_hash) VALUES (%s, %s, %s)",
            (credential_id, principal, secret_hash),
        )
        conn.execute(
            f"INSERT INTO {q}.iam_roles (id, tenant_id, name, actions) VALUES (%s, %s, %s, %s)",
            (role, tenant, role, patterns),
        )
        conn.execute(
            f"INSERT INTO {q}.iam_bindings (id, role_id, principal_id, tenant_id, scope_type, scope_id)"
            f" VALUES (%s, %s, %s, %s, %s, %s)",
            (f"bd_{secrets.token_hex(8)}", role, principal, tenant, scope_type, scope_id),
        )
    return credential
