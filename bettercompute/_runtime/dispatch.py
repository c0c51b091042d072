"""The dispatcher shared by the in-process ``api`` and HTTP: authenticate, decode, authorize, then the handler.

Order matters and is the same on every path:

1. authenticate the credential (``UNAUTHENTICATED``);
2. decode and validate the input (``INVALID_INPUT``); a group whose module is unavailable in this composition (an
   option it needs is not set) answers ``FAILED_PRECONDITION`` saying which, here;
3. tenant pre-check: a caller outside the input's tenant, and not in the root tenant, is refused before any
   database access (``ACCESS_DENIED``);
4. one IAM decision on the method's action and resource (``ACCESS_DENIED``). A mutation IAM refuses leaves an
   audit row with outcome ``denied`` (in a transaction of its own, after the decision; refused reads leave none, as
   reads are not audited). A step-3 refusal stays free of database access and is logged instead;
5. with an idempotency key (mutating methods only): replay, conflict or reserve (see ``_runtime.idempotency``);
6. the plugin chain, the handler innermost. A mutating call's audit row is written by its ``CallContext``: in the
   handler's ``call.transaction()`` as it commits, or alone after the handler when it wrote through none.

An admitting method (``@method(admit=...)``, a request-as-resource ``create``) follows the spec's admission sequence
in place of steps 4 and 5: after the tenant pre-check, its ``admit`` runs transaction 1 (the idempotency key, the
draft, its projection row) and answers a replay at once; then the IAM decision on the draft, and only then the
plugin chain and the handler (transaction 2, which writes the audit row with the decision's id). A refusal, or a
failure before transaction 2 commits, takes the draft back.

Anything that escapes as a non-``ComputeError`` becomes ``InternalError`` with an id the log line shares; neither
the caller nor the log sees the exception's text, which may hold SQL or a secret.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from bettercompute._runtime import codec as _codec
from bettercompute._runtime import idempotency
from bettercompute._runtime.declarations import Intercepted, Next, Plugin
from bettercompute._runtime.registry import Admission, CallContext, Drafted, MethodDef
from bettercompute.errors import (
    AccessDeniedError,
    ComputeError,
    FailedPreconditionError,
    InternalError,
    InvalidInputError,
    UnauthenticatedError,
)
from bettercompute.ports import AuditRecord, Decision, Iam, Identity, ResourceRef

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = ["Dispatcher"]

log = logging.getLogger("bettercompute.dispatch")


def _chain(plugins: Sequence[Plugin]) -> Next:
    async def innermost(intercepted: Intercepted) -> Any:
        return await intercepted.call.method.handler(intercepted.call, intercepted.input)

    chain: Next = innermost
    for plugin in reversed(plugins):
        chain = _link(plugin, chain)
    return chain


def _link(plugin: Plugin, next: Next) -> Next:
    async def link(intercepted: Intercepted) -> Any:
        return await plugin.intercept(intercepted, next)

    return link


def _internal(method: MethodDef[Any, Any], request_id: str, exc: BaseException) -> InternalError:
    # Only the exception's class is logged: its text may carry SQL or secrets (see the module docstring).
    log.error("internal error in %s.%s (request %s): %s", method.group, method.name, request_id, type(exc).__name__)
    return InternalError("an internal error occurred", details={"request_id": request_id})


class Dispatcher:
    """Runs one method call through the fixed sequence above."""

    def __init__(
        self,
        *,
        iam: Iam,
        context: ModuleContext,
        plugins: Sequence[Plugin],
        unavailable: Mapping[str, str] | None = None,
    ) -> None:
        self._iam = iam
        self._context = context
        self._chain = _chain(plugins)
        self._unavailable = dict(unavailable or {})
        """Group name -> why its module cannot serve here (``Module.unavailable``)."""

    async def authenticate(self, method: MethodDef[Any, Any], credential: str | None) -> Identity | None:
        """Step 1; ``None`` for a method that needs no credential."""
        if not method.authenticated:
            return None
        if not credential:
            raise UnauthenticatedError("a credential is required (Authorization: Bearer <credential>)")
        try:
            return await self._iam.authenticate(credential)
        except ComputeError:
            raise
        except Exception as exc:
            raise _internal(method, uuid.uuid4().hex, exc) from exc

    async def run(
        self, method: MethodDef[Any, Any], identity: Identity | None, input: Any, *, idempotency_key: str | None = None
    ) -> tuple[Any, Any]:
        """Steps 3 to 6, for an input already decoded; returns the handler's output object and its JSON value."""
        request_id = uuid.uuid4().hex
        reason = self._unavailable.get(method.group)
        if reason is not None:
            raise FailedPreconditionError(reason, details={"group": method.group})
        try:
            decision = None
            resource = method.resource(input)
            if identity is not None:
                if resource.tenant is not None and resource.tenant != identity.tenant_id and not identity.is_root:
                    # Decided and answered without any database access (the spec's order), so a flood of these costs
                    # the database nothing: the refusal's trace is a log line, not an audit row.
                    log.info(
                        "refused %s to %s: outside tenant %s",
                        method.action,
                        identity.principal_id,
                        resource.tenant,
                    )
                    raise AccessDeniedError("the caller is outside this tenant", details={"action": method.action})
                if method.admit is not None:
                    return await self._admit(method, identity, input, resource, request_id, idempotency_key)
                decision = await self._require(method, identity, resource)
            call = CallContext(
                method=method,
                identity=identity,
                decision=decision,
                context=self._context,
                request_id=request_id,
                resource=resource,
            )
            request = self._idempotent(method, identity, input, idempotency_key)
            if request is None:
                return await self._handle(call, input)
            answer: list[Any] = []

            async def handle() -> Any:
                answer[:] = await self._handle(call, input)
                return answer[1]

            ran, wire = await idempotency.once(
                self._context.store.idempotency,
                request,
                replayable=method.replayable,
                run=handle,
                committed=lambda: (call.resource_id or "") if call.audited else None,
            )
            return (answer[0], wire) if ran else (_codec.decode(method.output, wire), wire)
        except ComputeError:
            raise
        except Exception as exc:
            raise _internal(method, request_id, exc) from exc

    async def _admit(
        self,
        method: MethodDef[Any, Any],
        identity: Identity,
        input: Any,
        resource: ResourceRef,
        request_id: str,
        idempotency_key: str | None,
    ) -> tuple[Any, Any]:
        """An admitting method's call (see the module docstring): its ``admit`` step reserves the key (if any) with
        its draft, through ``idempotency.reserve``."""
        assert method.admit is not None
        admission = Admission(idempotency=self._idempotent(method, identity, input, idempotency_key))
        first = CallContext(
            method=method,
            identity=identity,
            decision=None,
            context=self._context,
            request_id=request_id,
            resource=resource,
            admission=admission,
        )
        drafted: Drafted = await method.admit(first, input)
        if drafted.replay is not None:
            return drafted.replay, _codec.encode(drafted.replay)
        assert drafted.resource is not None, "an admit step returns a replay or the draft's resource"
        call: CallContext | None = None
        try:
            decision = await self._require(method, identity, drafted.resource)
            call = CallContext(
                method=method,
                identity=identity,
                decision=decision,
                context=self._context,
                request_id=request_id,
                resource=drafted.resource,
                admission=attrs.evolve(admission, drafted=drafted),
            )
            return await self._handle(call, input)
        except BaseException:
            if drafted.undo is not None and (call is None or not call.audited):
                with anyio.CancelScope(shield=True):
                    try:
                        await drafted.undo()
                    except Exception as exc:  # a sweeper takes stale drafts back
                        log.warning("a draft could not be taken back now: %s", type(exc).__name__)
            raise

    async def _require(self, method: MethodDef[Any, Any], identity: Identity, resource: ResourceRef) -> Decision:
        """IAM's decision; a refused mutation leaves an audit row (outcome ``denied``) before its error is raised."""
        try:
            return await self._iam.require(identity, method.action, resource)
        except AccessDeniedError as refused:
            await self._audit_refusal(method, identity, resource, refused)
            raise

    async def _audit_refusal(
        self, method: MethodDef[Any, Any], identity: Identity, resource: ResourceRef, refused: AccessDeniedError
    ) -> None:
        """One audit row for a mutation the caller was refused, in a transaction of its own (reads are not audited,
        refused or not). Its failure is logged and the caller still gets the refusal."""
        if not method.mutates:
            return
        record = AuditRecord(
            action=method.action,
            actor=identity.principal_id,
            tenant=resource.tenant,
            resource_type=resource.type,
            resource_id=resource.id,
            decision_id=None,
            outcome="denied",
            details={"reason": refused.message},
        )
        with anyio.CancelScope(shield=True):
            try:
                async with self._context.store.transaction() as tx:
                    await tx.audit(record)
            except Exception as exc:
                log.warning("the audit row of a refused %s was not written: %s", method.action, type(exc).__name__)

    async def _handle(self, call: CallContext, input: Any) -> tuple[Any, Any]:
        """The plugin chain and the handler; a mutating call that wrote nothing through ``call.transaction()`` has
        its audit row written alone, so every mutating call leaves exactly one."""
        method = call.method
        output = await self._chain(Intercepted(call=call, input=input))
        if not isinstance(output, method.output):
            raise TypeError(f"{method!r} returned {type(output).__name__}, not {method.output.__name__}")
        if method.mutates and not call.audited:
            await call.audit_alone()
        # Encoded here on both paths, so an output that cannot be sent fails the same way in-process and over HTTP,
        # inside this error mapping.
        return output, _codec.encode(output)

    @staticmethod
    def _idempotent(
        method: MethodDef[Any, Any], identity: Identity | None, input: Any, header: str | None
    ) -> idempotency.IdempotentRequest | None:
        """Step 5's request: the key (header or input field), its owner and the request's fingerprint."""
        owner = identity.principal_id if identity is not None else None
        return idempotency.request_of(
            identity=owner, path=method.path, input=input, header=header, encode=_codec.encode
        )

    def _key(self, method: MethodDef[Any, Any], idempotency_key: str | None) -> str | None:
        if idempotency_key is None:
            return None
        if not method.mutates:
            raise InvalidInputError(
                f"{method.group}.{method.name} changes nothing and takes no idempotency key",
                details={"path": "Idempotency-Key", "reason": "not a mutating method"},
            )
        return idempotency.checked_key(idempotency_key)

    async def call(
        self, method: MethodDef[Any, Any], credential: str | None, input: Any, *, idempotency_key: str | None = None
    ) -> Any:
        """The in-process path: validates ``input`` exactly as HTTP would, by the codec's round trip."""
        identity = await self.authenticate(method, credential)
        key = self._key(method, idempotency_key)
        if not isinstance(input, method.input):
            raise InvalidInputError(
                f"expected a {method.input.__name__}, got {type(input).__name__}",
                details={"path": "", "reason": "wrong input type"},
            )
        try:
            wire = _codec.encode(input)
        except (TypeError, ValueError, AttributeError, RecursionError):
            raise InvalidInputError("the input holds a value of the wrong type", details={"path": ""}) from None
        decoded = _codec.decode(method.input, wire)
        output, _ = await self.run(method, identity, decoded, idempotency_key=key)
        return output

    async def call_json(
        self, method: MethodDef[Any, Any], credential: str | None, body: bytes, *, idempotency_key: str | None = None
    ) -> Any:
        """The HTTP path: ``body`` is the raw request body (empty means ``{}``); returns a JSON value."""
        identity = await self.authenticate(method, credential)
        key = self._key(method, idempotency_key)
        if body.strip():
            try:
                parsed = json.loads(body)
            except (ValueError, UnicodeDecodeError, RecursionError):
                raise InvalidInputError("the body is not valid JSON", details={"path": ""}) from None
        else:
            parsed = {}
        decoded = _codec.decode(method.input, parsed)
        _, wire = await self.run(method, identity, decoded, idempotency_key=key)
        return wire
