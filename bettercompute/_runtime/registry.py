"""Methods declared once, and the registry that holds them.

A method is its handler, declared with ``@method``; the input and output types are read from the handler's
annotations. A group is a class listing its methods::

    @method(mutates=False, access="open")
    async def version(call: CallContext, input: VersionInput) -> VersionOutput: ...

    class SystemGroup(GroupSpec[B]):
        name = "system"
        version = version

Everything else is derived from that declaration: the IAM action (``compute:<group>:<method>``), the module's
action catalog, IAM's open-to-everyone set and its built-in viewer and member roles (from ``access``), whether the
call is audited and takes an idempotency key (``mutates``), the OpenAPI document, and typed access:
``compute.api.system.version`` is an ``ApiCall[VersionInput, VersionOutput]`` and ``client.system.version`` an
``AsyncClientCall`` of the same types, because ``MethodDef`` is a descriptor whose result depends on what the group
instance is bound to.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, overload

import attrs

from bettercompute._runtime.access import ACCESS_LEVELS, Access
from bettercompute._runtime.codec import check_supported
from bettercompute._runtime.idempotency import IdempotentRequest
from bettercompute.errors import InvalidConfigError
from bettercompute.paging import convention_problems
from bettercompute.ports import AuditRecord, Decision, Identity, ResourceRef, Transaction

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = [
    "ApiBinding",
    "ApiCall",
    "AsyncClientBinding",
    "AsyncClientCall",
    "Binds",
    "CallContext",
    "ClientBinding",
    "ClientCall",
    "GroupSet",
    "GroupSpec",
    "MethodDef",
    "Registry",
    "method",
]

In = TypeVar("In")
Out = TypeVar("Out")
B = TypeVar("B")


_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_ACTION = re.compile(r"^[a-z][a-z0-9]*:[a-z][a-z0-9-]*:[a-z][a-z0-9-]*$")


class MethodInfo(Protocol):
    """What a handler may read of the method being called (a ``MethodDef``)."""

    @property
    def group(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def action(self) -> str: ...
    @property
    def mutates(self) -> bool: ...
    @property
    def access(self) -> Access: ...
    @property
    def input(self) -> type[Any]: ...
    @property
    def output(self) -> type[Any]: ...
    @property
    def handler(self) -> Callable[[CallContext, Any], Awaitable[Any]]: ...


@attrs.define
class _Audit:
    """What the call's audit row will say, and whether it was written."""

    resource_type: str
    resource_id: str | None
    tenant: str | None
    details: dict[str, Any] = attrs.field(factory=dict)
    outcome: str = "ok"
    written: bool = False


@attrs.frozen(kw_only=True)
class Drafted:
    """What an admitting method's first step (its ``admit``) did in transaction 1: the draft ``resource`` (projected
    in that transaction) that the IAM then decides on, ``undo`` to take the draft back if the call goes no further,
    and ``state`` for the handler; or, for an idempotent retry, ``replay``: the answer to give without going on."""

    resource: ResourceRef | None = None
    undo: Callable[[], Awaitable[None]] | None = None
    state: Any = None
    replay: Any = None
    refusal: Exception | None = None
    """An answer the first step found without drafting (a bad window, an unknown pool): the handler raises it,
    but only after the IAM allowed the call on ``resource``, so a caller without the action learns nothing from
    it."""


@attrs.frozen(kw_only=True)
class Admission:
    """An admitting call's idempotency (``None`` without a key: the key, its owner and the request's fingerprint, for
    the first step to reserve with its draft through ``idempotency.reserve``); in the handler, also what the first
    step drafted."""

    idempotency: IdempotentRequest | None
    drafted: Drafted | None = None


