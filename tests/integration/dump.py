"""Everything a schema holds, as one text, for tests that prove a secret is nowhere in the database."""

from __future__ import annotations

import psycopg


def dump_schema(url: str, schema: str) -> str:
    """Every row of every table of the schema, as text (bytea both as hex and as raw bytes)."""
    out: list[str] = []
    with psycopg.connect(url) as conn:
        tables = [
            r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall()
        ]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"').fetchall():
                for cell in row:
                    if isinstance(cell, bytes | memoryview):
                        raw = bytes(cell)
                        out.append(raw.hex())
                        out.append(raw.decode("latin-1"))
                    else:
                        out.append(str(cell))
    return "\n".join(out)
