"""Inputs and outputs of the ``nodes`` and ``join-tokens`` groups.

Field rules are declared with ``bettercompute.fields``: the codec enforces them (``INVALID_INPUT`` at the field's
path) and the OpenAPI document publishes them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

import attrs

from bettercompute.fields import Integer, Items, Text
from bettercompute.paging import PageInput

__all__ = [
    "KEY",
    "MAX_EXPIRY",
    "MAX_USES",
    "MIN_EXPIRY",
    "NODE",
    "Condition",
    "CordonNodeInput",
    "CreateJoinTokenInput",
    "CreatedJoinToken",
    "GetJoinTokenInput",
    "GetNodeInput",
    "GetRewrapInput",
    "JoinExpect",
    "JoinToken",
    "Key",
    "KeyKind",
    "ListJoinTokensInput",
    "ListJoinTokensOutput",
    "ListKeysInput",
    "ListKeysOutput",
    "ListNodesInput",
    "ListNodesOutput",
    "Node",
    "NodeState",
    "Reclaim",
    "RequalifyNodeInput",
    "RetireKeyInput",
    "RetireNodeInput",
    "RevokeJoinTokenInput",
    "RevokeNodeInput",
    "RevokedNode",
    "Rewrap",
    "RewrapFailure",
    "RotateKeyInput",
    "StartRewrapInput",
    "TokenState",
    "TunnelNodeInput",
    "TunnelOutput",
]

NODE = "node"
"""The resource type of nodes (projection rows, audit rows, tunnels)."""
NodeState = Literal["adopting", "adopted", "quarantined", "unreachable", "failed", "retired"]
_COLUMNS = Items(
    item=Text(pattern=r"[a-z_]{1,64}\.[a-z_]{1,64}", reason="is not a sealed column's module.name"),
    max_items=64,
    reason="at most 64 columns",
)
_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_REASON = Text(max_length=500, reason="at most 500 characters")


@attrs.frozen(kw_only=True)
class ListNodesInput(PageInput):
    """A tenant's nodes, of one pool when ``pool_id`` is given, one page at a time."""

    tenant: str = attrs.field(validator=_ID)
    pool_id: str | None = attrs.field(default=None, validator=_ID)


@attrs.frozen(kw_only=True)
class GetNodeInput:
    """A node by id."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class RevokeNodeInput:
    """Revoke every certificate of a node, saying why (kept in the audit row and the revocations)."""

    id: str = attrs.field(validator=_ID)
    reason: str = attrs.field(default="revoked by an operator", validator=_REASON)


@attrs.frozen(kw_only=True)
class RetireNodeInput:
    """Retire a node for good, saying why."""

    id: str = attrs.field(validator=_ID)
    reason: str = attrs.field(default="retired by an operator", validator=_REASON)


@attrs.frozen(kw_only=True)
class CordonNodeInput:
    """Stop new bookings on a node (``cordon``, ``drain``), or allow them again (``uncordon``), saying why."""

    id: str = attrs.field(validator=_ID)
    reason: str = attrs.field(default="", validator=_REASON)


@attrs.frozen(kw_only=True)
class RequalifyNodeInput:
    """Run a node's acceptance checks again (a quarantined node is adopted again if they pass)."""

    id: str = attrs.field(validator=_ID)
    reason: str = attrs.field(default="", validator=_REASON)


@attrs.frozen(kw_only=True)
class TunnelNodeInput:
    """A tunnel to a service a node listens to on its own loopback (``127.0.0.1:<port>``); the node's daemon takes
    only the ports its configuration lists (``bcd node --tunnel-local-port``)."""

    node_id: str = attrs.field(validator=_ID)
    port: int = attrs.field(validator=Integer(minimum=1, maximum=65535, reason="must be 1 to 65535"))


@attrs.frozen(kw_only=True)
class TunnelOutput:
    """A tunnel just opened: present ``ticket`` (once, within a minute: ``expires_at``) as the first frame of a
    ``Tunnel`` stream to ``gateway``, whose server certificate chains to ``ca_pem``."""

    tunnel_id: str
    ticket: str
    gateway: str
    ca_pem: str
    expires_at: dt.datetime


