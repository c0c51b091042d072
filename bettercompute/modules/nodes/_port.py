"""The ``nodes`` module's repositories: nodes, the join tokens that admit them and JoinService's keys; the node CA's
keys, the certificates it issued and their revocations; node conditions."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.modules.pools import PoolRecord
from bettercompute.ports import Repository, Sealed

__all__ = [
    "CERTIFICATES",
    "JOIN_KEYS",
    "JOIN_TOKENS",
    "NODES",
    "REWRAPS",
    "SEALED_CA_KEYS",
    "SEALED_JOIN_KEYS",
    "SEALED_SIGNING_KEYS",
    "CaKey",
    "Certificates",
    "ConditionRecord",
    "DesiredState",
    "Enrollment",
    "InstructionSignature",
    "InventoryRecord",
    "IssuedCertificate",
    "JoinKeyRecord",
    "JoinKeys",
    "JoinTokenMatch",
    "JoinTokenRecord",
    "JoinTokens",
    "NodeRecord",
    "Nodes",
    "Revocation",
    "RewrapRecord",
    "Rewraps",
    "SignedFact",
    "SigningKey",
    "TokenConsumption",
]


@attrs.frozen(kw_only=True)
class SignedFact:
    """A node's signature over a fact, and what checks it: the serial of the certificate it was made under and that
    certificate's public key (SubjectPublicKeyInfo, DER)."""

    signature: bytes = attrs.field(repr=False)
    serial: str
    key: bytes = attrs.field(repr=False)


@attrs.frozen(kw_only=True)
class NodeRecord:
    """A machine joined to a pool. ``state`` is ``adopting`` (joined, acceptance checks pending), ``adopted``,
    ``quarantined`` (a check failed: ``state_reason`` says why, ``state_detail`` holds the check's output),
    ``unreachable`` (adopted, but without a session for longer than the session timeout), ``failed`` or
    ``retired``. ``hardware_key`` is derived from its stable hardware claims; ``claims`` are the hardware claims of
    its latest join and ``attestation`` the facts the attestor chain recorded then. ``enrollments`` counts its joins
    (1 + reclaims). ``cordoned``: no new bookings; ``draining``: cordoned, and its bookings run to their end.
    ``acceptance`` is the current round of acceptance checks (``{"round", "commands": {check: command id}}``)."""

    id: str
    tenant: str
    pool_id: str
    site_id: str | None
    state: str
    hardware_key: str
    claims: Mapping[str, Any]
    attestation: Mapping[str, Any]
    join_token_id: str | None
    enrollments: int
    session_epoch: int
    desired_generation: int
    observed_generation: int
    last_seen_at: dt.datetime | None
    joined_at: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime
    retired_at: dt.datetime | None
    state_reason: str | None = None
    state_detail: Mapping[str, Any] = attrs.field(factory=dict)
    state_changed_at: dt.datetime | None = None
    cordoned: bool = False
    draining: bool = False
    acceptance: Mapping[str, Any] = attrs.field(factory=dict)
    unreachable_since: dt.datetime | None = None
    observed_epoch: int | None = None
    """The session epoch the daemon signed its acknowledgement of ``observed_generation`` in."""
    observed_signed: SignedFact | None = None
    """The daemon's signature over that acknowledgement (``desired_ack_message``)."""
    observed_checked: str | None = None
    """``None`` until the acknowledgement's controller checked that signature, then ``ok`` or why it was refused;
    a binding relies on ``observed_generation`` only when it is ``ok``."""


@attrs.frozen(kw_only=True)
class Enrollment:
    """What ``Nodes.enroll`` did: ``created`` a node, ``reclaimed`` the pool's live node with the same hardware key,
    or found such a node while reclaiming was not allowed (``conflict``; ``node`` is that node, nothing written)."""

    outcome: str
    node: NodeRecord


@attrs.frozen(kw_only=True, repr=False)
class JoinKeyRecord:
    """JoinService's X25519 key: ``sealed_key`` is the 32-byte private key as the KMS sealed it (context
    ``join-key:<id>``); ``public_key`` its base64url text. ``state`` is ``active`` (one), ``previous`` (still
    opens what was sealed to it until ``retire_after``) or ``retired``."""

    id: str
    public_key: str
    sealed_key: bytes
    state: str
    created_at: dt.datetime
    retire_after: dt.datetime | None = None

    def __repr__(self) -> str:
        return f"JoinKeyRecord(id={self.id!r}, state={self.state!r})"


