"""The embedded IAM passes the IAM conformance suite, on real PostgreSQL, with its default 30 s caches."""

from __future__ import annotations

import pytest

from bettercompute.testing import IamCase, IamConformance

from .conftest import OTHER_TENANT, TENANT, Central

pytestmark = [pytest.mark.pg]


class TestEmbeddedIam(IamConformance):
    @pytest.fixture
    def iam_case(self, central: Central) -> IamCase:
        people = central.people
        return IamCase(
            iam=central.iam,
            tenant=TENANT,
            other_tenant=OTHER_TENANT,
            root_admin=people.root_admin,
            tenant_admin=people.tenant_admin,
            viewer=people.viewer,
            revoked=people.revoked,
            expired=people.expired,
            disabled=people.disabled,
            # Every SQL statement the IAM's store runs: a malformed credential must cause none.
            backend_calls=lambda: central.statements.count,
            revoke=central.revoke,
        )
