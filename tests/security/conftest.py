"""The security suites run on the integration suites' fixtures: a migrated schema of its own per test, a control plane
with node identity (``fleet``) and an in-process gateway (``gw``)."""

from tests.integration.conftest import fresh_schema, schema_copy_script, schema_pool, schema_template
from tests.integration.gateway.conftest import gw
from tests.integration.joins.conftest import attestors, certificate_ttl, clock, fleet, kms, modules

__all__ = [
    "attestors",
    "certificate_ttl",
    "clock",
    "fleet",
    "fresh_schema",
    "gw",
    "kms",
    "modules",
    "schema_copy_script",
    "schema_pool",
    "schema_template",
]