@attrs.frozen(kw_only=True)
class InstructionSignature:
    """The control plane's signature over an instruction to a node (a desired state, a command), made with the
    instruction-signing key ``signer`` (``SigningKey.id``)."""

    signature: bytes
    signer: str

    def __repr__(self) -> str:
        return f"InstructionSignature(signer={self.signer!r})"


@attrs.frozen(kw_only=True)
class DesiredState:
    """What a node's daemon is to apply: ``content`` (a JSON object; ``{"allocations": [{"id", "gpus": [uuid, ...]}]}``
    for GPUs) at ``generation``, which grows by one with every change. Generation 0 means nothing was asked yet."""

    node_id: str
    generation: int
    content: Mapping[str, Any]
    text: str | None = None
    """``content`` as the exact JSON text the control plane signed (what a gateway sends)."""
    instruction: InstructionSignature | None = None
    """The control plane's signature over ``desired_state_message(node_id, generation, text)``; ``None`` where node
    identity is off (no daemon can join then, and one would refuse it)."""


@attrs.frozen(kw_only=True)
class InventoryRecord:
    """One inventory section a node's daemon reported (``gpus``, ``cpu``, ``memory``, ``disks``, ``nics``), as it
    sent it: ``fake`` when it comes from a declared fake inventory, not the hardware."""

    node_id: str
    section: str
    content: Any
    fake: bool
    received_at: dt.datetime
    content_json: str | None = None
    """The content as the node signed it (``content`` is parsed from it); ``None`` for a section written otherwise."""
    epoch: int | None = None
    """The session epoch the node signed it in."""
    signed: SignedFact | None = None
    """The node's signature over the section (``inventory_section_message``)."""
    checked: str | None = None
    """``None`` until the inventory controller checked the signature, then ``ok`` or why it was refused."""


@attrs.frozen(kw_only=True)
class ConditionRecord:
    """One condition of a node (``GpuHealthy``, ``EccErrors``, ``XidErrors``, ``RetiredPagesPending``,
    ``DriverMismatch``, ``Reachable``, ``InventoryValid``): ``status`` ``True``, ``False`` or ``Unknown``, a
    machine-readable ``reason``, a message for people, and when the status last changed."""

    type: str
    status: str
    reason: str
    message: str
    last_transition_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None


