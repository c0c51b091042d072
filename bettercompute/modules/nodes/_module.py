"""The ``nodes`` module: the ``nodes`` and ``join-tokens`` groups, and node identity (JoinService, the node CA and
the gateway services of ``Options.join``'s trust domain) where ``Options.join`` and ``Options.kms`` are set."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bettercompute._runtime.gateway_methods import GatewayMethod
from bettercompute._runtime.jobs import Job
from bettercompute._version import __version__
from bettercompute.errors import FailedPreconditionError, InvalidConfigError
from bettercompute.modules.nodes._ca import CertificateAuthority
from bettercompute.modules.nodes._claims import Attestor
from bettercompute.modules.nodes._gateway import GatewayServices
from bettercompute.modules.nodes._gateway_enrolment import GatewayEnrolment
from bettercompute.modules.nodes._instructions import InstructionSigner, register_signer, signer_of
from bettercompute.modules.nodes._join import JoinService
from bettercompute.modules.nodes._join_keys import JoinKeyRing, join_key_context
from bettercompute.modules.nodes._methods import ACTIONS, JoinTokensGroup, KeysGroup, NodesGroup
from bettercompute.modules.nodes._port import (
    CERTIFICATES,
    JOIN_KEYS,
    JOIN_TOKENS,
    NODES,
    REWRAPS,
    SEALED_CA_KEYS,
    SEALED_JOIN_KEYS,
    SEALED_SIGNING_KEYS,
)
from bettercompute.modules.nodes._proofs import ChallengeIssuer
from bettercompute.modules.nodes._rewrap import KMS_REWRAP
from bettercompute.modules.nodes._schemas import NODE
from bettercompute.modules.nodes._sealing import JoinKeyPair, Unsealer
from bettercompute.modules.nodes._secrets import SecretReleaser
from bettercompute.modules.nodes._service import node_tunnel_check
from bettercompute.modules.nodes._tokens import IDENTITY_NEEDS, JoinSettings
from bettercompute.modules.nodes._tunnels import TUNNELS, TunnelCheck, sweep_tunnels
from bettercompute.modules.pools import POOLS
from bettercompute.ports import Kms, Migration, Repository, Sealed, Store

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.registry import GroupSpec

__all__ = ["NodesModule"]

log = logging.getLogger("bettercompute.joins")


async def ensure_join_key(store: Store, kms: Kms) -> None:
    """Make JoinService's first key when there is none (whichever process comes first)."""
    if await store.repository(JOIN_KEYS).active() is not None:
        return
    fresh = JoinKeyPair.generate()
    key_id = f"jk_{secrets.token_hex(8)}"
    sealed = await kms.encrypt(fresh.private_bytes(), context=join_key_context(key_id))
    record = await store.repository(JOIN_KEYS).create_if_none(
        id=key_id, public_key=fresh.public_key_text(), sealed_key=sealed
    )
    if record.id == key_id:
        log.info("JoinService key %s created", key_id)


async def purge_nonces(context: ModuleContext) -> int:
    """Forget the sealed-token, challenge and secret-request nonces that can no longer be replayed anyway."""
    purged = await context.store.nonces.purge(now=context.clock.now())
    if purged:
        log.debug("purged %d expired nonces", purged)
    return purged


async def _sweep_tunnels(context: ModuleContext) -> int:
    """Close the tunnels no gateway carries any more (a gateway gone, a ticket never used)."""
    closed = await sweep_tunnels(context.store, now=context.clock.now())
    if closed:
        log.info("closed %d tunnels no gateway carries", closed)
    return closed


async def _renew_signer(context: ModuleContext) -> int:
    """Keep the instruction keys' certificates current even when nothing is signed for a while: a node that
    reconnects is sent its current desired state with the certificate stored now, which must not have ended."""
    signer = signer_of(context.store)
    if signer is None:
        return 0
    await signer.prepare(fresh=True)
    return 1


TUNNEL_SWEEP = Job(name="tunnel-sweep", role="controllers", interval=dt.timedelta(seconds=30), run=_sweep_tunnels)
SIGNER_RENEWAL = Job(name="signer-renewal", role="controllers", interval=dt.timedelta(minutes=10), run=_renew_signer)
"""Renews the instruction keys' certificates (a day long) at half their life, whether or not anything is signed."""
NONCE_PURGE = Job(name="nonce-purge", role="controllers", interval=dt.timedelta(minutes=1), run=purge_nonces)