@attrs.frozen(kw_only=True)
class CallContext:
    """What a handler gets besides its input: who called, the decision that allowed it, and the module context.

    A mutating method writes through ``transaction()``: the call's one audit row, carrying the IAM decision's id,
    is written in that transaction as it commits, whatever the handler does; ``describe`` says what it records.
    """

    method: MethodInfo
    identity: Identity | None
    decision: Decision | None
    context: ModuleContext
    request_id: str
    resource: ResourceRef = attrs.field(factory=lambda: ResourceRef(type="unknown"))
    admission: Admission | None = None
    _audit: _Audit = attrs.field(init=False)

    @_audit.default
    def _first_audit(self) -> _Audit:
        return _Audit(resource_type=self.resource.type, resource_id=self.resource.id, tenant=self.resource.tenant)

    def describe(
        self,
        *,
        resource_type: str | None = None,
        resource_id: str | None = None,
        tenant: str | None = None,
        details: Mapping[str, Any] | None = None,
        outcome: str | None = None,
    ) -> None:
        """What this call's audit row records (by default the resource the action was decided on)."""
        audit = self._audit
        if resource_type is not None:
            audit.resource_type = resource_type
        if resource_id is not None:
            audit.resource_id = resource_id
        if tenant is not None:
            audit.tenant = tenant
        if details is not None:
            audit.details = dict(details)
        if outcome is not None:
            audit.outcome = outcome

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """A transaction of the store. For a mutating method, the first one to commit carries the call's audit row."""
        auditing = False
        async with self.context.store.transaction() as tx:
            yield tx
            if self.method.mutates and not self._audit.written:
                await tx.audit(self.audit_record())
                auditing = True
        if auditing:
            self._audit.written = True  # only once it committed

    @property
    def audited(self) -> bool:
        """Whether the call's audit row (and so its change) committed."""
        return self._audit.written

    def audited_by_store(self, resource_id: str) -> None:
        """Record that the store wrote this call's audit row itself, in the transaction that made the change (an
        admission's second transaction): the dispatcher then writes none and does not undo the draft."""
        self._audit.resource_id = resource_id
        self._audit.written = True

    async def audit_alone(self) -> None:
        """Write the audit row in a transaction of its own, for a mutating handler that made none (the dispatcher
        calls it after such a handler returned)."""
        async with self.transaction():
            pass

    @property
    def resource_id(self) -> str | None:
        """The id the call's audit row names (the resource it created or changed)."""
        return self._audit.resource_id

    def audit_record(self) -> AuditRecord:
        """The audit row of this call, carrying the id of the one decision that allowed it."""
        audit = self._audit
        return AuditRecord(
            action=self.method.action,
            actor=self.identity.principal_id if self.identity else "anonymous",
            tenant=audit.tenant,
            resource_type=audit.resource_type,
            resource_id=audit.resource_id,
            decision_id=self.decision.id if self.decision else None,
            outcome=audit.outcome,
            details=dict(audit.details),
        )


Handler = Callable[[CallContext, In], Awaitable[Out]]


class ApiBinding:
    """Marker: a group bound to the in-process ``api`` (calls take a credential and an input)."""


class AsyncClientBinding:
    """Marker: a group bound to the async HTTP client (calls take an input)."""


class ClientBinding:
    """Marker: a group bound to the blocking HTTP client (calls take an input)."""


class _ApiBinder(Protocol):
    async def call(
        self, method: MethodDef[Any, Any], credential: str | None, input: Any, *, idempotency_key: str | None = None
    ) -> Any: ...


class _AsyncClientBinder(Protocol):
    async def call(self, method: MethodDef[Any, Any], input: Any, *, idempotency_key: str | None = None) -> Any: ...


class _ClientBinder(Protocol):
    def call(self, method: MethodDef[Any, Any], input: Any, *, idempotency_key: str | None = None) -> Any: ...


class ApiCall(Generic[In, Out]):
    """A method of the in-process ``api``: ``await call(credential, input)``.

    A mutating method takes ``idempotency_key=``: a retry with the same key and the same input replays the first
    answer instead of doing it again (see ``Dispatcher``).
    """

    __slots__ = ("_binder", "method")

    def __init__(self, binder: _ApiBinder, method: MethodDef[In, Out]) -> None:
        self._binder = binder
        self.method = method

    async def __call__(self, credential: str | None, input: In, *, idempotency_key: str | None = None) -> Out:
        result: Out = await self._binder.call(self.method, credential, input, idempotency_key=idempotency_key)
        return result


class AsyncClientCall(Generic[In, Out]):
    """A method of ``AsyncClient``: ``await call(input)``; the input may be left out when it has no required field."""

    __slots__ = ("_binder", "method")

    def __init__(self, binder: _AsyncClientBinder, method: MethodDef[In, Out]) -> None:
        self._binder = binder
        self.method = method

    async def __call__(self, input: In | None = None, *, idempotency_key: str | None = None) -> Out:
        result: Out = await self._binder.call(self.method, input, idempotency_key=idempotency_key)
        return result


class ClientCall(Generic[In, Out]):
    """A method of the blocking ``Client``: ``call(input)``."""

    __slots__ = ("_binder", "method")

    def __init__(self, binder: _ClientBinder, method: MethodDef[In, Out]) -> None:
        self._binder = binder
        self.method = method

    def __call__(self, input: In | None = None, *, idempotency_key: str | None = None) -> Out:
        result: Out = self._binder.call(self.method, input, idempotency_key=idempotency_key)
        return result