class Nodes(Protocol):
    """Nodes (machines joined to pools). ``enroll``, ``retire`` and ``get(lock=True)`` need a transaction
    (``tx.repository(NODES)``)."""

    async def enroll(
        self,
        *,
        new_id: str,
        pool_id: str,
        tenant: str,
        hardware_key: str,
        claims: Mapping[str, Any],
        attestation: Mapping[str, Any],
        join_token_id: str,
        reclaim: bool,
    ) -> Enrollment:
        """Insert node ``new_id`` as ``adopting``, unless the pool has a live (not retired) node with this hardware
        key: with ``reclaim`` that node is taken back (``adopting`` again, new claims, ``enrollments`` + 1), without
        it the answer is ``conflict`` and nothing is written. Of two concurrent enrollments of one new hardware key,
        one creates the node and the other gets ``ConflictError``."""
        ...

    async def get(self, id: str, *, lock: bool = False) -> NodeRecord | None:
        """A node by id; with ``lock`` its row is share-locked until the transaction ends, so a reclaim or a
        retirement of it waits (or is waited for)."""
        ...

    async def get_for_update(self, id: str) -> NodeRecord | None:
        """A node by id, its row locked until the transaction ends (needs one): for a read-then-write of its
        lifecycle (``save_lifecycle``)."""
        ...

    async def save_lifecycle(self, node: NodeRecord) -> NodeRecord | None:
        """Write ``node``'s lifecycle fields (``state`` other than ``retired``, ``state_reason``, ``state_detail``,
        ``cordoned``, ``draining``, ``acceptance``, ``unreachable_since``); ``state_changed_at`` moves when the
        state does. Needs a transaction; ``None`` for no such node or a retired one (which nothing brings back)."""
        ...

    async def for_pool(self, pool_id: str) -> list[NodeRecord]:
        """The pool's nodes, oldest first."""
        ...

    async def for_tenant(
        self, tenant: str, *, pool_id: str | None = None, after: Sequence[Any] | None, limit: int
    ) -> list[NodeRecord]:
        """The tenant's nodes (of one pool when ``pool_id`` is given) in ``(created_at, id)`` order: at most
        ``limit``, after the key ``after``."""
        ...

    async def retire(self, id: str) -> NodeRecord | None:
        """Retire a node for good (idempotent): it can no longer renew, fetch secrets or be reclaimed; ``None`` for
        no such node."""
        ...

    async def set_desired(self, desired: DesiredState) -> bool:
        """Replace the node's desired state with ``desired`` (needs a transaction), only if its generation is the
        node's next one (checked by the statement: the caller read the node ``get_for_update``); ``False`` for no
        such node, a retired one, or another generation. Gateways push it to the node's session (see
        ``DESIRED_STATE_CHANNEL``)."""
        ...

    async def signed_by(self, signer: str, *, limit: int) -> list[DesiredState]:
        """Up to ``limit`` current desired states signed by the instruction key ``signer``, locked for the caller's
        transaction (waiting for a writer that holds one: none is skipped)."""
        ...

    async def resign_desired(self, desired: DesiredState) -> bool:
        """Replace the signature of the node's desired state at ``desired.generation`` (the text is unchanged);
        ``False`` when its generation moved meanwhile."""
        ...

    async def desired_newer(self, known: Sequence[tuple[str, int]]) -> list[DesiredState]:
        """For pairs (node id, generation a session was sent), the nodes whose desired generation is higher, in one
        statement whatever their number."""
        ...

    async def record_inventory(self, node_id: str, section: str, content: Any, *, fake: bool) -> bool:
        """Keep the latest content of one inventory section of a node (needs a transaction); ``False`` for no such
        live node."""
        ...

    async def inventory(self, node_id: str) -> list[InventoryRecord]:
        """The node's latest inventory sections, by name."""
        ...

    async def check_observed(self, node_id: str, *, generation: int, verdict: str) -> bool:
        """Note what checking the signature of the node's acknowledgement of ``generation`` found (``ok`` or why it
        was refused); ``False`` when a newer acknowledgement replaced it or it was checked meanwhile."""
        ...

    async def check_inventory(self, node_id: str, section: str, *, received_at: dt.datetime, verdict: str) -> bool:
        """Note what checking the signature of the section received at ``received_at`` found (``ok`` or why it was
        refused); ``False`` when that report was replaced or checked meanwhile (nothing is written)."""
        ...

    async def conditions(self, node_ids: Sequence[str]) -> dict[str, list[ConditionRecord]]:
        """The conditions of these nodes, by node id, each list by type; one statement."""
        ...

    async def save_conditions(self, node_id: str, conditions: Sequence[ConditionRecord]) -> list[str]:
        """Insert or update these conditions of the node; ``last_transition_at`` moves only when the status
        changes. Returns the types whose status changed (or that are new)."""
        ...


class JoinKeys(Protocol):
    """JoinService's key pairs (sealed by the KMS)."""

    async def active(self) -> JoinKeyRecord | None:
        """The active key, if one was made."""
        ...

    async def list(self) -> list[JoinKeyRecord]:
        """Every key, oldest first."""
        ...

    async def rotate(self, *, id: str, public_key: str, sealed_key: bytes, retire_after: dt.datetime) -> JoinKeyRecord:
        """Make this key the active one (in one statement): the active key before becomes ``previous`` until
        ``retire_after``. The new key's record."""
        ...

    async def retire(self, id: str) -> JoinKeyRecord | None:
        """Retire a ``previous`` key at once (nothing for an active key: ``None``, as for no such key)."""
        ...

    async def create_if_none(self, *, id: str, public_key: str, sealed_key: bytes) -> JoinKeyRecord:
        """Add this key as the active one unless there is an active key already; returns the active key (so of
        several processes starting at once, all end up with the one that was stored first)."""
        ...


