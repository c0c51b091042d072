"""Every SQL statement of IAM's tables, in one place: their migrations (module ``iam``), then the statements the
adapters run, by table. ``IamTables`` (``_engine``: authentication, bootstrap, expiry) and ``IamAdmin`` (``_admin``:
the method groups) build them once, with ``{s}`` standing for the store's quoted schema (``Database.sql``).

The projection ``authz_resources`` is the store's table; IAM only reads it, to find the tenant of a pool scope.
"""

from __future__ import annotations

from bettercompute.ports import Migration

__all__ = [
    "ACTIVE_CREDENTIALS",
    "ADVISORY_LOCK",
    "BINDING_PARTS",
    "BIND_ROOT_ADMIN",
    "CREDENTIAL",
    "DELETE_BINDING",
    "DISABLE_PRINCIPAL",
    "ENSURE_PRINCIPAL",
    "ENSURE_ROOT",
    "EXPIRE_CREDENTIALS",
    "GRANTS",
    "INSERT_BINDING",
    "INSERT_CREDENTIAL",
    "INSERT_PRINCIPAL",
    "INSERT_ROLE",
    "INSERT_TENANT",
    "LIST_BINDINGS",
    "LIST_CREDENTIALS",
    "LIST_PRINCIPALS",
    "LIST_ROLES",
    "LIST_TENANTS",
    "LOCK_BINDING",
    "LOCK_CREDENTIAL",
    "LOCK_PRINCIPAL",
    "MIGRATIONS",
    "ORPHANED_PROJECTIONS",
    "POOL_TENANT",
    "PRINCIPAL_GRANTS",
    "PROJECTED",
    "REVOKE_CREDENTIAL",
    "REVOKE_CREDENTIALS",
    "ROLE_ACTIONS",
    "ROOT_ADMINS",
    "SHARE_PRINCIPAL",
    "STORE_CREDENTIAL",
    "TOUCH_CREDENTIAL",
    "UPSERT_BUILTIN_ROLES",
]

# --- the tables ------------------------------------------------------------------------------------------------------

MIGRATIONS = (
    Migration(
        version=1,
        name="tenants, principals and credentials",
        sql="""
CREATE TABLE {schema}.iam_tenants (
    id          text PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {schema}.iam_principals (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES {schema}.iam_tenants (id),
    kind        text NOT NULL CHECK (kind IN ('user', 'service_account')),
    name        text NOT NULL,
    disabled_at timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);
CREATE TABLE {schema}.iam_credentials (
    id           text PRIMARY KEY,
    principal_id text NOT NULL REFERENCES {schema}.iam_principals (id),
    secret_hash  bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    revoked_at   timestamptz,
    last_used_at timestamptz
);
CREATE INDEX iam_credentials_principal ON {schema}.iam_credentials (principal_id);
""",
    ),
    Migration(
        version=2,
        name="roles and bindings",
        sql="""
ALTER TABLE {schema}.iam_credentials
    ADD COLUMN description text NOT NULL DEFAULT '',
    ADD COLUMN expired_at timestamptz;
CREATE INDEX iam_credentials_expiring ON {schema}.iam_credentials (expires_at)
    WHERE revoked_at IS NULL AND expired_at IS NULL AND expires_at IS NOT NULL;
CREATE TABLE {schema}.iam_roles (
    id          text PRIMARY KEY,
    tenant_id   text REFERENCES {schema}.iam_tenants (id),
    name        text NOT NULL,
    actions     text[] NOT NULL,
    description text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX iam_roles_name ON {schema}.iam_roles (coalesce(tenant_id, ''), name);
CREATE TABLE {schema}.iam_bindings (
    id           text PRIMARY KEY,
    role_id      text NOT NULL REFERENCES {schema}.iam_roles (id),
    principal_id text NOT NULL REFERENCES {schema}.iam_principals (id),
    tenant_id    text NOT NULL REFERENCES {schema}.iam_tenants (id),
    scope_type   text NOT NULL CHECK (scope_type IN ('root', 'tenant', 'pool')),
    scope_id     text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((scope_type = 'root') = (scope_id IS NULL))
);
CREATE UNIQUE INDEX iam_bindings_unique
    ON {schema}.iam_bindings (role_id, principal_id, scope_type, coalesce(scope_id, ''));
CREATE INDEX iam_bindings_principal ON {schema}.iam_bindings (principal_id);
CREATE INDEX iam_bindings_tenant ON {schema}.iam_bindings (tenant_id);
""",
    ),
)


