"""The ``keys`` group: the control plane's own keys, listed, rotated and retired (root scope only, audited).

A rotation overlaps: the new key becomes ``active`` and the old one ``previous``, which everything keeps trusting
until it is retired.

- ``ca``: a new intermediate under the same root (the root is what daemons and join tokens pin, so the pin does not
  change); what the old intermediate issued keeps verifying, daemons get certificates of the new one when they
  renew, and the old one is retired once the certificates it issued have expired (``retire`` refuses earlier
  without ``force``, which revokes them; the active root is never retired).
- ``instructions``: new desired states and commands are signed with the new key at once (each process reads the
  keys again within seconds); retiring the old one signs again every current desired state it signed.
- ``join``: join commands and install scripts made from then on carry the new key; the one before still opens what
  is sealed to it for the rotation's overlap (a day by default), so commands printed earlier keep working that
  long; retiring it ends the overlap at once.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from bettercompute._runtime.registry import CallContext, method
from bettercompute.errors import FailedPreconditionError
from bettercompute.modules.nodes._ca import CertificateAuthority
from bettercompute.modules.nodes._instructions import InstructionSigner, signer_of
from bettercompute.modules.nodes._join_keys import retire_join_key, rotate_join_key
from bettercompute.modules.nodes._port import JOIN_KEYS, CaKey, JoinKeyRecord, SigningKey
from bettercompute.modules.nodes._schemas import (
    KEY,
    Key,
    ListKeysInput,
    ListKeysOutput,
    RetireKeyInput,
    RotateKeyInput,
)
from bettercompute.modules.nodes._service import _ca, _identity
from bettercompute.modules.nodes._tokens import IDENTITY_NEEDS
from bettercompute.paging import Keyset
from bettercompute.ports import ResourceRef

__all__ = ["list_keys", "retire_key", "rotate_key"]


def _root(input: Any) -> ResourceRef:
    return ResourceRef(type=KEY, tenant=None)


def _signer(call: CallContext) -> InstructionSigner:
    signer = signer_of(call.context.store)
    if signer is None:
        raise FailedPreconditionError(IDENTITY_NEEDS, details={"needs": ["join", "kms"]})
    return signer


def _ca_key(key: CaKey) -> Key:
    return Key(
        kind="ca",
        id=key.id,
        state=key.state,  # type: ignore[arg-type]
        created_at=key.created_at,
        not_after=key.not_after,
        retired_at=key.retired_at,
        issuer_id=key.issuer_id,
    )


def _signing_key(key: SigningKey) -> Key:
    return Key(
        kind="instructions",
        id=key.id,
        state=key.state,  # type: ignore[arg-type]
        created_at=key.created_at,
        not_after=key.certificate_not_after,
        retired_at=key.retired_at,
    )


def _join_key(key: JoinKeyRecord) -> Key:
    return Key(
        kind="join",
        id=key.id,
        state=key.state,  # type: ignore[arg-type]
        created_at=key.created_at,
        not_after=key.retire_after if key.state != "active" else None,
        retired_at=key.retire_after if key.state == "retired" else None,
    )


@method(mutates=False, access="manage", resource=_root)
async def list_keys(call: CallContext, input: ListKeysInput) -> ListKeysOutput:
    """The control plane's keys (never a private half), oldest first within each kind.

    Raises:
        FailedPreconditionError: node identity is off (no CA, no instruction key, no JoinService key).
    """
    ca, signer = _ca(call), _signer(call)
    scope = call.method.action
    after = _PAGES.after(scope, input.cursor)
    keys: list[Key] = []
    if input.kind in (None, "ca"):
        keys += [_ca_key(k) for k in await ca.keys()]
    if input.kind in (None, "instructions"):
        keys += [_signing_key(k) for k in await signer.keys()]
    if input.kind in (None, "join"):
        keys += [_join_key(k) for k in await call.context.store.repository(JOIN_KEYS).list()]
    # A handful of keys: read whole, ordered and cut here.
    ordered = sorted(keys, key=_order)
    rest = [k for k in ordered if after is None or _order(k) > after]
    page, next_cursor = _PAGES.page(scope, rest[: input.limit + 1], input.limit)
    return ListKeysOutput(keys=page, next_cursor=next_cursor)


def _order(key: Key) -> tuple[str, dt.datetime, str]:
    return (key.kind, key.created_at, key.id)


_PAGES: Keyset[Key] = Keyset(str, dt.datetime, str, key=_order)


@method(mutates=True, access="manage", resource=_root)
async def rotate_key(call: CallContext, input: RotateKeyInput) -> Key:
    """Make a new active key of ``kind``; the one before stays trusted (``previous``) until it is retired.

    Raises:
        FailedPreconditionError: node identity is off.
    """
    if input.kind == "ca":
        ca: CertificateAuthority = _ca(call)
        made = _ca_key(await ca.rotate())
    elif input.kind == "join":
        _, kms = _identity(call)
        overlap = dt.timedelta(seconds=input.overlap_seconds)
        made = _join_key(await rotate_join_key(call.context.store, kms, overlap=overlap, clock=call.context.clock))
    else:
        made = _signing_key(await _signer(call).rotate())
    call.describe(resource_type=KEY, resource_id=made.id, details={"kind": made.kind})
    return made


@method(mutates=True, access="manage", resource=_root)
async def retire_key(call: CallContext, input: RetireKeyInput) -> Key:
    """Stop trusting a ``previous`` key of ``kind``.

    Raises:
        NotFoundError: no such key.
        FailedPreconditionError: the key is the active one; or, without ``force``, a CA key whose certificates have
            not all expired, or an instruction key made ``previous`` less than a day ago; or node identity is off.
    """
    if input.kind == "ca":
        ca = _ca(call)
        await ca.retire(input.id, force=input.force)
        retired = next(_ca_key(k) for k in await ca.keys() if k.id == input.id)
    elif input.kind == "join":
        _identity(call)
        retired = _join_key(await retire_join_key(call.context.store, input.id))
    else:
        retired = _signing_key(await _signer(call).retire(input.id, force=input.force))
    call.describe(resource_type=KEY, resource_id=input.id, details={"kind": input.kind, "force": input.force})
    return retired
