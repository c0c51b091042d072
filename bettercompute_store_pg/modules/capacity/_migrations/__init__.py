"""The ``capacity`` module's tables and functions (quota rows, reservations and admission), one file per version.

The runner records each version under the module's name (``schema_migrations``), so a recorded version's SQL never
changes: a change is a new version, in a file of its own. The functions are redefined from version to version; how
they read today is in ``bettercompute_store_pg/schema.sql``.
"""

from __future__ import annotations

from bettercompute.ports import Migration

from ._v1_quotas import MIGRATION as _V1
from ._v2_admission import MIGRATION as _V2
from ._v3_placement_hints import MIGRATION as _V3
from ._v4_draft_keys import MIGRATION as _V4

__all__ = ["MIGRATIONS"]

MIGRATIONS: tuple[Migration, ...] = (_V1, _V2, _V3, _V4)
