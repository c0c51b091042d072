"""``RemoteIam`` passes the IAM conformance suite against a central control plane, and behaves as another process's
IAM should: it caches identities only for its TTL, tells a caller's bad credential from its own, never leaks the
credential it checks, and works over a real HTTP server."""

from __future__ import annotations

import datetime as dt
import logging
import socket
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
import uvicorn

from bettercompute import Options, better_compute
from bettercompute.errors import AccessDeniedError, NotFoundError, UnauthenticatedError, UnavailableError
from bettercompute.modules.system import WhoamiInput
from bettercompute.ports import ResourceRef
from bettercompute.testing import IamCase, IamConformance
from bettercompute_iam import RemoteIam
from bettercompute_store_pg import PgStore

from .conftest import OTHER_TENANT, TENANT, Central

pytestmark = [pytest.mark.pg]

NO_CACHE = dt.timedelta(0)


class CountingTransport(httpx.AsyncBaseTransport):
    """Passes requests on, counting them: the remote IAM's backend calls."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return await self.inner.handle_async_request(request)


def remote(central: Central, credential: str, *, cache_ttl: dt.timedelta = NO_CACHE) -> RemoteIam:
    transport = CountingTransport(httpx.ASGITransport(app=central.compute.asgi))
    return RemoteIam("http://central", credential, cache_ttl=cache_ttl, transport=transport)


def requests_of(iam: RemoteIam) -> int:
    transport = iam._client._http._transport  # the CountingTransport given to remote()
    assert isinstance(transport, CountingTransport)
    return transport.requests


class TestRemoteIam(IamConformance):
    @pytest.fixture
    async def iam_case(self, central: Central) -> AsyncIterator[IamCase]:
        people = central.people
        # No identity cache: the suite revokes a credential and expects the next authenticate to see it.
        iam = remote(central, people.authz_client)
        try:
            yield IamCase(
                iam=iam,
                tenant=TENANT,
                other_tenant=OTHER_TENANT,
                root_admin=people.root_admin,
                tenant_admin=people.tenant_admin,
                viewer=people.viewer,
                revoked=people.revoked,
                expired=people.expired,
                disabled=people.disabled,
                backend_calls=lambda: requests_of(iam),
                revoke=central.revoke,
            )
        finally:
            await iam.aclose()


@pytest.mark.anyio
async def test_a_revoked_credential_works_elsewhere_only_until_the_cache_ttl_passes(central: Central) -> None:
    iam = remote(central, central.people.authz_client, cache_ttl=dt.timedelta(seconds=1))
    try:
        viewer = central.people.viewer
        identity = await iam.authenticate(viewer)
        await central.revoke(viewer)
        with pytest.raises(UnauthenticatedError):
            await central.iam.authenticate(viewer)  # the central process sees it at once
        asked = requests_of(iam)
        assert await iam.authenticate(viewer) == identity  # this process trusts its cache, without asking
        assert requests_of(iam) == asked
        await anyio.sleep(1.2)
        with pytest.raises(UnauthenticatedError):
            await iam.authenticate(viewer)
        # A refusal is not cached: the next attempt asks again.
        with pytest.raises(UnauthenticatedError):
            await iam.authenticate(viewer)
        assert requests_of(iam) == asked + 2
    finally:
        await iam.aclose()


@pytest.mark.anyio
async def test_an_api_process_runs_on_remote_iam(central: Central) -> None:
    iam = remote(central, central.people.authz_client, cache_ttl=dt.timedelta(seconds=30))
    api = better_compute(Options(store=PgStore(central.url, schema=central.schema, pool_size=2), iam=iam))
    try:
        # RemoteIam is no module: it adds no group, so this process serves no authz methods of its own.
        assert api.registry.group("authz") is None
        await api.initialize()
        people = central.people
        here = await api.api.system.whoami(people.viewer, WhoamiInput())
        there = await central.compute.api.system.whoami(people.viewer, WhoamiInput())
        assert here == there
        assert here.tenant_id == TENANT and not here.is_root
        with pytest.raises(UnauthenticatedError):
            await api.api.system.whoami(people.revoked, WhoamiInput())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api.asgi), base_url="http://api") as http:
            ok = await http.post("/api/compute/system/whoami", headers=_bearer(people.tenant_admin), json={})
            assert ok.status_code == 200 and ok.json()["data"]["tenant_id"] == TENANT
            refused = await http.post("/api/compute/system/whoami", headers=_bearer(people.expired), json={})
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "UNAUTHENTICATED"
    finally:
        await api.close()
        await iam.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("whose", ["viewer", "revoked", "tenant_admin"])
async def test_this_process_credential_refused_is_unavailable_not_the_callers_fault(
    central: Central, whose: str
) -> None:
    # A viewer and a tenant admin lack a root-scope iam:authz:* grant; a revoked credential is no credential.
    iam = remote(central, getattr(central.people, whose))
    try:
        with pytest.raises(UnavailableError) as info:
            await iam.authenticate(central.people.root_admin)
        assert info.value.details["code"] in ("ACCESS_DENIED", "UNAUTHENTICATED")
        root = await central.iam.authenticate(central.people.root_admin)
        with pytest.raises(UnavailableError):
            await iam.require(root, "compute:x:create", ResourceRef(type="x"))
    finally:
        await iam.aclose()


@pytest.mark.anyio
async def test_an_unreachable_central_iam_is_unavailable(central: Central) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port once the probe is closed.
    iam = RemoteIam(f"http://127.0.0.1:{port}", central.people.authz_client, timeout=2)
    try:
        with pytest.raises(UnavailableError):
            await iam.authenticate(central.people.viewer)
        root = await central.iam.authenticate(central.people.root_admin)
        with pytest.raises(UnavailableError):
            await iam.require(root, "compute:x:create", ResourceRef(type="x"))
    finally:
        await iam.aclose()


def _bearer(credential: str) -> dict[str, str]:
    return {"authorization": f"Bearer {credential}"}


@pytest.mark.anyio
async def test_the_authz_group_never_echoes_or_logs_the_checked_credential(
    central: Central, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    people = central.people
    checked = [people.revoked, people.expired, people.disabled, people.viewer[:-1] + "#", people.viewer + "\n"]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=central.compute.asgi), base_url="http://c") as http:
        for credential in checked:
            response = await http.post(
                "/api/compute/authz/authenticate", headers=_bearer(people.authz_client), json={"credential": credential}
            )
            assert response.status_code == 401
            error = response.json()["error"]
            # Distinguishable from the caller's own credential being refused.
            assert error["code"] == "UNAUTHENTICATED" and error["details"] == {"subject": True}
            assert credential.strip() not in response.text
        # The caller's own credential refused: the same code without the flag.
        own = await http.post(
            "/api/compute/authz/authenticate", headers=_bearer(people.revoked), json={"credential": people.viewer}
        )
        assert own.status_code == 401 and "subject" not in own.json()["error"]["details"]
        # Only a root-scope grant opens the group: a tenant admin holds iam:*:* on its tenant, not on authz.
        tenant_admin = await http.post(
            "/api/compute/authz/authenticate", headers=_bearer(people.tenant_admin), json={"credential": people.viewer}
        )
        assert tenant_admin.status_code == 403
        assert people.viewer not in tenant_admin.text
    iam = remote(central, people.authz_client)
    try:
        for credential in checked:
            with pytest.raises(UnauthenticatedError) as info:
                await iam.authenticate(credential)
            assert info.value.details == {}
            assert credential.strip() not in str(info.value)
    finally:
        await iam.aclose()
    assert caplog.records, "the test must see the log lines it checks"
    for credential in [*checked, people.viewer]:
        assert credential.strip() not in caplog.text
        assert credential.split(".")[1][:20] not in caplog.text


@pytest.mark.anyio
async def test_decide_answers_with_the_subject_decision(central: Central) -> None:
    iam = remote(central, central.people.authz_client)
    try:
        admin = await iam.authenticate(central.people.tenant_admin)
        resource = ResourceRef(type="reservations", id="r-1", tenant=TENANT, pool="p-1")
        decision = await iam.require(admin, "compute:reservations:create", resource)
        assert decision.resource == resource and decision.principal_id == admin.principal_id
        with pytest.raises(AccessDeniedError) as info:
            await iam.require(admin, "compute:reservations:create", ResourceRef(type="reservations"))
        assert info.value.details == {"action": "compute:reservations:create"}
    finally:
        await iam.aclose()


@pytest.mark.anyio
async def test_an_id_the_subject_may_not_see_is_not_found_remotely_as_in_process(central: Central) -> None:
    async with central.store.transaction() as tx:
        await tx.project(ResourceRef(type="join-token", id="jt_theirs", tenant=OTHER_TENANT, pool="p-9"))
    iam = remote(central, central.people.authz_client)
    try:
        admin = await central.iam.authenticate(central.people.tenant_admin)
        for target in ("jt_theirs", "jt_unknown"):
            resource = ResourceRef(type="join-token", id=target)
            answers = []
            for asked in (central.iam, iam):
                with pytest.raises(NotFoundError) as info:
                    await asked.require(admin, "compute:join-tokens:get", resource)
                answers.append((info.value.message, info.value.details))
            # Not an outage (UnavailableError), and not marked as being about the asking process.
            assert answers == [("no such join token", {"id": target})] * 2
    finally:
        await iam.aclose()


@pytest.mark.anyio
async def test_remote_iam_over_a_real_http_server(central: Central) -> None:
    # TCP named, so that asyncio turns Nagle off on its connections (else ~40 ms a keep-alive request).
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    # Listening before uvicorn starts: connections wait in the backlog, so there is no start-up to wait for.
    listener.listen()
    port = listener.getsockname()[1]
    config = uvicorn.Config(central.compute.asgi, lifespan="off", log_level="warning", http="h11", ws="none")
    server = uvicorn.Server(config)
    people = central.people
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [listener])
        iam = RemoteIam(f"http://127.0.0.1:{port}", people.authz_client, cache_ttl=NO_CACHE)
        api = better_compute(Options(store=PgStore(central.url, schema=central.schema, pool_size=2), iam=iam))
        try:
            await api.initialize()
            whoami = await api.api.system.whoami(people.tenant_admin, WhoamiInput())
            assert whoami.tenant_id == TENANT
            admin = await iam.authenticate(people.tenant_admin)
            resource = ResourceRef(type="x", tenant=TENANT)
            assert (await iam.require(admin, "compute:x:create", resource)).principal_id == admin.principal_id
            with pytest.raises(AccessDeniedError):
                await iam.require(admin, "compute:x:create", ResourceRef(type="x", tenant=OTHER_TENANT))
            with pytest.raises(UnauthenticatedError):
                await api.api.system.whoami(people.revoked, WhoamiInput())
        finally:
            await api.close()
            await iam.aclose()
            server.should_exit = True