class NodesModule:
    """Always registered by ``better_compute()``: the ``nodes`` and ``join-tokens`` groups, the tunnel sweep and the
    nonce purge.

    With node identity (``settings`` and ``kms``: ``Options.join`` and ``Options.kms``), ``start`` makes (once per
    deployment) or loads the CA key and JoinService's key and builds ``services``; ``secret_broker`` makes the broker a
    node's ``Secret`` requests go to (``better_compute()`` wires ``SecretBroker`` in). Without it, what needs
    identity (``compute.gateway_services``, ``nodes.revoke``, ``nodes.retire``, ``nodes.tunnel``) answers
    ``FAILED_PRECONDITION`` naming both options.
    """

    name = "nodes"
    version = __version__
    core_range = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (NodesGroup, JoinTokensGroup, KeysGroup)
    actions: Sequence[str] = ACTIONS
    migrations: Mapping[str, Sequence[Migration]] = {}
    repositories: Sequence[Repository[Any]] = (
        CERTIFICATES,
        NODES,
        JOIN_KEYS,
        POOLS,
        JOIN_TOKENS,
        TUNNELS,
        REWRAPS,
    )
    sealed: Sequence[Repository[Sealed]] = (SEALED_CA_KEYS, SEALED_SIGNING_KEYS, SEALED_JOIN_KEYS)
    jobs: Sequence[Job] = (KMS_REWRAP, NONCE_PURGE, SIGNER_RENEWAL, TUNNEL_SWEEP)

    def __init__(
        self,
        settings: JoinSettings | None = None,
        kms: Kms | None = None,
        attestors: Sequence[Attestor] = (),
        *,
        secret_broker: Callable[[Store], SecretReleaser] | None = None,
    ) -> None:
        self._settings = settings
        self._kms = kms
        self._attestors = tuple(attestors)
        self._secret_broker = secret_broker
        self._services: GatewayServices | None = None
        self.gateway_methods: tuple[GatewayMethod, ...] = ()
        """Other modules' gateway methods (``better_compute()`` collects them before ``initialize()``)."""
        self.tunnel_checks: dict[str, TunnelCheck] = {NODE: node_tunnel_check}
        """Every module's tunnel checks by resource type, this module's ``node`` among them (``better_compute()``
        adds the others' before ``initialize()``)."""

    @property
    def identity(self) -> bool:
        """Whether node identity is on (``Options.join`` and ``Options.kms`` are set)."""
        return self._settings is not None and self._kms is not None

    @property
    def services(self) -> GatewayServices:
        """The gateway services, once ``initialize()`` has run.

        Raises:
            FailedPreconditionError: node identity is off, or ``initialize()`` has not run.
        """
        if not self.identity:
            raise FailedPreconditionError(IDENTITY_NEEDS, details={"needs": ["join", "kms"]})
        if self._services is None:
            raise FailedPreconditionError("the gateway services exist after initialize()")
        return self._services

    async def start(self, context: ModuleContext) -> None:
        """With node identity: load (or make) the CA and JoinService keys; build JoinService and the gateway
        services."""
        if self._settings is None or self._kms is None:
            return
        store = context.store
        # Keys reused for a second outside transactions: a join reads them once, not three times.
        ca = CertificateAuthority(
            store,
            self._kms,
            trust_domain=self._settings.trust_domain,
            clock=context.clock,
            keys_ttl=dt.timedelta(seconds=1),
        )
        await ca.ensure()
        signer = InstructionSigner(store, self._kms, ca, clock=context.clock)
        await signer.prepare()  # made (or loaded) now: the first instruction does not wait for the KMS
        register_signer(store, signer)
        await ensure_join_key(store, self._kms)
        ring = JoinKeyRing(store, self._kms, clock=context.clock)
        await ring.refresh(force=True)
        joins = JoinService(
            store=store,
            ca=ca,
            unsealer=Unsealer(ring, store.nonces),
            challenges=ChallengeIssuer(ring),
            replay_guard=store.nonces,
            clock=context.clock,
            attestors=self._attestors,
            sealed_token_max_age=self._settings.sealed_token_max_age,
            certificate_ttl=self._settings.certificate_ttl,
        )
        if self._secret_broker is None:
            raise InvalidConfigError("node identity needs a secret broker (better_compute() wires SecretBroker in)")
        self._services = GatewayServices(
            joins,
            self._secret_broker(store),
            store=store,
            replay_guard=store.nonces,
            clock=context.clock,
            context=context,
            methods=self.gateway_methods,
            tunnel_checks=self.tunnel_checks,
            enrolment=GatewayEnrolment(ca, self._kms, store=store, replay_guard=store.nonces, clock=context.clock),
        )

    async def stop(self) -> None:
        """Nothing to stop (the services stay usable until ``close()``)."""
