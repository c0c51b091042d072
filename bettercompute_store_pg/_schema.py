"""The rules for schema names, how migrations name the schema, and the lock that serializes them.

Until before the first public release this file also held the frozen migrations of the old single module
``"core"``; ``_migrations`` says why they went.
"""

from __future__ import annotations

import hashlib
import re

from bettercompute.errors import InvalidConfigError

__all__ = ["migration_lock_key", "quote_schema", "render", "validate_schema"]

# Lower-case only, so the quoted name and the name PostgreSQL reports are the same string; 63 bytes is NAMEDATALEN-1.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def validate_schema(schema: str) -> str:
    """Return ``schema`` if it is a safe, lower-case PostgreSQL identifier.

    Raises:
        InvalidConfigError: The name is empty, too long, or has characters other than ``a-z``, ``0-9`` and ``_``.
    """
    if not _SCHEMA_NAME.fullmatch(schema) or schema.startswith("pg_"):
        raise InvalidConfigError(
            "the schema name must be a lower-case identifier of at most 63 characters, not starting with pg_",
            details={"problems": [{"path": "schema", "value": schema}]},
        )
    return schema


def quote_schema(schema: str) -> str:
    """The schema name as a quoted identifier (``validate_schema`` guarantees there is no quote inside)."""
    return f'"{validate_schema(schema)}"'


def render(sql: str, schema: str) -> str:
    """Replace ``{schema}`` in ``sql`` by the quoted schema name.

    Plain replacement rather than ``str.format`` because SQL is full of braces (``'{}'::jsonb``).
    """
    return sql.replace("{schema}", quote_schema(schema))


def migration_lock_key(schema: str) -> int:
    """The advisory lock key that serializes migrations of one schema across every process (a signed 64-bit int)."""
    digest = hashlib.sha256(f"bettercompute.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
