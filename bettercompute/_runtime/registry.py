"""Methods declared once, and the registry that holds them.

A group is a class; each method is a ``MethodDef`` attribute of it::

    class SystemGroup(GroupSpec[B]):
        name = "system"
        version = MethodDef(input=VersionInput, output=VersionOutput, handler=_service.version, mutates=False)

The same class gives typed access everywhere: ``compute.api.system.version`` is an ``ApiCall[VersionInput,
VersionOutput]`` and ``client.system.version`` an ``AsyncClientCall`` of the same types, because ``MethodDef`` is a
descriptor whose result depends on what the group instance is bound to.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, overload

import attrs

from bettercompute._runtime.codec import check_supported
from bettercompute.errors import InvalidConfigError
from bettercompute.paging import convention_problems
from bettercompute.ports import AuditRecord, Decision, Identity, ResourceRef

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = [
    "ApiBinding",
    "ApiCall",
    "AsyncClientBinding",
    "AsyncClientCall",
    "CallContext",
    "ClientBinding",
    "ClientCall",
    "GroupSpec",
    "MethodDef",
    "Registry",
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
    def input(self) -> type[Any]: ...
    @property
    def output(self) -> type[Any]: ...
    @property
    def handler(self) -> Callable[[CallContext, Any], Awaitable[Any]]: ...


@attrs.frozen(kw_only=True)
class CallContext:
    """What a handler gets besides its input: who called, the decision that allowed it, and the module context."""

    method: MethodInfo
    identity: Identity | None
    decision: Decision | None
    context: ModuleContext
    request_id: str

    def audit_record(
        self,
        *,
        resource_type: str,
        resource_id: str | None,
        tenant: str | None,
        details: Mapping[str, Any] | None = None,
        outcome: str = "ok",
    ) -> AuditRecord:
        """The audit row of this call's mutation, carrying the id of the one decision that allowed it.

        Write it with ``Transaction.audit`` in the transaction that makes the change.
        """
        return AuditRecord(
            action=self.method.action,
            actor=self.identity.principal_id if self.identity else "anonymous",
            tenant=tenant,
            resource_type=resource_type,
            resource_id=resource_id,
            decision_id=self.decision.id if self.decision else None,
            outcome=outcome,
            details=dict(details or {}),
        )


Handler = Callable[[CallContext, In], Awaitable[Out]]


class ApiBinding:
    """Marker: a group bound to the in-process ``api`` (calls take a credential and an input)."""


class AsyncClientBinding:
    """Marker: a group bound to the async HTTP client (calls take an input)."""


class ClientBinding:
    """Marker: a group bound to the blocking HTTP client (calls take an input)."""


class _ApiBinder(Protocol):
    async def call(self, method: MethodDef[Any, Any], credential: str | None, input: Any) -> Any: ...


class _AsyncClientBinder(Protocol):
    async def call(self, method: MethodDef[Any, Any], input: Any) -> Any: ...


class _ClientBinder(Protocol):
    def call(self, method: MethodDef[Any, Any], input: Any) -> Any: ...


class ApiCall(Generic[In, Out]):
    """A method of the in-process ``api``: ``await call(credential, input)``."""

    __slots__ = ("_binder", "method")

    def __init__(self, binder: _ApiBinder, method: MethodDef[In, Out]) -> None:
        self._binder = binder
        self.method = method

    async def __call__(self, credential: str | None, input: In) -> Out:
        result: Out = await self._binder.call(self.method, credential, input)
        return result


class AsyncClientCall(Generic[In, Out]):
    """A method of ``AsyncClient``: ``await call(input)``; the input may be left out when it has no required field."""

    __slots__ = ("_binder", "method")

    def __init__(self, binder: _AsyncClientBinder, method: MethodDef[In, Out]) -> None:
        self._binder = binder
        self.method = method

    async def __call__(self, input: In | None = None) -> Out:
        result: Out = await self._binder.call(self.method, input)
        return result


class ClientCall(Generic[In, Out]):
    """A method of the blocking ``Client``: ``call(input)``."""

    __slots__ = ("_binder", "method")

    def __init__(self, binder: _ClientBinder, method: MethodDef[In, Out]) -> None:
        self._binder = binder
        self.method = method

    def __call__(self, input: In | None = None) -> Out:
        result: Out = self._binder.call(self.method, input)
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
        authenticated: ``False`` only for methods anyone may call (none so far).

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
        self.summary = summary or (handler.__doc__ or "").strip().split("\n")[0]
        self.authenticated = authenticated
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


_DECLARED: dict[str, type[GroupSpec[Any]]] = {}


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
        _DECLARED[cls.attr()] = cls

    @classmethod
    def attr(cls) -> str:
        """The Python attribute the group is reached by (``join_tokens`` for ``join-tokens``)."""
        return cls.name.replace("-", "_")

    def __init__(self, binder: Any, call_type: type[Any]) -> None:
        self._binder = binder
        self._call_type = call_type


def declared_group(attr: str) -> type[GroupSpec[Any]] | None:
    """A group class declared anywhere in this process, by attribute name (used by the HTTP clients)."""
    return _DECLARED.get(attr)


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

    def actions(self) -> set[str]:
        """The actions the registered methods check."""
        return {m.action for m in self.methods()}
