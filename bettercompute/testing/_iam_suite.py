"""``IamConformance``: the behaviour every ``bettercompute.ports.Iam`` promises, as pytest tests.

Subclass it in a test module and provide an ``iam_case`` fixture returning an ``IamCase`` (and an ``anyio_backend``
fixture)::

    class TestMyIam(IamConformance):
        @pytest.fixture
        async def iam_case(self) -> AsyncIterator[IamCase]: ...

The case holds the IAM under test and credentials the subclass prepared, in Better IAM's roles: a root admin
(``compute.admin`` on the root scope), an admin of tenant ``tenant`` (``compute.admin`` on that tenant), a viewer of
the same tenant (``compute.viewer``), and credentials that must be refused: revoked, expired, and one of a disabled
principal. ``backend_calls`` counts the questions the IAM asked its backend (database statements, HTTP requests),
so the suite can prove a malformed credential is refused without asking. An IAM that caches identities must see a
revocation at once in these runs (a cache time of zero, or one that a revoke in the same process clears).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import attrs
import pytest

from bettercompute.errors import AccessDeniedError, UnauthenticatedError
from bettercompute.ports import Decision, Iam, Identity, ResourceRef

__all__ = ["IamCase", "IamConformance"]


@attrs.frozen(kw_only=True)
class IamCase:
    """What a subclass of ``IamConformance`` prepares for each test.

    Args:
        iam: The implementation under test, ready to use.
        tenant: The id of the tenant the tenant admin and the viewer belong to and are bound on.
        other_tenant: The id of a second tenant, on which none of them is bound.
        root_admin: A credential of a root-tenant principal bound to ``compute.admin`` on the root scope.
        tenant_admin: A credential of a principal of ``tenant`` bound to ``compute.admin`` on ``tenant``.
        viewer: A credential of a principal of ``tenant`` bound to ``compute.viewer`` on ``tenant``.
        revoked: A credential revoked before the test.
        expired: A credential whose expiry is past.
        disabled: A credential, otherwise valid, of a disabled principal.
        backend_calls: How many questions the IAM has asked its backend so far.
        revoke: Revokes one of the credentials above at the authority, as an administrator would.
    """

    iam: Iam
    tenant: str
    other_tenant: str
    root_admin: str = attrs.field(repr=False)
    tenant_admin: str = attrs.field(repr=False)
    viewer: str = attrs.field(repr=False)
    revoked: str = attrs.field(repr=False)
    expired: str = attrs.field(repr=False)
    disabled: str = attrs.field(repr=False)
    backend_calls: Callable[[], int]
    revoke: Callable[[str], Awaitable[None]]


def _other_secret(credential: str) -> str:
    """The same credential with its last character changed: a known id with a wrong secret."""
    return credential[:-1] + ("A" if credential[-1] != "A" else "B")


class IamConformance:
    """The ``Iam`` contract. Tests are ``anyio`` tests; they use only the ``iam_case`` fixture."""

    pytestmark = pytest.mark.anyio

    malformed_credentials: Sequence[str] = (
        "",
        "not-a-credential",
        "Bearer bcak_0123456789abcdef." + "A" * 43,
        "bcak_0123456789abcdef",
        "bcak_0123456789ABCDEF." + "A" * 43,
        "bcak_0123456789abcdef." + "A" * 42,
        "bcak_0123456789abcdef." + "A" * 43 + "\n",
        "bcjt_0123456789abcdef." + "A" * 43,
    )
    """Credentials refused on their shape alone (override for another credential format)."""
    unknown_credential: str = "bcak_0000000000000000." + "A" * 43
    """A well-formed credential nobody minted."""

    # --- authentication ---------------------------------------------------------------------------------------

    async def test_authenticate_returns_the_identity(self, iam_case: IamCase) -> None:
        root = await iam_case.iam.authenticate(iam_case.root_admin)
        admin = await iam_case.iam.authenticate(iam_case.tenant_admin)
        viewer = await iam_case.iam.authenticate(iam_case.viewer)
        assert root.is_root
        assert root.tenant_id not in (iam_case.tenant, iam_case.other_tenant)
        for identity in (admin, viewer):
            assert identity.tenant_id == iam_case.tenant
            assert not identity.is_root
        assert len({root.principal_id, admin.principal_id, viewer.principal_id}) == 3
        assert len({root.credential_id, admin.credential_id, viewer.credential_id}) == 3
        for identity in (root, admin, viewer):
            assert identity.principal_name and identity.kind and identity.credential_id

    async def test_authenticate_is_stable(self, iam_case: IamCase) -> None:
        first = await iam_case.iam.authenticate(iam_case.viewer)
        assert await iam_case.iam.authenticate(iam_case.viewer) == first

    @pytest.mark.parametrize("which", ["revoked", "expired", "disabled"])
    async def test_unusable_credentials_are_unauthenticated(self, iam_case: IamCase, which: str) -> None:
        credential: str = getattr(iam_case, which)
        with pytest.raises(UnauthenticatedError) as info:
            await iam_case.iam.authenticate(credential)
        assert credential not in str(info.value) and credential not in repr(info.value.details)

    async def test_unknown_credential_is_unauthenticated_after_asking_the_backend(self, iam_case: IamCase) -> None:
        before = iam_case.backend_calls()
        with pytest.raises(UnauthenticatedError):
            await iam_case.iam.authenticate(self.unknown_credential)
        # The counter works: a well-formed credential is worth a question (the malformed test relies on this).
        assert iam_case.backend_calls() > before

    async def test_wrong_secret_of_a_known_credential_is_unauthenticated(self, iam_case: IamCase) -> None:
        forged = _other_secret(iam_case.viewer)
        with pytest.raises(UnauthenticatedError) as info:
            await iam_case.iam.authenticate(forged)
        assert forged not in str(info.value)
        # Knowing the real credential (maybe cached) does not make the forged one valid.
        await iam_case.iam.authenticate(iam_case.viewer)
        with pytest.raises(UnauthenticatedError):
            await iam_case.iam.authenticate(forged)

    async def test_malformed_credentials_are_refused_without_asking_the_backend(self, iam_case: IamCase) -> None:
        before = iam_case.backend_calls()
        for credential in self.malformed_credentials:
            with pytest.raises(UnauthenticatedError) as info:
                await iam_case.iam.authenticate(credential)
            if credential:
                assert credential not in str(info.value)
        assert iam_case.backend_calls() == before

    async def test_a_revoked_credential_is_refused_after_it_was_used(self, iam_case: IamCase) -> None:
        await iam_case.iam.authenticate(iam_case.viewer)
        await iam_case.revoke(iam_case.viewer)
        with pytest.raises(UnauthenticatedError):
            await iam_case.iam.authenticate(iam_case.viewer)
        # Only that credential: the others still work.
        await iam_case.iam.authenticate(iam_case.tenant_admin)

    # --- authorization ----------------------------------------------------------------------------------------

    async def _identities(self, case: IamCase) -> tuple[Identity, Identity, Identity]:
        return (
            await case.iam.authenticate(case.root_admin),
            await case.iam.authenticate(case.tenant_admin),
            await case.iam.authenticate(case.viewer),
        )

    @staticmethod
    def _check(decision: Decision, identity: Identity, action: str, resource: ResourceRef) -> None:
        assert decision.id
        assert decision.action == action
        assert decision.principal_id == identity.principal_id
        assert decision.resource == resource

    async def _denied(self, case: IamCase, identity: Identity, action: str, resource: ResourceRef) -> None:
        with pytest.raises(AccessDeniedError):
            await case.iam.require(identity, action, resource)

    async def test_tenant_admin_is_allowed_in_its_tenant(self, iam_case: IamCase) -> None:
        _, admin, _ = await self._identities(iam_case)
        for action, resource in [
            ("compute:reservations:create", ResourceRef(type="reservations", tenant=iam_case.tenant)),
            ("compute:reservations:delete", ResourceRef(type="reservations", id="r-1", tenant=iam_case.tenant)),
            ("compute:nodes:drain", ResourceRef(type="nodes", id="n-1", tenant=iam_case.tenant, pool="p-1")),
            ("iam:principals:create", ResourceRef(type="principals", tenant=iam_case.tenant)),
        ]:
            self._check(await iam_case.iam.require(admin, action, resource), admin, action, resource)

    async def test_tenant_admin_is_denied_outside_its_tenant(self, iam_case: IamCase) -> None:
        _, admin, _ = await self._identities(iam_case)
        other = ResourceRef(type="reservations", tenant=iam_case.other_tenant)
        await self._denied(iam_case, admin, "compute:reservations:create", other)
        await self._denied(iam_case, admin, "compute:reservations:list", other)
        # A resource of no tenant is on the root scope: a tenant binding does not reach it.
        await self._denied(iam_case, admin, "compute:nodes:create", ResourceRef(type="nodes"))
        await self._denied(iam_case, admin, "iam:tenants:create", ResourceRef(type="tenants"))
        await self._denied(iam_case, admin, "iam:authz:decide", ResourceRef(type="authz"))

    async def test_root_admin_is_allowed_everywhere(self, iam_case: IamCase) -> None:
        root, _, _ = await self._identities(iam_case)
        for action, resource in [
            ("compute:reservations:create", ResourceRef(type="reservations", tenant=iam_case.tenant)),
            ("compute:reservations:create", ResourceRef(type="reservations", tenant=iam_case.other_tenant)),
            ("compute:nodes:create", ResourceRef(type="nodes")),
            ("iam:tenants:create", ResourceRef(type="tenants")),
            ("compute:anything-new:some-verb", ResourceRef(type="anything-new", pool="p-9")),
        ]:
            self._check(await iam_case.iam.require(root, action, resource), root, action, resource)

    async def test_wildcard_patterns_cover_every_method_of_their_segment(self, iam_case: IamCase) -> None:
        _, admin, viewer = await self._identities(iam_case)
        mine = ResourceRef(type="widgets", tenant=iam_case.tenant)
        # compute.admin holds compute:*:*, so a group no role names is covered; iam:* is not compute:*.
        for action in ("compute:widgets:create", "compute:widgets:frobnicate", "iam:bindings:delete"):
            self._check(await iam_case.iam.require(admin, action, mine), admin, action, mine)
        await self._denied(iam_case, admin, "billing:widgets:create", mine)
        # compute.viewer holds the actions of the read-only methods the control plane declares, and nothing else:
        # not an undeclared action that merely looks like a read.
        for action in ("compute:pools:list", "compute:pools:get", "compute:join-tokens:list"):
            self._check(await iam_case.iam.require(viewer, action, mine), viewer, action, mine)
        for action in ("compute:widgets:list", "compute:pools:list-all", "compute:pools:create"):
            await self._denied(iam_case, viewer, action, mine)

    async def test_viewer_may_list_but_not_create(self, iam_case: IamCase) -> None:
        _, _, viewer = await self._identities(iam_case)
        mine = ResourceRef(type="x", tenant=iam_case.tenant)
        self._check(await iam_case.iam.require(viewer, "compute:pools:list", mine), viewer, "compute:pools:list", mine)
        await self._denied(iam_case, viewer, "compute:pools:create", mine)
        await self._denied(iam_case, viewer, "compute:x:delete", mine)
        await self._denied(iam_case, viewer, "iam:principals:create", mine)
        other = ResourceRef(type="x", tenant=iam_case.other_tenant)
        await self._denied(iam_case, viewer, "compute:pools:list", other)

    async def test_every_decision_is_new(self, iam_case: IamCase) -> None:
        root, admin, viewer = await self._identities(iam_case)
        mine = ResourceRef(type="x", tenant=iam_case.tenant)
        decisions: list[Decision] = []
        for identity, action in [
            (root, "compute:x:create"),
            (admin, "compute:x:create"),
            (viewer, "compute:pools:list"),
        ]:
            for _ in range(5):
                decision = await iam_case.iam.require(identity, action, mine)
                self._check(decision, identity, action, mine)
                decisions.append(decision)
        assert len({d.id for d in decisions}) == len(decisions)

    async def test_denial_names_the_action_and_not_the_credential(self, iam_case: IamCase) -> None:
        _, _, viewer = await self._identities(iam_case)
        with pytest.raises(AccessDeniedError) as info:
            await iam_case.iam.require(viewer, "compute:x:create", ResourceRef(type="x", tenant=iam_case.tenant))
        assert info.value.details.get("action") == "compute:x:create"
        assert iam_case.viewer not in str(info.value) and iam_case.viewer not in repr(info.value.details)