def _after(created_at: str, id: str) -> str:
    # Keyset paging on (created_at, id): rows after the previous page's last key, or all rows for the first page.
    return f"(CAST(:after_at AS timestamptz) IS NULL OR ({created_at}, {id}) > (:after_at, :after_id))"


# What the admin statements return of each table, in the order ``_admin``'s row readers take them.
_PRINCIPAL = "p.id, p.tenant_id, p.name, p.kind, p.disabled_at, p.created_at"
_CREDENTIAL = (
    "c.id, c.principal_id, c.description, c.created_at, c.expires_at, c.revoked_at, c.last_used_at,"
    " CASE WHEN c.revoked_at IS NOT NULL THEN 'revoked'"
    " WHEN c.expired_at IS NOT NULL OR c.expires_at <= now() THEN 'expired' ELSE 'active' END"
)
_BINDING = "b.id, b.tenant_id, b.principal_id, b.role_id, r.name, b.scope_type, b.scope_id, b.created_at"
_ROLE = "r.id, r.tenant_id, r.name, r.actions, r.description, r.created_at"

# Serializes a change across processes until the transaction ends (the key names what is serialized).
ADVISORY_LOCK = "SELECT pg_advisory_xact_lock(hashtext(:key))"

# --- iam_tenants -----------------------------------------------------------------------------------------------------

INSERT_TENANT = "INSERT INTO {s}.iam_tenants (id, name) VALUES (:id, :name) RETURNING id, name, created_at"
LIST_TENANTS = (
    "SELECT id, name, created_at FROM {s}.iam_tenants WHERE " + _after("created_at", "id") + " ORDER BY created_at, id"
    " LIMIT :limit"
)
ENSURE_ROOT = "INSERT INTO {s}.iam_tenants (id, name) VALUES (:id, :id) ON CONFLICT (id) DO NOTHING"

# --- iam_principals --------------------------------------------------------------------------------------------------

INSERT_PRINCIPAL = (
    "INSERT INTO {s}.iam_principals AS p (id, tenant_id, kind, name) VALUES (:id, :tenant, :kind, :name)"
    " RETURNING " + _PRINCIPAL
)
LIST_PRINCIPALS = (
    "SELECT " + _PRINCIPAL + " FROM {s}.iam_principals p"
    " WHERE p.tenant_id = :tenant AND " + _after("p.created_at", "p.id") + " ORDER BY p.created_at, p.id LIMIT :limit"
)
# FOR UPDATE: a disable and a new credential (FOR SHARE) for the same principal do not interleave.
LOCK_PRINCIPAL = (
    "SELECT " + _PRINCIPAL + " FROM {s}.iam_principals p WHERE p.id = :id AND p.tenant_id = :tenant FOR UPDATE"
)
SHARE_PRINCIPAL = (
    "SELECT " + _PRINCIPAL + " FROM {s}.iam_principals p WHERE p.id = :id AND p.tenant_id = :tenant FOR SHARE"
)
DISABLE_PRINCIPAL = (
    "UPDATE {s}.iam_principals AS p SET disabled_at = coalesce(p.disabled_at, now()) WHERE p.id = :id"
    " RETURNING " + _PRINCIPAL
)
# Bootstrap's root admin: made, or enabled again.
ENSURE_PRINCIPAL = (
    "INSERT INTO {s}.iam_principals (id, tenant_id, kind, name) VALUES (:id, :tenant, :kind, :name)"
    " ON CONFLICT (tenant_id, name) DO UPDATE SET disabled_at = NULL"
    " RETURNING id"
)

# --- iam_credentials -------------------------------------------------------------------------------------------------

