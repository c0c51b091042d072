"""The ``join-tokens`` group: one-time tokens that join machines to a pool (only a hash of a token's secret is
kept), and the join command and install script that carry a token to a machine."""

from __future__ import annotations

import base64
import datetime as dt
import shlex
from typing import Any

import attrs

from bettercompute._runtime.registry import CallContext, method
from bettercompute.errors import NotFoundError
from bettercompute.modules._tenants import require_tenant
from bettercompute.modules.nodes._ca import trust_bundle_pem_of
from bettercompute.modules.nodes._install import bundle_pin, install_script
from bettercompute.modules.nodes._port import CERTIFICATES, JOIN_KEYS, JOIN_TOKENS, JoinTokenRecord
from bettercompute.modules.nodes._schemas import (
    CreatedJoinToken,
    CreateJoinTokenInput,
    GetJoinTokenInput,
    JoinExpect,
    JoinToken,
    ListJoinTokensInput,
    ListJoinTokensOutput,
    RevokeJoinTokenInput,
)
from bettercompute.modules.nodes._tokens import JoinSettings, new_token
from bettercompute.modules.pools import POOL, POOLS, PoolRecord
from bettercompute.paging import Keyset
from bettercompute.ports import ResourceRef

__all__ = ["JOIN_TOKEN", "create_token", "get_token", "join_command", "list_tokens", "revoke_token", "token_state"]

JOIN_TOKEN = "join-token"  # noqa: S105 - a resource type, not a secret


def _on_pool(input: Any) -> ResourceRef:
    # The pool's projection row decides its tenant and pool (a pool not projected only passes a root-scope grant).
    return ResourceRef(type=POOL, id=input.pool_id, pool=input.pool_id)


async def _existing_pool(call: CallContext, pool_id: str) -> PoolRecord:
    record = await call.context.store.repository(POOLS).get(pool_id)
    if record is None:
        raise NotFoundError("no such pool", details={"id": pool_id})
    return record


def _on_token(input: Any) -> ResourceRef:
    # Projected with its pool at create: decided on the token's pool, as create and list are.
    return ResourceRef(type=JOIN_TOKEN, id=input.id)


def _expect(stored: Any) -> JoinExpect:
    return JoinExpect(**{k: v for k, v in dict(stored).items() if k in {f.name for f in attrs.fields(JoinExpect)}})


def token_state(record: JoinTokenRecord, now: dt.datetime) -> str:
    """``revoked``, ``expired``, ``exhausted`` or ``active``, in that order of precedence."""
    if record.revoked_at is not None:
        return "revoked"
    if record.expires_at <= now:
        return "expired"
    if record.uses_left <= 0:
        return "exhausted"
    return "active"


def _token(record: JoinTokenRecord, now: dt.datetime) -> JoinToken:
    reclaim: Any = record.reclaim
    state: Any = token_state(record, now)
    return JoinToken(
        id=record.id,
        pool_id=record.pool_id,
        tenant=record.tenant,
        uses=record.uses,
        uses_left=record.uses_left,
        expires_at=record.expires_at,
        expect=_expect(record.expect),
        reclaim=reclaim,
        state=state,
        created_at=record.created_at,
        revoked_at=record.revoked_at,
    )


def join_command(
    token: str,
    settings: JoinSettings | None,
    *,
    pool_id: str | None = None,
    ca_bundle_pem: str | None = None,
    join_key: str | None = None,
    ca_pin: str | None = None,
) -> str:
    """The ``bcd join`` command line for ``token``, pinned to what is known.

    ``--pool`` pins the pool the machine is meant for (JoinService refuses a token of another pool);
    ``--gateway`` and ``--trust-domain`` come from ``Options.join``; ``--ca-bundle`` (base64 of the PEM bundle) and
    ``--join-key`` (JoinService's X25519 public key) are the live ones, once the CA and JoinService have made their
    keys (at ``initialize()`` when ``Options.join`` and ``Options.kms`` are set). With ``ca_pin`` it is the short
    form, ``--ca-pin`` instead of ``--ca-bundle``. Without ``Options.join`` it is the bare ``bcd join --token ...``.
    """
    parts = ["bcd", "join", "--token", token]
    if pool_id is not None:
        parts += ["--pool", pool_id]
    if settings is not None:
        parts += ["--gateway", settings.gateway_address, "--trust-domain", settings.trust_domain]
        if ca_pin is not None:
            parts += ["--ca-pin", ca_pin]
        elif ca_bundle_pem:
            parts += ["--ca-bundle", base64.b64encode(ca_bundle_pem.encode()).decode()]
        if join_key is not None:
            parts.append(f"--join-key={join_key}")  # attached: a key may start with '-', which reads as an option
    return shlex.join(parts)