@attrs.frozen(kw_only=True, repr=False)
class CaKey:
    """One signing key of the node CA of ``trust_domain``: a root or an intermediate.

    ``sealed_key`` is the private key (PKCS#8 DER) as the KMS sealed it (context ``ca:<trust_domain>:<id>``), never
    in the clear; ``certificate_pem`` its CA certificate. A root (``issuer_id`` ``None``) is self-signed: it is what
    the trust bundle carries and daemons pin, and it certifies intermediates and the instruction keys. An
    intermediate (``issuer_id`` the root's id) signs every node, site, ramdisk and server certificate. ``state`` is
    ``active`` (signs; one root and one intermediate per trust domain), ``previous`` (signs no more; a root stays in
    the trust bundle, an intermediate's certificates keep verifying) or ``retired`` (trusted no more).
    """

    id: str
    trust_domain: str
    algorithm: str
    sealed_key: bytes
    certificate_pem: str
    state: str
    not_after: dt.datetime
    created_at: dt.datetime
    retired_at: dt.datetime | None = None
    issuer_id: str | None = None

    @property
    def is_root(self) -> bool:
        return self.issuer_id is None

    def __repr__(self) -> str:
        return f"CaKey(id={self.id!r}, trust_domain={self.trust_domain!r}, state={self.state!r})"


@attrs.frozen(kw_only=True)
class SigningKey:
    """One key the control plane signs instructions with (desired states, commands) in ``trust_domain``.

    ``sealed_key`` is the private key (PKCS#8 DER) as the KMS sealed it (context ``signer:<trust_domain>:<id>``);
    ``certificate_der`` its current certificate from the node CA (``spiffe://<trust_domain>/signer/<id>``), which a
    gateway sends beside each signature and a daemon checks against its trust bundle; ``certificate_not_after``
    when that certificate ends (it is renewed before). ``state``: ``active`` (signs; one per trust domain),
    ``previous`` (signs no more, its signatures still hold) or ``retired`` (no gateway sends its certificate).
    """

    id: str
    trust_domain: str
    sealed_key: bytes
    certificate_der: bytes
    certificate_not_after: dt.datetime
    state: str
    created_at: dt.datetime
    previous_at: dt.datetime | None = None
    """When it stopped being the active key."""
    retired_at: dt.datetime | None = None

    def __repr__(self) -> str:
        return f"SigningKey(id={self.id!r}, state={self.state!r})"


@attrs.frozen(kw_only=True)
class IssuedCertificate:
    """A certificate the CA issued: ``serial`` is the serial number in lower-case hex (no leading zeros)."""

    serial: str
    node_id: str
    spiffe_id: str
    role: str
    ca_key_id: str
    not_before: dt.datetime
    not_after: dt.datetime
    issued_at: dt.datetime | None = None
    key_sha256: str | None = None
    """SHA-256 (hex) of the certified public key (SubjectPublicKeyInfo, DER)."""


@attrs.frozen(kw_only=True)
class Revocation:
    """The revocation of one issued certificate."""

    serial: str
    spiffe_id: str
    reason: str
    revoked_at: dt.datetime


