"""Per-test schemas copied from one schema migrated once per session, instead of migrating every test's schema.

A test's schema is a copy of the template made inside PostgreSQL by one ``DO`` block: sequences, tables (columns,
defaults, ``CHECK`` and ``NOT NULL``), primary key, unique and exclusion constraints and the other indexes under
their own names (error translation and ``ON CONFLICT`` may name them), foreign keys, and the rows (the migrations
recorded in ``schema_migrations``, anything a migration seeds). The store and the control plane then find every
migration recorded and apply nothing. ``test_template.py`` checks that a copy and a schema migrated from scratch
cannot be told apart in the catalog.

Functions are made again from their definitions, naming the copy, and triggers of our own after them. Objects the
copy does not know (views, types) make it fail loudly rather than produce a schema with something missing: a
migration that adds one must teach ``template_of`` about it.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import psycopg

__all__ = [
    "Template",
    "clone_schema",
    "copy_script",
    "fingerprint",
    "migrate_template",
    "recycle_schema",
    "template_of",
]

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# What the copy cannot reproduce: relations other than tables, indexes and sequences (TOAST tables come with their
# table), types of our own (a table's row and array types come with it).
_UNKNOWN = """
SELECT 'relation ' || relname FROM pg_class
    WHERE relnamespace = %(ns)s::oid AND relkind NOT IN ('r', 'i', 'S', 't')
UNION ALL SELECT 'type ' || t.typname FROM pg_type t
    WHERE t.typnamespace = %(ns)s::oid AND t.typrelid = 0
    AND NOT EXISTS (SELECT 1 FROM pg_type e WHERE e.oid = t.typelem AND e.typrelid <> 0)
"""
_SEQUENCES = """
SELECT s.relname AS name, format_type(q.seqtypid, NULL) AS type, q.seqincrement, q.seqmin, q.seqmax, q.seqstart,
       q.seqcache, q.seqcycle
FROM pg_sequence q JOIN pg_class s ON s.oid = q.seqrelid WHERE s.relnamespace = %(ns)s::oid ORDER BY s.oid
"""
_TABLES = "SELECT relname FROM pg_class WHERE relnamespace = %(ns)s::oid AND relkind = 'r' ORDER BY oid"
_DEFAULTS = """
SELECT c.relname, a.attname, pg_get_expr(d.adbin, d.adrelid)
FROM pg_attrdef d JOIN pg_class c ON c.oid = d.adrelid JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.adnum
WHERE c.relnamespace = %(ns)s::oid ORDER BY c.oid, a.attnum
"""
_OWNED = """
SELECT s.relname, t.relname, a.attname
FROM pg_class s JOIN pg_depend dep ON dep.classid = 'pg_class'::regclass AND dep.objid = s.oid AND dep.deptype = 'a'
JOIN pg_class t ON t.oid = dep.refobjid JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = dep.refobjsubid
WHERE s.relnamespace = %(ns)s::oid AND s.relkind = 'S' ORDER BY s.oid
"""
_CONSTRAINTS = """
SELECT c.relname, k.conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
WHERE k.connamespace = %(ns)s::oid AND k.contype = ANY(%(types)s) ORDER BY k.oid
"""
_REFERENCES = """
SELECT c.relname, p.relname FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid JOIN pg_class p ON p.oid = k.confrelid
WHERE k.connamespace = %(ns)s::oid AND k.contype = 'f'
"""
_INDEXES = """
SELECT pg_get_indexdef(x.oid) FROM pg_class x JOIN pg_index i ON i.indexrelid = x.oid
WHERE x.relnamespace = %(ns)s::oid AND x.relkind = 'i'
AND x.oid NOT IN (SELECT conindid FROM pg_constraint WHERE connamespace = %(ns)s::oid AND contype IN ('p', 'u', 'x'))
ORDER BY x.oid
"""

# Functions, as ``CREATE OR REPLACE`` statements. Their bodies are text naming the schema: a copy's are rewritten to
# name the copy, and a recycled copy's are made again under its new name (a rename leaves bodies as they were).
_FUNCTIONS = "SELECT pg_get_functiondef(oid) FROM pg_proc WHERE pronamespace = %(ns)s::oid ORDER BY oid"

# Triggers of our own (not a foreign key's), made after the functions they call.
_TRIGGERS = """
SELECT pg_get_triggerdef(g.oid) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
WHERE c.relnamespace = %(ns)s::oid AND NOT g.tgisinternal ORDER BY g.oid
"""

_LIKE = (
    "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING IDENTITY INCLUDING STORAGE"
    " INCLUDING COMMENTS INCLUDING COMPRESSION"
)


def _checked(name: str) -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"not a plain schema name: {name!r}")
    return name


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _namespace(conn: psycopg.Connection[Any], schema: str) -> int | None:
    """The schema's oid, looked up once: a cast in a WHERE clause would be looked up again for every row."""
    found = conn.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return None if found is None else int(found[0])