def _no_resource(group: str) -> Callable[[Any], ResourceRef]:
    def resource(_: Any) -> ResourceRef:
        return ResourceRef(type=group)

    return resource


class MethodDef(Generic[In, Out]):
    """One method: its input and output types, its IAM action, the resource checked, and its handler.

    Args:
        input: An attrs class; the request body.
        output: An attrs class; the ``data`` of the response.
        handler: ``async (CallContext, input) -> output``.
        mutates: Whether the method changes state (mutations are audited and need idempotency where they create).
        action: The IAM action; ``<prefix>:<group>:<method>`` when left out.
        resource: Finds the resource the action is checked on (and its tenant, for the tenant pre-check).
        summary: One line for OpenAPI, the CLI and MCP.
        authenticated: ``False`` only for methods anyone may call, even without a credential (none so far).
        access: Who may call it (see ``Access``); ``read`` for a method that does not mutate, else ``manage``.
        replayable: ``False`` when the output holds a one-time secret: an idempotent retry is then told the call
            succeeded before (``CONFLICT``, with the resource's ``id``) instead of getting the secret again, which is
            never stored.
        admit: For a request-as-resource ``create``, the spec's admission sequence (DESIGN §5): after the tenant
            pre-check the dispatcher calls ``admit(call, input)`` (transaction 1: the idempotency key, the draft and
            its projection row; ``call.admission`` holds the key and the request's fingerprint), decides the IAM
            action on the ``Drafted.resource`` it returns, and only then runs the plugins and the handler
            (transaction 2, which writes the audit row with the decision's id: ``call.audited_by_store``). A refusal
            or a failure before that commit calls ``Drafted.undo``; a ``Drafted.replay`` is answered at once.

    Declare methods with ``@method`` on the handler rather than with this class directly.

    Raises:
        InvalidConfigError: at declaration, for a type the codec cannot handle or a malformed action.
    """

    def __init__(
        self,
        *,
        input: type[In],
        output: type[Out],
        handler: Handler[In, Out],
        mutates: bool,
        action: str | None = None,
        resource: Callable[[In], ResourceRef] | None = None,
        summary: str = "",
        authenticated: bool = True,
        access: Access | None = None,
        replayable: bool = True,
        admit: Callable[[CallContext, In], Awaitable[Drafted]] | None = None,
    ) -> None:
        check_supported(input, "the input type")
        check_supported(output, "the output type")
        if action is not None and not _ACTION.match(action):
            raise InvalidConfigError(
                f"action {action!r} must look like 'compute:group:method'", details={"problems": [action]}
            )
        self.input = input
        self.output = output
        self.handler = handler
        self.mutates = mutates
        self._action = action
        self._resource = resource
        self.summary = summary or _first_paragraph(handler.__doc__ or "")
        self.authenticated = authenticated
        chosen = access if access is not None else ("manage" if mutates else "read")
        if chosen not in ACCESS_LEVELS or (mutates and chosen in ("open", "read")):
            raise InvalidConfigError(
                f"access {chosen!r} does not fit a method that {'mutates' if mutates else 'only reads'}",
                details={"problems": [handler.__qualname__]},
            )
        self.access: Access = chosen
        self.replayable = replayable
        self.admit = admit
        if admit is not None and not mutates:
            raise InvalidConfigError(
                "an admitting method creates something: declare it mutates=True",
                details={"problems": [handler.__qualname__]},
            )
        self.attr = ""
        self.name = ""
        self.group = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        name = attr.replace("_", "-")
        if not _NAME.match(name):
            raise InvalidConfigError(f"method name {attr!r} must be lower_snake_case", details={"problems": [attr]})
        self.attr = attr
        self.name = name

    def _bind_group(self, group: str, action_prefix: str) -> None:
        if self.group and self.group != group:
            raise InvalidConfigError(
                f"method {self.name!r} is declared in two groups", details={"problems": [group, self.group]}
            )
        self.group = group
        if self._action is None:
            self._action = f"{action_prefix}:{group}:{self.name}"
        if self._resource is None:
            self._resource = _no_resource(group)

    @property
    def action(self) -> str:
        """The IAM action checked before the handler runs."""
        assert self._action is not None, "a method is used before its group was declared"
        return self._action

    def resource(self, input: In) -> ResourceRef:
        """The resource the action is checked on, for this input."""
        assert self._resource is not None, "a method is used before its group was declared"
        return self._resource(input)

    @property
    def path(self) -> str:
        """The path below the endpoint: ``/{group}/{method}``."""
        return f"/{self.group}/{self.name}"

    @overload
    def __get__(self, instance: None, owner: Any) -> MethodDef[In, Out]: ...
    @overload
    def __get__(self, instance: GroupSpec[ApiBinding], owner: Any) -> ApiCall[In, Out]: ...
    @overload
    def __get__(self, instance: GroupSpec[AsyncClientBinding], owner: Any) -> AsyncClientCall[In, Out]: ...
    @overload
    def __get__(self, instance: GroupSpec[ClientBinding], owner: Any) -> ClientCall[In, Out]: ...
    def __get__(self, instance: GroupSpec[Any] | None, owner: Any) -> Any:
        if instance is None:
            return self
        return instance._call_type(instance._binder, self)

    def __repr__(self) -> str:
        return f"<method {self.group}.{self.name}>"