class Certificates(Protocol):
    """The node CA's state: its signing keys (sealed), the certificates it issued, and their revocations.

    ``lock`` serializes the key changes of one trust domain. The writes, ``lock`` and ``lock_identity`` need a
    transaction (``tx.repository(CERTIFICATES)``); the reads run in one when asked through it, else on their own.
    """

    async def lock(self, trust_domain: str) -> None:
        """Hold the trust domain's key lock until the transaction ends (creating, rotating and retiring keys take
        it)."""
        ...

    async def keys(self, trust_domain: str) -> list[CaKey]:
        """The trust domain's keys, retired ones included, oldest first."""
        ...

    async def add_key(self, key: CaKey) -> None:
        """Add a key (its ``created_at`` is the store's now). ``ConflictError`` for a second active key."""
        ...

    async def set_key_state(self, *, trust_domain: str, id: str, state: str) -> bool:
        """Move a key to ``state`` (``retired`` stamps ``retired_at``); ``False`` when there is no such key."""
        ...

    async def signing_keys(self, trust_domain: str) -> list[SigningKey]:
        """The trust domain's instruction-signing keys, retired ones included, oldest first."""
        ...

    async def add_signing_key(self, key: SigningKey) -> None:
        """Add an instruction-signing key (needs a transaction). ``ConflictError`` for a second active key."""
        ...

    async def set_signing_key(
        self,
        *,
        trust_domain: str,
        id: str,
        state: str | None = None,
        certificate: tuple[bytes, dt.datetime] | None = None,
    ) -> bool:
        """Move a signing key to ``state`` and/or give it a new ``(certificate_der, not_after)``; ``False`` when
        there is no such key."""
        ...

    async def record(self, certificate: IssuedCertificate) -> bool:
        """Record an issued certificate if the CA key that signed it (``ca_key_id``) is still the active one, checked
        by the same statement; ``False`` (nothing recorded) when it is not. ``ConflictError`` if its serial is
        recorded already."""
        ...

    async def get(self, serial: str) -> IssuedCertificate | None:
        """The issued certificate with this serial, or ``None``."""
        ...

    async def live_count(self, ca_key_id: str, *, now: dt.datetime) -> int:
        """How many certificates issued under ``ca_key_id`` are unexpired at ``now`` and not revoked."""
        ...

    async def live_count_for(self, spiffe_id: str, *, now: dt.datetime) -> int:
        """How many certificates of ``spiffe_id`` are unexpired at ``now`` and not revoked."""
        ...

    async def newest(self, spiffe_id: str) -> IssuedCertificate | None:
        """The most recently issued certificate of ``spiffe_id`` that is not revoked, or ``None``."""
        ...

    async def lock_identity(self, spiffe_id: str, *, shared: bool) -> None:
        """Hold the identity lock of ``spiffe_id`` until the transaction ends: shared while a renewal checks and issues,
        exclusive while a revocation writes, so neither misses the other."""
        ...

    async def revoke(self, *, serial: str | None = None, spiffe_id: str | None = None, reason: str) -> list[Revocation]:
        """Revoke the certificate ``serial``, or every certificate of ``spiffe_id`` (exactly one of them given).

        Returns the revocations this call added (a certificate revoked before is left as it was).
        """
        ...

    async def revoke_issued_by(self, ca_key_ids: Sequence[str], *, now: dt.datetime, reason: str) -> list[Revocation]:
        """Revoke every certificate the CA keys ``ca_key_ids`` issued that is unexpired at ``now``; the revocations
        this call added."""
        ...

    async def is_revoked(self, serial: str) -> bool:
        """Whether the certificate ``serial`` is revoked."""
        ...

    async def revocations(self, spiffe_id: str) -> list[Revocation]:
        """The revocations of ``spiffe_id``'s certificates, oldest first."""
        ...


CERTIFICATES: Repository[Certificates] = Repository(module="nodes", name="certificates")
"""``tx.repository(CERTIFICATES)`` in a transaction, ``store.repository(CERTIFICATES)`` outside one: the store's
``Certificates``"""
NODES: Repository[Nodes] = Repository(module="nodes", name="nodes")
"""``tx.repository(NODES)`` in a transaction, ``store.repository(NODES)`` outside one: the store's ``Nodes``"""
JOIN_KEYS: Repository[JoinKeys] = Repository(module="nodes", name="join_keys")
"""``tx.repository(JOIN_KEYS)`` in a transaction, ``store.repository(JOIN_KEYS)`` outside one: the store's
``JoinKeys``"""


@attrs.frozen(kw_only=True)
class JoinTokenRecord:
    """A stored join token, without its secret or its hash. ``expect`` holds only the claims to check."""

    id: str
    pool_id: str
    tenant: str
    uses: int
    uses_left: int
    expires_at: dt.datetime
    expect: Mapping[str, Any]
    reclaim: str
    created_by: str | None
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class JoinTokenMatch:
    """A join token found by its id and secret, with its pool (``JoinTokens.matching``: a join reads both at once)."""

    token: JoinTokenRecord
    pool: PoolRecord


@attrs.frozen(kw_only=True)
class TokenConsumption:
    """What ``JoinTokens.consume`` did: ``consumed`` (``token.uses_left`` is what is left), or why not:
    ``unknown`` (no such token or a wrong secret; ``token`` is ``None``), ``revoked``, ``expired``, ``exhausted``."""

    outcome: str
    token: JoinTokenRecord | None