# Authentication's hot read, and its touch.
CREDENTIAL = (
    "SELECT c.id, c.secret_hash, p.id AS principal_id, p.name AS principal_name, p.kind, p.tenant_id,"
    " (c.revoked_at IS NULL AND (c.expires_at IS NULL OR c.expires_at > now()) AND p.disabled_at IS NULL)"
    " AS usable, c.expires_at, c.last_used_at"
    " FROM {s}.iam_credentials c JOIN {s}.iam_principals p ON p.id = c.principal_id WHERE c.id = :id"
)
TOUCH_CREDENTIAL = "UPDATE {s}.iam_credentials SET last_used_at = now() WHERE id = :id"
INSERT_CREDENTIAL = (
    "INSERT INTO {s}.iam_credentials AS c (id, principal_id, secret_hash, description, expires_at)"
    " VALUES (:id, :principal, :hash, :description,"
    " now() + make_interval(secs => CAST(:seconds AS double precision)))"
    " RETURNING " + _CREDENTIAL
)
LIST_CREDENTIALS = (
    "SELECT " + _CREDENTIAL + " FROM {s}.iam_credentials c JOIN {s}.iam_principals p ON p.id = c.principal_id"
    " WHERE p.tenant_id = :tenant AND (CAST(:principal AS text) IS NULL OR c.principal_id = :principal)"
    " AND " + _after("c.created_at", "c.id") + " ORDER BY c.created_at, c.id LIMIT :limit"
)
LOCK_CREDENTIAL = (
    "SELECT c.principal_id FROM {s}.iam_credentials c JOIN {s}.iam_principals p ON p.id = c.principal_id"
    " WHERE c.id = :id AND p.tenant_id = :tenant FOR UPDATE OF c"
)
REVOKE_CREDENTIAL = (
    "WITH old AS (SELECT c.id, c.revoked_at FROM {s}.iam_credentials c"
    " JOIN {s}.iam_principals p ON p.id = c.principal_id"
    " WHERE c.id = :id AND p.tenant_id = :tenant FOR UPDATE OF c)"
    " UPDATE {s}.iam_credentials AS c SET revoked_at = coalesce(old.revoked_at, now())"
    " FROM old WHERE c.id = old.id RETURNING " + _CREDENTIAL + ", old.revoked_at IS NULL"
)
# Bootstrap's: the root admin's usable credentials, revoking them, storing the new one.
ACTIVE_CREDENTIALS = (
    "SELECT id FROM {s}.iam_credentials WHERE principal_id = :principal AND revoked_at IS NULL"
    " AND (expires_at IS NULL OR expires_at > now()) ORDER BY created_at FOR UPDATE"
)
REVOKE_CREDENTIALS = (
    "UPDATE {s}.iam_credentials SET revoked_at = now() WHERE id = ANY(:ids) AND revoked_at IS NULL RETURNING id"
)
STORE_CREDENTIAL = (
    "INSERT INTO {s}.iam_credentials (id, principal_id, secret_hash, expires_at)"
    " VALUES (:id, :principal, :hash, :expires_at)"
)
EXPIRE_CREDENTIALS = (
    "UPDATE {s}.iam_credentials SET expired_at = expires_at"
    " WHERE id IN (SELECT id FROM {s}.iam_credentials"
    "  WHERE revoked_at IS NULL AND expired_at IS NULL AND expires_at IS NOT NULL AND expires_at <= now()"
    "  ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED)"
    " RETURNING id, principal_id, (SELECT tenant_id FROM {s}.iam_principals p WHERE p.id = principal_id)"
)

# --- iam_roles -------------------------------------------------------------------------------------------------------

INSERT_ROLE = (
    "INSERT INTO {s}.iam_roles AS r (id, tenant_id, name, actions, description)"
    " VALUES (:id, :tenant, :name, :actions, :description) RETURNING " + _ROLE
)
LIST_ROLES = (
    "SELECT " + _ROLE + " FROM {s}.iam_roles r WHERE (r.tenant_id IS NULL OR r.tenant_id = :tenant)"
    " AND (CAST(:after_custom AS boolean) IS NULL OR (r.tenant_id IS NOT NULL, r.created_at, r.id)"
    " > (CAST(:after_custom AS boolean), :after_at, :after_id))"
    " ORDER BY r.tenant_id IS NOT NULL, r.created_at, r.id LIMIT :limit"
)
ROLE_ACTIONS = "SELECT actions FROM {s}.iam_roles WHERE id = :role AND (tenant_id IS NULL OR tenant_id = :tenant)"
UPSERT_BUILTIN_ROLES = (
    "INSERT INTO {s}.iam_roles AS r (id, tenant_id, name, actions, description)"
    " SELECT j.key, NULL, j.key, ARRAY(SELECT jsonb_array_elements_text(j.value)), 'built-in'"
    " FROM jsonb_each(CAST(:roles AS jsonb)) AS j"
    # Only ever adds: processes composed with other modules share the schema, and none may take away the actions
    # another one's declarations put in a built-in role.
    " ON CONFLICT (id) DO UPDATE"
    " SET actions = ARRAY(SELECT DISTINCT a FROM unnest(r.actions || EXCLUDED.actions) AS a ORDER BY a)"
    " WHERE NOT (r.actions @> EXCLUDED.actions)"
)

# --- iam_bindings ----------------------------------------------------------------------------------------------------