def _first_paragraph(doc: str) -> str:
    """A docstring's first paragraph on one line (a first line alone may stop mid-sentence)."""
    paragraph = doc.strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in paragraph.splitlines() if line.strip())


class _Declare(Protocol):
    def __call__(self, handler: Handler[In, Out], /) -> MethodDef[In, Out]: ...


def method(
    *,
    mutates: bool,
    access: Access | None = None,
    resource: Callable[[Any], ResourceRef] | None = None,
    action: str | None = None,
    summary: str = "",
    replayable: bool = True,
    admit: Callable[[CallContext, Any], Awaitable[Drafted]] | None = None,
) -> _Declare:
    """Declare a handler ``async (call: CallContext, input: In) -> Out`` as a method; list it in a ``GroupSpec``.

    The input and output types are the handler's annotations. See ``MethodDef`` for the arguments.

    Raises:
        InvalidConfigError: the handler does not take ``(call, input)`` or its annotations are not attrs classes.
    """

    def declare(handler: Handler[In, Out], /) -> MethodDef[In, Out]:
        input, output = _annotated_types(handler)
        return MethodDef(
            input=input,
            output=output,
            handler=handler,
            mutates=mutates,
            access=access,
            resource=resource,
            action=action,
            summary=summary,
            replayable=replayable,
            admit=admit,
        )

    return declare


def _annotated_types(handler: Callable[..., Any]) -> tuple[type[Any], type[Any]]:
    """The input and output classes a handler is annotated with."""
    where = getattr(handler, "__qualname__", repr(handler))
    parameters = list(inspect.signature(handler).parameters.values())
    try:
        hints = typing.get_type_hints(handler)
    except Exception as exc:  # a name the annotations use that is imported only for type checkers
        raise InvalidConfigError(
            f"{where}: its annotations cannot be resolved at run time", details={"problems": [where]}
        ) from exc
    if len(parameters) != 2 or parameters[1].name not in hints or "return" not in hints:
        raise InvalidConfigError(
            f"{where}: a method's handler takes (call, input) and annotates the input and the return type",
            details={"problems": [where]},
        )
    input, output = hints[parameters[1].name], hints["return"]
    if not (isinstance(input, type) and isinstance(output, type)):
        raise InvalidConfigError(f"{where}: input and output must be classes", details={"problems": [where]})
    return input, output