@attrs.frozen(kw_only=True)
class Condition:
    """One condition of a node: ``status`` ``True``, ``False`` or ``Unknown``, a machine-readable ``reason``, a
    message, and when the status last changed."""

    type: str
    status: str
    reason: str
    message: str
    last_transition_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class Node:
    """A joined machine: its state, the hardware claims of its latest join, what attestors recorded, its session, and
    its desired-state generations (the latest given, the latest its daemon acknowledged)."""

    id: str
    tenant: str
    pool_id: str
    site_id: str | None
    state: NodeState
    hardware_key: str
    claims: dict[str, Any]
    attestation: dict[str, Any]
    enrollments: int
    session_epoch: int
    last_seen_at: dt.datetime | None
    joined_at: dt.datetime
    created_at: dt.datetime
    retired_at: dt.datetime | None
    desired_generation: int
    observed_generation: int
    desired_state_pending: bool
    """Whether the daemon has yet to acknowledge the latest desired state (``observed_generation`` behind)."""
    state_reason: str | None
    """Why the node is in its state, machine-readable (a quarantine's failing finding, ``no_session``)."""
    state_detail: dict[str, Any]
    """For a quarantined node: the check, its findings and its output."""
    state_changed_at: dt.datetime | None
    cordoned: bool
    """No new bookings land on the node."""
    draining: bool
    """Cordoned, and its bookings run to their end."""
    unreachable_since: dt.datetime | None
    conditions: tuple[Condition, ...]