class JoinTokens(Protocol):
    """Join tokens of pools: only the SHA-256 of a token's secret is ever given to the store. ``create``, ``revoke``
    and ``consume`` need a transaction (``tx.repository(JOIN_TOKENS)``)."""

    async def create(
        self,
        *,
        id: str,
        pool_id: str,
        tenant: str,
        secret_hash: bytes,
        uses: int,
        expires_at: dt.datetime,
        expect: Mapping[str, Any],
        reclaim: str,
        created_by: str | None,
    ) -> JoinTokenRecord:
        """Add a token with ``uses`` uses left."""
        ...

    async def for_pool(self, pool_id: str, *, after: Sequence[Any] | None, limit: int) -> list[JoinTokenRecord]:
        """The pool's tokens, newest first (``(created_at, id)`` descending): at most ``limit``, before the key
        ``after``."""
        ...

    async def get(self, id: str) -> JoinTokenRecord | None:
        """A token by id."""
        ...

    async def matching(self, id: str, *, secret_hash: bytes) -> JoinTokenMatch | None:
        """The token ``id`` and its pool if its secret hashes to ``secret_hash`` (whatever its state), else
        ``None``."""
        ...

    async def revoke(self, id: str) -> JoinTokenRecord | None:
        """End a token (idempotent); ``None`` for no such token."""
        ...

    async def consume(self, *, id: str, secret_hash: bytes, now: dt.datetime) -> TokenConsumption:
        """Spend one use atomically if the hash matches and the token is live at ``now``: of concurrent consumers
        of the last use, exactly one gets ``consumed``."""
        ...


JOIN_TOKENS: Repository[JoinTokens] = Repository(module="nodes", name="join_tokens")
"""``tx.repository(JOIN_TOKENS)`` in a transaction, ``store.repository(JOIN_TOKENS)`` outside one: the store's
``JoinTokens``"""


@attrs.frozen(kw_only=True)
class RewrapRecord:
    """A re-wrap: every stored KMS blob opened and sealed again under the current key, column by column.

    ``columns`` are the sealed columns it walks (``module.name`` of each ``Repository[Sealed]``), fixed when it
    starts; ``position`` the index of the one it is in, ``after`` the key of the last blob it handled there (the
    next pass goes on from it). ``failures`` names the first blobs that opened under no key (their column and key;
    never a blob). ``state``: ``running`` (one at a time), then ``done``.
    """

    id: str
    state: str
    columns: tuple[str, ...]
    position: int
    after: str | None
    resealed: int
    failed: int
    failures: tuple[Mapping[str, str], ...]
    created_by: str | None
    created_at: dt.datetime
    finished_at: dt.datetime | None = None


class Rewraps(Protocol):
    """Re-wraps of the KMS blobs (``kms_rewraps``)."""

    async def start(self, *, id: str, columns: Sequence[str], created_by: str | None) -> RewrapRecord | None:
        """Record a running re-wrap; ``None`` when one is running already."""
        ...

    async def get(self, id: str) -> RewrapRecord | None:
        """A re-wrap by id."""
        ...

    async def running(self) -> RewrapRecord | None:
        """The running re-wrap, if any."""
        ...

    async def advance(
        self,
        id: str,
        *,
        position: int,
        after: str | None,
        resealed: int,
        failed: int,
        failures: Sequence[Mapping[str, str]],
        done: bool,
    ) -> RewrapRecord | None:
        """Keep a pass's progress: where it is now, and the counts and failures it adds (the first 20 failures are
        kept); ``done`` finishes it. ``None`` when it is no longer running."""
        ...


REWRAPS: Repository[Rewraps] = Repository(module="nodes", name="rewraps")
"""The store's ``Rewraps``."""
SEALED_CA_KEYS: Repository[Sealed] = Repository(module="nodes", name="sealed_ca_keys")
"""The CA keys' private halves (``ca_keys.sealed_key``)."""
SEALED_SIGNING_KEYS: Repository[Sealed] = Repository(module="nodes", name="sealed_signing_keys")
"""The instruction keys' private halves (``signing_keys.sealed_key``)."""
SEALED_JOIN_KEYS: Repository[Sealed] = Repository(module="nodes", name="sealed_join_keys")
"""JoinService's private keys (``join_keys.sealed_key``)."""
