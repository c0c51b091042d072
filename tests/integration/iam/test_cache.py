"""A revoke that commits while an authentication of the same credential is in flight is not undone by it."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from bettercompute.errors import UnauthenticatedError
from bettercompute_iam import CreateCredentialInput, CreatePrincipalInput, IamGroups, RevokeCredentialInput

from ..conftest import Plane

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_an_in_flight_authentication_does_not_cache_a_revoked_credential(plane: Plane) -> None:
    api = plane.compute.api
    bob = await IamGroups(api).principals.create(
        plane.root, CreatePrincipalInput(tenant="root", name="bob", kind="user")
    )
    created = await IamGroups(api).credentials.create(
        plane.root, CreateCredentialInput(tenant="root", principal_id=bob.id, expires_in_seconds=None)
    )
    tables: Any = plane.iam._tables  # the real IAM tables, slowed down at one point to open the race window
    read = tables.credential
    row_read, revoked = anyio.Event(), anyio.Event()

    async def slow_read(credential_id: str) -> Any:
        row = await read(credential_id)  # read before the revoke commits ...
        row_read.set()
        await revoked.wait()  # ... and handed back after it
        return row

    tables.credential = slow_read
    async with anyio.create_task_group() as tg:
        tg.start_soon(plane.iam.authenticate, created.credential)
        await row_read.wait()
        tables.credential = read
        await IamGroups(api).credentials.revoke(
            plane.root, RevokeCredentialInput(tenant="root", credential_id=created.id)
        )
        revoked.set()
    with pytest.raises(UnauthenticatedError):
        await plane.iam.authenticate(created.credential)