def copy_script(url: str, template: str) -> str:
    """The SQL that makes a copy of ``template`` under the name ``{dst}``, read once from the catalog.

    Definitions are read with an empty ``search_path``, which qualifies every name in them with its schema:
    replacing ``template.`` by the copy's name points a copied default, index or foreign key at the copy.
    """
    return template_of(url, template).copy


def template_of(url: str, template: str) -> Template:
    """What copying ``template`` and recycling its copies takes, read once from the catalog."""
    src = _checked(template)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET search_path = ''")
        ns = _namespace(conn, src)
        if ns is None:
            raise RuntimeError(f"no template schema {src!r}")
        args = {"ns": ns}
        unknown = [row[0] for row in conn.execute(_UNKNOWN, args)]
        if unknown:
            raise RuntimeError(f"the template schema holds what a test copy cannot reproduce: {unknown}")
        sequences = conn.execute(_SEQUENCES, args).fetchall()
        tables = [row[0] for row in conn.execute(_TABLES, args)]
        defaults = [row for row in conn.execute(_DEFAULTS, args) if f"{src}." in row[2]]
        owned = conn.execute(_OWNED, args).fetchall()
        keys = conn.execute(_CONSTRAINTS, {**args, "types": ["p", "u", "x"]}).fetchall()
        indexes = [row[0] for row in conn.execute(_INDEXES, args)]
        foreign = conn.execute(_CONSTRAINTS, {**args, "types": ["f"]}).fetchall()
        references = conn.execute(_REFERENCES, args).fetchall()
        functions = [row[0] for row in conn.execute(_FUNCTIONS, args)]
        triggers = [row[0] for row in conn.execute(_TRIGGERS, args)]
        seeded = [
            t for t in tables if conn.execute(f"SELECT EXISTS (SELECT FROM {src}.{_ident(t)})").fetchone() == (True,)
        ]
    dst = "{dst}"
    steps = [f"CREATE SCHEMA {dst}"]
    for name, type_, increment, low, high, start, cache, cycle in sequences:
        steps.append(
            f"CREATE SEQUENCE {dst}.{_ident(name)} AS {type_} INCREMENT {increment} MINVALUE {low} MAXVALUE {high}"
            f" START {start} CACHE {cache} {'CYCLE' if cycle else 'NO CYCLE'}"
        )
    steps += [f"CREATE TABLE {dst}.{_ident(t)} (LIKE {src}.{_ident(t)} {_LIKE})" for t in tables]
    # LIKE copies a serial column's default as it is, naming the template's sequence.
    steps += [
        f"ALTER TABLE {dst}.{_ident(t)} ALTER COLUMN {_ident(c)} SET DEFAULT {e.replace(f'{src}.', f'{dst}.')}"
        for t, c, e in defaults
    ]
    steps += [f"ALTER SEQUENCE {dst}.{_ident(s)} OWNED BY {dst}.{_ident(t)}.{_ident(c)}" for s, t, c in owned]
    # Primary key, unique and exclusion constraints each make their index, named after the constraint.
    steps += [f"ALTER TABLE {dst}.{_ident(t)} ADD CONSTRAINT {_ident(k)} {d}" for t, k, d in keys]
    steps += [d.replace(f" ON {src}.", f" ON {dst}.") for d in indexes]
    # The rows (recorded migrations, anything a migration seeds) before the foreign keys that check them.
    rows = [f"INSERT INTO {dst}.{_ident(t)} SELECT * FROM {src}.{_ident(t)}" for t in tables]
    positions = [
        f"SELECT setval('{dst}.{_ident(s)}', last_value, is_called) FROM {src}.{_ident(s)}" for s, *_ in sequences
    ]
    steps += rows
    for t, k, d in foreign:
        target = d.replace(f" REFERENCES {src}.", f" REFERENCES {dst}.")
        steps.append(f"ALTER TABLE {dst}.{_ident(t)} ADD CONSTRAINT {_ident(k)} {target}")
    steps += positions
    made = [f.replace(f'"{src}".', f"{dst}.").replace(f"{src}.", f"{dst}.") for f in functions]
    steps += made
    steps += [t.replace(f" ON {src}.", f" ON {dst}.").replace(f"FUNCTION {src}.", f"FUNCTION {dst}.") for t in triggers]
    # A copy handed back with the template's structure: renamed, emptied (referencing tables first), then given the
    # template's rows and sequence positions again. DELETE, not TRUNCATE: a TRUNCATE gives every table and index a
    # new file and catalog row, which is most of what a copy costs.
    # The functions first: a trigger fired by the emptying runs one, whose body must name the copy by its new name.
    reset = [
        "ALTER SCHEMA {old} RENAME TO {dst}",
        *made,
        *(_emptying(dst, t) for t in _referencing_first(tables, references)),
        *(f"INSERT INTO {dst}.{_ident(t)} SELECT * FROM {src}.{_ident(t)}" for t in seeded),
        *positions,
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        shape = _shape(conn, src)
    assert shape is not None
    return Template(name=src, copy=";\n".join(steps), reset=";\n".join(reset), shape=shape)


_APPEND_ONLY = frozenset({"audit", "audit_chain"})
"""Tables whose trigger refuses DELETE: a copy's are emptied with triggers off (the session as a replica's, which
only a superuser may be), the one way around it."""


def _emptying(dst: str, table: str) -> str:
    delete = f"DELETE FROM {dst}.{_ident(table)}"
    if table not in _APPEND_ONLY:
        return delete
    return f"SET session_replication_role = replica;\n{delete};\nSET session_replication_role = origin"


def _referencing_first(tables: list[str], references: list[tuple[str, str]]) -> list[str]:
    """``tables`` ordered so that a table comes before every table it references (a self-reference aside)."""
    ordered: list[str] = []
    left = list(tables)
    while left:
        ready = [t for t in left if not any(p == t and c in left and c != t for c, p in references)]
        if not ready:
            raise RuntimeError(f"foreign keys in a cycle among {left}: a copy cannot be emptied table by table")
        ordered += ready
        left = [t for t in left if t not in ready]
    return ordered


def clone_schema(url: str, script: str, schema: str) -> None:
    """Create ``schema`` by running ``script`` (from ``copy_script``) in one transaction, in one round trip."""
    sql = script.replace("{dst}", _checked(schema))
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute(sql.encode())


@attrs.frozen(kw_only=True)
class Template:
    """A migrated schema that tests' schemas are copies of: the SQL that copies it (``{dst}`` the copy's name), the
    SQL that resets a copy to it (``{old}`` the copy's name, ``{dst}`` its new one), and its ``shape``."""

    name: str
    copy: str
    reset: str
    shape: str


# Everything about a schema's structure that a test could change, as one digest; rows are not in it. Read with the
# schema alone on the search_path, so that no definition names the schema (an index's always does: taken out) and a
# copy digests as its template does. Every lookup starts from the schema's own entries in pg_depend and goes by
# index, so its cost does not grow with the catalogs (which a server without autovacuum lets bloat).
_SHAPE = """
WITH objects AS MATERIALIZED (
    SELECT classid, objid FROM pg_depend
    WHERE refclassid = 'pg_namespace'::regclass AND refobjid = %(ns)s::oid AND deptype = 'n'
), rel AS MATERIALIZED (
    SELECT c.oid, c.relname, c.relkind FROM objects o JOIN pg_class c ON c.oid = o.objid
    WHERE o.classid = 'pg_class'::regclass
)
SELECT md5(coalesce(string_agg(line, E'\\n' ORDER BY line), '')) FROM (
    SELECT concat_ws(' ', 'relation', c.relname, c.relkind, c.relpersistence, c.relnatts, c.relchecks,
                     c.relhasindex, c.relhastriggers, c.relhasrules, c.relrowsecurity, c.reloptions::text,
                     c.relacl::text) AS line
    FROM rel JOIN pg_class c ON c.oid = rel.oid
    UNION ALL
    SELECT concat_ws(' ', 'object', pg_describe_object(o.classid, o.objid, 0))
    FROM objects o WHERE o.classid <> 'pg_class'::regclass
    UNION ALL
    SELECT concat_ws(' ', 'column', rel.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
                     a.attnotnull, a.attisdropped, a.attidentity, a.attgenerated, a.attcollation,
                     pg_get_expr(d.adbin, d.adrelid))
    FROM rel JOIN pg_attribute a ON a.attrelid = rel.oid AND a.attnum > 0
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    UNION ALL
    SELECT concat_ws(' ', 'constraint', rel.relname, k.conname, k.contype, k.condeferrable, k.condeferred,
                     k.convalidated, pg_get_constraintdef(k.oid))
    FROM rel JOIN pg_constraint k ON k.conrelid = rel.oid
    UNION ALL
    SELECT concat_ws(' ', 'index', replace(pg_get_indexdef(i.indexrelid), %(on)s, ' ON '))
    FROM rel JOIN pg_index i ON i.indrelid = rel.oid
    UNION ALL
    SELECT concat_ws(' ', 'trigger', rel.relname, g.tgname) FROM rel JOIN pg_trigger g ON g.tgrelid = rel.oid
    WHERE NOT g.tgisinternal
    UNION ALL
    SELECT concat_ws(' ', 'sequence', rel.relname, q.seqtypid, q.seqincrement, q.seqmin, q.seqmax, q.seqstart,
                     q.seqcache, q.seqcycle, t.relname, a.attname)
    FROM rel JOIN pg_sequence q ON q.seqrelid = rel.oid
    LEFT JOIN pg_depend dep ON dep.classid = 'pg_class'::regclass AND dep.objid = rel.oid AND dep.deptype = 'a'
    LEFT JOIN pg_class t ON t.oid = dep.refobjid
    LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = dep.refobjsubid
) AS lines
"""


def _shape(conn: psycopg.Connection[Any], schema: str) -> str | None:
    """The digest of ``schema``'s structure (``_SHAPE``), or None when there is no such schema."""
    with conn.transaction():
        ns = _namespace(conn, schema)
        if ns is None:
            return None
        conn.execute(f"SET LOCAL search_path = {_ident(schema)}")
        row = conn.execute(_SHAPE, {"ns": ns, "on": f" ON {schema}."}).fetchone()
    assert row is not None
    return str(row[0])


def recycle_schema(url: str, template: Template, schema: str, new_name: str) -> bool:
    """Reset ``schema`` to a copy of ``template`` under ``new_name``, if its structure is still the template's.

    The test that had it may have written rows, moved sequences, or made, altered or dropped anything: a schema
    whose structure differs in any way (``_SHAPE``), or that is gone, is left as it is and False returned. Its rows
    and sequences are then what a new copy's are; the rename means no later test meets the name it had.
    """
    sql = template.reset.replace("{old}", _checked(schema)).replace("{dst}", _checked(new_name))
    with psycopg.connect(url, autocommit=True) as conn:
        # A session still holding one of its tables (a leak) makes this give up, and the schema is dropped instead.
        conn.execute("SET lock_timeout = '5s'")
        with conn.transaction():
            if _shape(conn, schema) != template.shape:
                return False
            conn.execute(sql.encode())
    return True


async def migrate_template(url: str, schema: str) -> None:
    """Migrate ``schema`` the way ``initialize()`` migrates a control plane's store (the runtime's, the modules' and
    IAM's); the built-in modules make the same tables with or without a KMS."""
    # Imported here: the unit tests import this package's conftest without needing a control plane.
    from bettercompute import Options, better_compute
    from bettercompute_iam import EmbeddedIam
    from bettercompute_store_pg import PgStore

    store = PgStore(url, schema=schema, pool_size=2)
    compute = better_compute(Options(store=store, iam=EmbeddedIam()))
    try:
        await store.open()
        await compute.migrate()
    finally:
        await compute.close()


# What a schema is made of, as the catalog tells it, with the schema's own name taken out of every definition.
_FINGERPRINT = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions, obj_description(c.oid, 'pg_class')
        FROM pg_class c WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind <> 't' ORDER BY c.relname""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
               a.attgenerated, a.attcollation, pg_get_expr(d.adbin, d.adrelid),
               row_number() OVER (PARTITION BY c.relname ORDER BY a.attnum)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attnum""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid), k.condeferrable, k.condeferred
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE k.connamespace = %(s)s::regnamespace ORDER BY c.relname, k.conname""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s ORDER BY indexname""",
    "sequences": """
        SELECT s.relname, q.seqtypid, q.seqincrement, q.seqmin, q.seqmax, q.seqstart, q.seqcache, q.seqcycle,
               t.relname, a.attname
        FROM pg_sequence q JOIN pg_class s ON s.oid = q.seqrelid
        LEFT JOIN pg_depend dep ON dep.classid = 'pg_class'::regclass AND dep.objid = s.oid AND dep.deptype = 'a'
        LEFT JOIN pg_class t ON t.oid = dep.refobjid
        LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = dep.refobjsubid
        WHERE s.relnamespace = %(s)s::regnamespace ORDER BY s.relname""",
    "migrations": "SELECT module, version, name FROM {s}.schema_migrations ORDER BY module, version",
}


def fingerprint(url: str, schema: str) -> dict[str, Any]:
    """What ``schema`` is made of, as the catalog tells it (every part a list of rows, ``rows`` the row counts)."""
    found: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET search_path = ''")  # every name in a definition comes qualified with its schema
        for part, sql in _FINGERPRINT.items():
            rows = conn.execute(sql.replace("{s}", f'"{schema}"'), {"s": schema}).fetchall()
            found[part] = [tuple(str(v).replace(schema, "<schema>") for v in row) for row in rows]
        tables = [row[0] for row in found["relations"] if row[1] == "r"]
        found["rows"] = {t: conn.execute(f'SELECT count(*) FROM "{schema}"."{t}"').fetchone() for t in tables}
    return found
