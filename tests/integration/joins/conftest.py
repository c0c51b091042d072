"""A control plane with JoinService on (``Options.join`` and a KMS), a manual clock, two tenants and a GPU pool in
acme; ``Fleet`` helpers act as ``bcd`` does, through ``bettercompute_daemon.identity``."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from bettercompute import BetterCompute, JoinSettings, LocalKeyKms
from bettercompute.modules.commands import CommandRecord, create_command
from bettercompute.modules.nodes import (
    JOIN_KEYS,
    NODES,
    Attestor,
    CreatedJoinToken,
    CreateJoinTokenInput,
    DesiredState,
    GatewayServices,
    JoinExpect,
    JoinResult,
    NodeRecord,
    RenewResult,
    Signing,
    set_desired_state,
    signer_of,
)
from bettercompute.modules.pools import CreatePoolInput, Pool
from bettercompute.ports import Kms
from bettercompute.testing import GuardedKms, ManualClock
from bettercompute_daemon.identity import NodeKey, join_binding, seal_token
from bettercompute_store_pg import PgStore

from ..iam.conftest import two_tenants

TRUST_DOMAIN = "compute.example.test"


def claims(serial: str = "SN-0001", **more: Any) -> dict[str, Any]:
    """Hardware claims as ``bcd`` sends them."""
    return {"hostname": f"host-{serial.lower()}", "serial": serial, "product": "PowerEdge XE9680", **more}


@attrs.frozen(kw_only=True)
class Fleet:
    compute: BetterCompute
    store: PgStore
    kms: Kms
    clock: ManualClock
    acme: str
    root: str
    alice: str
    globex: str
    mallory: str
    pool: str
    http: httpx.AsyncClient

    @property
    def services(self) -> GatewayServices:
        return self.compute.gateway_services

    async def new_pool(self, name: str, pool_class: str = "gpu") -> str:
        created: Pool = await self.compute.api.pools.create(
            self.alice,
            CreatePoolInput(tenant=self.acme, name=name, pool_class=pool_class),  # type: ignore[arg-type]
        )
        return created.id

    async def token(
        self,
        *,
        pool: str | None = None,
        uses: int = 1,
        expires_in_seconds: int = 3600,
        expect: JoinExpect | None = None,
        reclaim: str = "none",
        by: str | None = None,
    ) -> CreatedJoinToken:
        """A join token of ``pool`` (acme's GPU pool by default), made by ``by`` (alice by default: the pool's
        tenant's admin makes it)."""
        created: CreatedJoinToken = await self.compute.api.join_tokens.create(
            by or self.alice,
            CreateJoinTokenInput(
                pool_id=pool or self.pool,
                uses=uses,
                expires_in_seconds=expires_in_seconds,
                expect=expect or JoinExpect(),
                reclaim=reclaim,  # type: ignore[arg-type]
            ),
        )
        return created

    async def renew(self, certificate_pem: str, signer: NodeKey, challenge: bytes, csr_pem: str) -> RenewResult:
        """A renewal as ``bcd`` sends it: ``signer``'s proof over the challenge and the CSR, with the certificate."""
        return await self.services.renew(
            certificate_pem=certificate_pem,
            challenge=challenge,
            signature=signer.renewal_proof(challenge, csr_pem),
            csr_pem=csr_pem,
        )

    async def events(self, event_type: str) -> list[tuple[str, dict[str, Any]]]:
        """The outbox's events of ``event_type``, oldest first: (key, payload)."""
        rows = await self.store.fetch(
            self.store.sql("SELECT key, payload FROM {s}.outbox WHERE type = :type ORDER BY id"), {"type": event_type}
        )
        return [(r.key, dict(r.payload)) for r in rows]

    async def signing(self) -> Signing:
        """This control plane's loaded instruction key (what its jobs sign desired states and commands with)."""
        signer = signer_of(self.store)
        assert signer is not None, "node identity is on: the nodes module registered its signer"
        return await signer.prepare()

    async def desire(self, node_id: str, content: Mapping[str, Any]) -> DesiredState:
        """Give a node a new desired state, signed, as the control plane's jobs do."""
        signing = await self.signing()
        async with self.store.transaction() as tx:
            node = await tx.repository(NODES).get_for_update(node_id)
            assert node is not None
            return await set_desired_state(tx, node, content, signer=signing)

    async def command(
        self, node: NodeRecord, *, kind: str = "diag.nvml", payload: Mapping[str, Any] | None = None
    ) -> CommandRecord:
        """A signed command for ``node`` (five minutes to its deadline), as the control plane's jobs make one."""
        signing = await self.signing()
        async with self.store.transaction() as tx:
            return await create_command(
                tx,
                node=node,
                kind=kind,
                payload=payload or {},
                deadline=self.clock.now() + dt.timedelta(minutes=5),
                signer=signing,
            )

    async def join_key(self) -> str:
        record = await self.store.repository(JOIN_KEYS).active()
        assert record is not None
        return record.public_key

    async def seal(
        self,
        token: str,
        *,
        csr_pem: str | None = None,
        hardware: Mapping[str, Any] | None = None,
        evidence: Mapping[str, str] | None = None,
        pool_id: str | None = None,
    ) -> bytes:
        """``token`` sealed as ``bcd`` seals it for a request with this CSR, claims, evidence and pool (without a
        CSR: bound to nothing a request can match, for tests refused before the binding is compared)."""
        binding = join_binding(csr_pem, dict(hardware or {}), evidence, pool_id) if csr_pem else bytes(32)
        return seal_token(await self.join_key(), token, binding=binding, now=self.clock.now())

    async def join(
        self,
        token: str,
        *,
        key: NodeKey | None = None,
        hardware: Mapping[str, Any] | None = None,
        pool_id: str | None = None,
        evidence: Mapping[str, str] | None = None,
    ) -> tuple[JoinResult, NodeKey]:
        """Join as ``bcd join`` does: a fresh key, its CSR, the token sealed to the published join key."""
        key = key or NodeKey()
        csr_pem = key.csr_pem()
        hardware = dict(hardware or claims())
        sealed = await self.seal(token, csr_pem=csr_pem, hardware=hardware, evidence=evidence, pool_id=pool_id)
        result = await self.services.join(
            sealed_token=sealed, csr_pem=csr_pem, claims=hardware, evidence=evidence, pool_id=pool_id
        )
        return result, key


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(dt.datetime.now(dt.UTC).replace(microsecond=0))


@pytest.fixture
def attestors() -> Sequence[Attestor]:
    """The host's attestors (none by default; a test module may override this fixture)."""
    return ()


@pytest.fixture
def modules() -> Sequence[Any]:
    """The host's modules (none by default; a test module may override this fixture)."""
    return ()


@pytest.fixture
def certificate_ttl() -> dt.timedelta:
    """The lifetime of node certificates (24 hours; a test module may override this fixture)."""
    return dt.timedelta(hours=24)


@pytest.fixture
def kms(tmp_path: Path) -> Kms:
    """The fleet's KMS: a key file, behind a guard that fails any KMS call made inside a transaction (a test module
    may override this fixture)."""
    return GuardedKms(LocalKeyKms(tmp_path / "kms.key"))


@pytest.fixture
async def fleet(
    database_url: str,
    fresh_schema: str,
    tmp_path: Path,
    clock: ManualClock,
    attestors: Sequence[Attestor],
    certificate_ttl: dt.timedelta,
    modules: Sequence[Any],
    kms: Kms,
) -> AsyncIterator[Fleet]:
    join = JoinSettings(
        gateway_address="gw.eu-1.example.com:443", trust_domain=TRUST_DOMAIN, certificate_ttl=certificate_ttl
    )
    async with two_tenants(
        database_url, fresh_schema, kms=kms, join=join, clock=clock, attestors=attestors, modules=list(modules)
    ) as t:
        pool: Pool = await t.compute.api.pools.create(t.alice, CreatePoolInput(tenant=t.acme, name="gpus"))
        yield Fleet(
            compute=t.compute,
            store=t.store,
            kms=kms,
            clock=clock,
            acme=t.acme,
            root=t.root,
            alice=t.alice,
            globex=t.globex,
            mallory=t.mallory,
            pool=pool.id,
            http=t.http,
        )