async def _pins(call: CallContext) -> tuple[str | None, str | None]:
    """The live CA bundle (PEM) and JoinService public key, where node identity is on and they exist."""
    settings = call.context.settings.get(JoinSettings)
    store = call.context.store
    # Made by node identity only (Options.join with Options.kms); without a KMS no key is ever made.
    if settings is None or call.context.kms is None:
        return None, None
    keys = await store.repository(CERTIFICATES).keys(settings.trust_domain)
    bundle = trust_bundle_pem_of(keys) or None
    join_key = await store.repository(JOIN_KEYS).active()
    return bundle, join_key.public_key if join_key is not None else None


_TOKEN_PAGES: Keyset[JoinToken] = Keyset(dt.datetime, str, key=lambda t: (t.created_at, t.id))


@method(mutates=True, resource=_on_pool, replayable=False)
async def create_token(call: CallContext, input: CreateJoinTokenInput) -> CreatedJoinToken:
    """Mint a join token for a pool; the token is in this answer only (only its secret's hash is stored).

    Raises:
        NotFoundError: there is no such pool, or its tenant does not exist.
    """
    context = call.context
    pool = await _existing_pool(call, input.pool_id)
    bundle, join_key = await _pins(call)
    token_id, token, secret_hash = new_token()
    expires_at = context.clock.now() + dt.timedelta(seconds=input.expires_in_seconds)
    expect = {k: v for k, v in attrs.asdict(input.expect).items() if v is not None}
    async with call.transaction() as tx:
        # A pool written before tenants were checked may name one that does not exist: mint nothing for it.
        await require_tenant(tx, pool.tenant)
        record = await tx.repository(JOIN_TOKENS).create(
            id=token_id,
            pool_id=pool.id,
            tenant=pool.tenant,
            secret_hash=secret_hash,
            uses=input.uses,
            expires_at=expires_at,
            expect=expect,
            reclaim=input.reclaim,
            created_by=call.identity.principal_id if call.identity else None,
        )
        await tx.project(ResourceRef(type=JOIN_TOKEN, id=token_id, tenant=pool.tenant, pool=pool.id))
        call.describe(
            resource_type=JOIN_TOKEN,
            resource_id=token_id,
            tenant=pool.tenant,
            details={"pool_id": pool.id, "uses": input.uses, "expires_at": expires_at.isoformat()},
        )
    settings = context.settings.get(JoinSettings)
    pin = bundle_pin(bundle) if bundle else None
    short_command = script = None
    if settings is not None and pin is not None and join_key is not None:
        short_command = join_command(token, settings, pool_id=pool.id, join_key=join_key, ca_pin=pin)
        script = install_script(
            token=token,
            gateway=settings.gateway_address,
            trust_domain=settings.trust_domain,
            pool_id=pool.id,
            join_key=join_key,
            ca_pin=pin,
        )
    return CreatedJoinToken(
        id=record.id,
        token=token,
        pool_id=record.pool_id,
        uses_left=record.uses_left,
        expires_at=record.expires_at,
        expect=_expect(record.expect),
        reclaim=input.reclaim,
        join_command=join_command(token, settings, pool_id=pool.id, ca_bundle_pem=bundle, join_key=join_key),
        ca_pin=pin,
        short_join_command=short_command,
        install_script=script,
    )


@method(mutates=False, resource=_on_pool)
async def list_tokens(call: CallContext, input: ListJoinTokensInput) -> ListJoinTokensOutput:
    """A page of a pool's join tokens, newest first, without secrets.

    Raises:
        NotFoundError: there is no such pool.
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _TOKEN_PAGES.after(scope, input.cursor)
    await _existing_pool(call, input.pool_id)
    records = await call.context.store.repository(JOIN_TOKENS).for_pool(
        input.pool_id, after=after, limit=input.limit + 1
    )
    now = call.context.clock.now()
    tokens, next_cursor = _TOKEN_PAGES.page(scope, [_token(r, now) for r in records], input.limit)
    return ListJoinTokensOutput(tokens=tokens, next_cursor=next_cursor)


@method(mutates=False, resource=_on_token)
async def get_token(call: CallContext, input: GetJoinTokenInput) -> JoinToken:
    """A join token by id, without its secret, with its state.

    Raises:
        NotFoundError: there is no such token.
    """
    record = await call.context.store.repository(JOIN_TOKENS).get(input.id)
    if record is None:
        raise NotFoundError("no such join token", details={"id": input.id})
    return _token(record, call.context.clock.now())


@method(mutates=True, resource=_on_token)
async def revoke_token(call: CallContext, input: RevokeJoinTokenInput) -> JoinToken:
    """End a join token now; joins with it are refused from then on.

    Raises:
        NotFoundError: there is no such token.
    """
    async with call.transaction() as tx:
        record = await tx.repository(JOIN_TOKENS).revoke(input.id)
        if record is None:
            raise NotFoundError("no such join token", details={"id": input.id})
        call.describe(
            resource_type=JOIN_TOKEN,
            resource_id=input.id,
            tenant=record.tenant,
            details={"pool_id": record.pool_id},
        )
    return _token(record, call.context.clock.now())