@attrs.frozen(kw_only=True)
class ListNodesOutput:
    """A page of nodes, oldest first; ``next_cursor`` is null on the last page."""

    nodes: tuple[Node, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class RevokedNode:
    """The node and the serials this call revoked (empty when all were revoked already)."""

    node: Node
    serials: tuple[str, ...]


# --- join tokens ------------------------------------------------------------------------------------------------

Reclaim = Literal["none", "same-hardware"]
TokenState = Literal["active", "expired", "revoked", "exhausted"]
MAX_USES = 10_000
MIN_EXPIRY = 60
MAX_EXPIRY = 30 * 24 * 3600
_USES = Integer(minimum=1, maximum=MAX_USES, reason=f"must be between 1 and {MAX_USES}")
_EXPIRY = Integer(
    minimum=MIN_EXPIRY, maximum=MAX_EXPIRY, reason=f"must be between {MIN_EXPIRY} and {MAX_EXPIRY} seconds (30 days)"
)
_CLAIM = Text(
    pattern=r"[\x21-\x7e]([\x20-\x7e]{0,126}[\x21-\x7e])?",
    reason="must be 1 to 128 printable ASCII characters, not starting or ending in a space",
)
_GPU_COUNT = Integer(minimum=0, maximum=1024, reason="must be between 0 and 1024")


@attrs.frozen(kw_only=True)
class JoinExpect:
    """Hardware claims a joining machine must match (each one left out is not checked)."""

    serial: str | None = attrs.field(default=None, validator=_CLAIM)
    product: str | None = attrs.field(default=None, validator=_CLAIM)
    gpu_model: str | None = attrs.field(default=None, validator=_CLAIM)
    gpu_count: int | None = attrs.field(default=None, validator=_GPU_COUNT)


@attrs.frozen(kw_only=True)
class CreateJoinTokenInput:
    """A token for joining machines to a pool.

    ``reclaim``: ``same-hardware`` lets a re-imaged machine with the same hardware key take back its node id;
    ``none`` makes every join a new node.
    """

    pool_id: str = attrs.field(validator=_ID)
    uses: int = attrs.field(default=1, validator=_USES)
    expires_in_seconds: int = attrs.field(default=24 * 3600, validator=_EXPIRY)
    expect: JoinExpect = attrs.field(factory=JoinExpect)
    reclaim: Reclaim = "none"


@attrs.frozen(kw_only=True)
class JoinToken:
    """A join token without its secret: ``state`` is ``active``, ``expired``, ``revoked`` or ``exhausted``."""

    id: str
    pool_id: str
    tenant: str
    uses: int
    uses_left: int
    expires_at: dt.datetime
    expect: JoinExpect
    reclaim: Reclaim
    state: TokenState
    created_at: dt.datetime
    revoked_at: dt.datetime | None


@attrs.frozen(kw_only=True, repr=False)
class CreatedJoinToken:
    """The new token, shown here only, and what carries it to a machine.

    ``join_command`` pins the CA bundle itself (``--ca-bundle``); ``short_join_command`` pins it by ``ca_pin``
    (``--ca-pin sha256:<hex>``: the SHA-256 of the CA certificates in DER, sorted and concatenated; the daemon fetches
    the bundle from the gateway and trusts it only if it matches). ``install_script`` (POSIX ``sh``, run once as
    root) writes the pinned configuration, installs ``bcd`` and its systemd unit, joins and starts the daemon. The
    last three are null until the deployment has a CA and JoinService (``Options.join`` with ``Options.kms``). The
    commands and the script hold the token: keep them as secret as the token.
    """

    id: str
    token: str
    pool_id: str
    uses_left: int
    expires_at: dt.datetime
    expect: JoinExpect
    reclaim: Reclaim
    join_command: str
    ca_pin: str | None = None
    short_join_command: str | None = None
    install_script: str | None = None

    def __repr__(self) -> str:
        return f"CreatedJoinToken(id={self.id!r}, pool_id={self.pool_id!r}, token=<hidden>)"


@attrs.frozen(kw_only=True)
class ListJoinTokensInput(PageInput):
    """The pool whose tokens to list, one page at a time."""

    pool_id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListJoinTokensOutput:
    """A page of the pool's tokens, newest first, without secrets; ``next_cursor`` is null on the last page."""

    tokens: tuple[JoinToken, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class GetJoinTokenInput:
    """A token by id."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class RevokeJoinTokenInput:
    """A token to end now (revoking a revoked token changes nothing)."""

    id: str = attrs.field(validator=_ID)


# --- keys -------------------------------------------------------------------------------------------------------

KEY = "key"
"""The resource type of the control plane's own keys (root scope only)."""
KeyKind = Literal["ca", "instructions", "join"]
"""``ca``: the node CA's signing keys; ``instructions``: the key desired states and commands are signed with;
``join``: JoinService's key, which join tokens are sealed to."""


@attrs.frozen(kw_only=True)
class Key:
    """One of the control plane's keys: never its private half, which only the KMS opens."""

    kind: KeyKind
    id: str
    state: Literal["active", "previous", "retired"]
    created_at: dt.datetime
    not_after: dt.datetime | None = None
    """When its certificate ends (a CA key's own; the instruction key's current one); for a previous JoinService key,
    when its overlap ends (then it opens nothing more)."""
    retired_at: dt.datetime | None = None
    issuer_id: str | None = None
    """For a CA intermediate, the root that certified it (``rotate`` makes a new intermediate under the same root);
    none for a root, which daemons pin and which never rotates here, and for the other kinds."""


@attrs.frozen(kw_only=True)
class ListKeysInput(PageInput):
    """The control plane's keys, of one kind when ``kind`` is given, one page at a time (by kind, then age)."""

    kind: KeyKind | None = None


@attrs.frozen(kw_only=True)
class ListKeysOutput:
    keys: tuple[Key, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class RotateKeyInput:
    """Make a new active key of ``kind``; the current one becomes ``previous`` and keeps being trusted until it is
    retired (``ca``, ``instructions``) or, for ``join``, for ``overlap_seconds`` (a day by default, at most 30):
    join commands printed before the rotation work that long."""

    kind: KeyKind
    overlap_seconds: int = attrs.field(
        default=86_400, validator=Integer(minimum=0, maximum=30 * 86_400, reason="from 0 to 2592000 (30 days)")
    )


@attrs.frozen(kw_only=True)
class RetireKeyInput:
    """Stop trusting a ``previous`` key. ``force`` retires it even while what it signed may still be in use: a CA
    intermediate with unexpired certificates (they are revoked with it, so their nodes must join again), an
    instruction key made ``previous`` less than a day ago."""

    kind: KeyKind
    id: str = attrs.field(validator=_ID)
    force: bool = False


@attrs.frozen(kw_only=True)
class StartRewrapInput:
    """Open every stored KMS blob and seal it again under the KMS's current key (``Options.kms``; with a
    ``KmsRing``, its ``current``). Start it once every process runs with the new key. ``columns`` limits it to
    these sealed columns (``module.name``, as a re-wrap lists them); every one when empty."""

    columns: tuple[str, ...] = attrs.field(default=(), validator=_COLUMNS)


@attrs.frozen(kw_only=True)
class GetRewrapInput:
    """A re-wrap by id (``kmr_...``)."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class RewrapFailure:
    """A stored blob that opened under no key of the KMS: its column and the id of its row."""

    column: str
    key: str


@attrs.frozen(kw_only=True)
class Rewrap:
    """A re-wrap of the stored KMS blobs. ``running`` until every column is walked (a worker's ``controllers`` job
    goes on where the last pass stopped, whichever process runs it), then ``done``. ``resealed`` counts the blobs
    sealed again; ``failed`` those that opened under no key (the first are in ``failures``): they stay as they were.
    """

    id: str
    state: Literal["running", "done"]
    columns: tuple[str, ...]
    """The sealed columns it walks, in order (``module.name``)."""
    columns_done: int
    resealed: int
    failed: int
    failures: tuple[RewrapFailure, ...]
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