INSERT_BINDING = (
    "WITH b AS (INSERT INTO {s}.iam_bindings (id, role_id, principal_id, tenant_id, scope_type, scope_id)"
    " SELECT :id, r.id, p.id, p.tenant_id, :scope_type, :scope_id"
    " FROM {s}.iam_principals p, {s}.iam_roles r"
    " WHERE p.id = :principal AND p.tenant_id = :tenant"
    " AND r.id = :role AND (r.tenant_id IS NULL OR r.tenant_id = :tenant)"
    " RETURNING *)"
    " SELECT " + _BINDING + " FROM b JOIN {s}.iam_roles r ON r.id = b.role_id"
)
# Why INSERT_BINDING inserted nothing: whether the principal, and the role, are the tenant's.
BINDING_PARTS = (
    "SELECT EXISTS (SELECT 1 FROM {s}.iam_principals WHERE id = :principal AND tenant_id = :tenant),"
    " EXISTS (SELECT 1 FROM {s}.iam_roles WHERE id = :role AND (tenant_id IS NULL OR tenant_id = :tenant))"
)
LIST_BINDINGS = (
    "SELECT " + _BINDING + " FROM {s}.iam_bindings b JOIN {s}.iam_roles r ON r.id = b.role_id"
    " WHERE b.tenant_id = :tenant AND (CAST(:principal AS text) IS NULL OR b.principal_id = :principal)"
    " AND " + _after("b.created_at", "b.id") + " ORDER BY b.created_at, b.id LIMIT :limit"
)
LOCK_BINDING = (
    "SELECT " + _BINDING + " FROM {s}.iam_bindings b JOIN {s}.iam_roles r ON r.id = b.role_id"
    " WHERE b.id = :id AND b.tenant_id = :tenant FOR UPDATE OF b"
)
DELETE_BINDING = "DELETE FROM {s}.iam_bindings WHERE id = :id"
BIND_ROOT_ADMIN = (
    "INSERT INTO {s}.iam_bindings (id, role_id, principal_id, tenant_id, scope_type, scope_id)"
    " VALUES (:id, 'compute.admin', :principal, :tenant, 'root', NULL)"
    " ON CONFLICT DO NOTHING"
)
# Root-scope compute.admin bindings of enabled principals: all, and those left without a principal or a binding.
ROOT_ADMINS = (
    "SELECT count(*),"
    " count(*) FILTER (WHERE b.principal_id <> coalesce(CAST(:principal AS text), '')"
    " AND b.id <> coalesce(CAST(:binding AS text), ''))"
    " FROM {s}.iam_bindings b JOIN {s}.iam_principals p ON p.id = b.principal_id"
    " WHERE b.role_id = 'compute.admin' AND b.scope_type = 'root' AND p.disabled_at IS NULL"
)

# A binding's grant: its role's actions and its scope. A pool scope lies in the tenant the authorization projection
# records for the pool (None: no such pool).
GRANTS = (
    "SELECT b.principal_id, r.actions, b.scope_type, b.scope_id,"
    " CASE b.scope_type WHEN 'tenant' THEN b.scope_id WHEN 'pool' THEN pr.tenant_id END"
    " FROM {s}.iam_bindings b JOIN {s}.iam_roles r ON r.id = b.role_id"
    " LEFT JOIN {s}.authz_resources pr"
    " ON b.scope_type = 'pool' AND pr.resource_type = 'pool' AND pr.resource_id = b.scope_id"
    " WHERE b.principal_id = ANY(:principals)"
)
PRINCIPAL_GRANTS = (
    "SELECT r.actions, b.scope_type, b.scope_id,"
    " CASE b.scope_type WHEN 'tenant' THEN b.scope_id WHEN 'pool' THEN pr.tenant_id END AS scope_tenant"
    " FROM {s}.iam_bindings b JOIN {s}.iam_roles r ON r.id = b.role_id"
    " LEFT JOIN {s}.authz_resources pr"
    " ON b.scope_type = 'pool' AND pr.resource_type = 'pool' AND pr.resource_id = b.scope_id"
    " WHERE b.principal_id = :principal"
)

# --- authz_resources (the store's projection, read only) -------------------------------------------------------------

POOL_TENANT = "SELECT tenant_id FROM {s}.authz_resources WHERE resource_type = 'pool' AND resource_id = :pool"
PROJECTED = "SELECT tenant_id, pool_id FROM {s}.authz_resources WHERE resource_type = :type AND resource_id = :id"
# Projected resources whose tenant IAM does not know.
ORPHANED_PROJECTIONS = (
    "SELECT count(*) AS n FROM {s}.authz_resources r"
    " WHERE NOT EXISTS (SELECT 1 FROM {s}.iam_tenants t WHERE t.id = r.tenant_id)"
)