class GroupSpec(Generic[B]):
    """A group of methods. Subclass it with a ``name`` and ``MethodDef`` attributes.

    ``action_prefix`` is ``compute`` for Better Compute's groups (actions ``compute:<group>:<method>``); IAM's
    groups use ``iam``.
    """

    name: ClassVar[str]
    action_prefix: ClassVar[str] = "compute"
    description: ClassVar[str] = ""
    methods: ClassVar[Mapping[str, MethodDef[Any, Any]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidConfigError(
                f"group {cls.__name__} needs a name like 'join-tokens'", details={"problems": [cls.__name__]}
            )
        methods: dict[str, MethodDef[Any, Any]] = {}
        for value in cls.__dict__.values():
            if isinstance(value, MethodDef):
                value._bind_group(name, cls.action_prefix)
                methods[value.name] = value
        cls.methods = methods
        if not cls.description:
            cls.description = (cls.__doc__ or "").strip().split("\n")[0]

    @classmethod
    def attr(cls) -> str:
        """The Python attribute the group is reached by (``join_tokens`` for ``join-tokens``)."""
        return cls.name.replace("-", "_")

    def __init__(self, binder: Any, call_type: type[Any]) -> None:
        self._binder = binder
        self._call_type = call_type


B_co = TypeVar("B_co", covariant=True)


class Binds(Protocol[B_co]):
    """Something groups can be bound to: the in-process ``api`` or an HTTP client."""

    def binding(self) -> type[B_co]:
        """The binding marker (``ApiBinding``, ``AsyncClientBinding``, ``ClientBinding``)."""
        ...

    def binder(self) -> tuple[Any, type[Any]]:
        """The object that makes the calls, and the call class (``ApiCall``, ...)."""
        ...


class GroupSet(Generic[B]):
    """Typed access to several groups at once: subclass it with one annotation per group, then bind it.

    ::

        class IamGroups(GroupSet[B]):
            tenants: TenantsGroup[B]

        await IamGroups(compute.api).tenants.create(credential, CreateTenantInput(name="acme"))
        await IamGroups(client).tenants.create(CreateTenantInput(name="acme"))

    ``compute.api`` and the clients are group sets of the built-in groups themselves. A group that is not
    registered on the control plane answers its calls with ``NOT_FOUND``, as an unknown path does over HTTP.
    """

    def __init__(self, target: Binds[B]) -> None:
        binder, call_type = target.binder()
        for attr, spec in type(self).group_specs().items():
            setattr(self, attr, spec(binder, call_type))

    @classmethod
    def group_specs(cls) -> dict[str, type[GroupSpec[Any]]]:
        """The annotated groups, by attribute name."""
        specs: dict[str, type[GroupSpec[Any]]] = {}
        for klass in reversed(cls.__mro__):
            if not (isinstance(klass, type) and issubclass(klass, GroupSet)):
                continue
            for attr, hint in typing.get_type_hints(klass).items():
                origin = typing.get_origin(hint) or hint
                if isinstance(origin, type) and issubclass(origin, GroupSpec):
                    specs[attr] = origin
        return specs


@attrs.frozen(kw_only=True)
class _Entry:
    spec: type[GroupSpec[Any]]
    owner: str


class Registry:
    """Every group and method of one control plane. Registration refuses duplicates."""

    def __init__(self) -> None:
        self._groups: dict[str, _Entry] = {}
        self._by_attr: dict[str, str] = {}

    def add(self, spec: type[GroupSpec[Any]], *, owner: str) -> list[str]:
        """Register a group for ``owner`` (a module's name); returns problems instead of raising, to collect them.

        A list method (named ``list``, or with paging fields) that breaks the paging convention of
        ``bettercompute.paging`` is refused.
        """
        if spec.name in self._groups:
            first = self._groups[spec.name].owner
            return [f"group {spec.name!r} of {owner!r} is already registered by {first!r}"]
        # Every list pages the same way, so the client, the CLI and the tests can follow any of them.
        problems = [
            problem
            for method in spec.methods.values()
            for problem in convention_problems(
                f"{spec.name}.{method.name} of {owner!r}",
                name=method.name,
                input=method.input,
                output=method.output,
                mutates=method.mutates,
            )
        ]
        # An action names what IAM decides; two methods sharing one must be the same kind of call, or one's
        # declaration would open (or audit) the other.
        known = {m.action: m for m in self.methods()}
        for method in spec.methods.values():
            other = known.get(method.action)
            if other is not None and (other.access, other.mutates) != (method.access, method.mutates):
                problems.append(
                    f"{spec.name}.{method.name} of {owner!r} shares the action {method.action!r} with"
                    f" {other.group}.{other.name} but is declared with another access or mutation"
                )
        if problems:
            return problems
        self._groups[spec.name] = _Entry(spec=spec, owner=owner)
        self._by_attr[spec.attr()] = spec.name
        return []

    def group(self, name: str) -> type[GroupSpec[Any]] | None:
        """The group with this wire name, or ``None``."""
        entry = self._groups.get(name)
        return entry.spec if entry else None

    def group_by_attr(self, attr: str) -> type[GroupSpec[Any]] | None:
        """The group reached by this Python attribute name, or ``None``."""
        name = self._by_attr.get(attr)
        return self.group(name) if name else None

    def method(self, group: str, name: str) -> MethodDef[Any, Any] | None:
        """The method at ``/{group}/{name}``, or ``None``."""
        spec = self.group(group)
        return spec.methods.get(name) if spec else None

    def groups(self) -> list[type[GroupSpec[Any]]]:
        """The groups, sorted by name."""
        return [self._groups[name].spec for name in sorted(self._groups)]

    def owner(self, group: str) -> str:
        """The module that registered a group."""
        return self._groups[group].owner

    def methods(self) -> Iterator[MethodDef[Any, Any]]:
        """Every method, sorted by group then name."""
        for spec in self.groups():
            for name in sorted(spec.methods):
                yield spec.methods[name]

    def actions(self, *, access: Collection[str] | None = None) -> set[str]:
        """The actions the registered methods check (only those of methods of the given ``access`` levels)."""
        return {m.action for m in self.methods() if access is None or m.access in access}
