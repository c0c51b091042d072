"""Better Compute: a control plane for GPU fleets, as a library.

Build one with ``better_compute(Options(store=..., iam=...))``; see ``BetterCompute`` for its members.

The names load on first use (PEP 562), so importing a light part of the package, such as the typed client or
the shedding rule the command-line client shares, does not load the whole core.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from bettercompute._version import __version__ as __version__

if _typing.TYPE_CHECKING:
    from bettercompute._core import Api as Api
    from bettercompute._core import BetterCompute as BetterCompute
    from bettercompute._core import better_compute as better_compute
    from bettercompute._options import Options as Options
    from bettercompute._runtime.access import Access as Access
    from bettercompute._runtime.context import Caches as Caches
    from bettercompute._runtime.context import DatabaseClock as DatabaseClock
    from bettercompute._runtime.context import ModuleContext as ModuleContext
    from bettercompute._runtime.declarations import Intercepted as Intercepted
    from bettercompute._runtime.declarations import Module as Module
    from bettercompute._runtime.declarations import Next as Next
    from bettercompute._runtime.declarations import Plugin as Plugin
    from bettercompute._runtime.events import Events as Events
    from bettercompute._runtime.gateway_methods import CertificateIssuer as CertificateIssuer
    from bettercompute._runtime.gateway_methods import GatewayCall as GatewayCall
    from bettercompute._runtime.gateway_methods import GatewayCaller as GatewayCaller
    from bettercompute._runtime.gateway_methods import GatewayMethod as GatewayMethod
    from bettercompute._runtime.http import Request as Request
    from bettercompute._runtime.http import Response as Response
    from bettercompute._runtime.jobs import Job as Job
    from bettercompute._runtime.kms import KmsRing as KmsRing
    from bettercompute._runtime.kms import LocalKeyKms as LocalKeyKms
    from bettercompute._runtime.metrics import Metrics as Metrics
    from bettercompute._runtime.reconcile import Outcome as Outcome
    from bettercompute._runtime.reconcile import ReconcileContext as ReconcileContext
    from bettercompute._runtime.reconcile import Reconciler as Reconciler
    from bettercompute._runtime.reconcile import RetryPolicy as RetryPolicy
    from bettercompute._runtime.registry import ApiBinding as ApiBinding
    from bettercompute._runtime.registry import ApiCall as ApiCall
    from bettercompute._runtime.registry import AsyncClientBinding as AsyncClientBinding
    from bettercompute._runtime.registry import AsyncClientCall as AsyncClientCall
    from bettercompute._runtime.registry import CallContext as CallContext
    from bettercompute._runtime.registry import ClientBinding as ClientBinding
    from bettercompute._runtime.registry import ClientCall as ClientCall
    from bettercompute._runtime.registry import GroupSet as GroupSet
    from bettercompute._runtime.registry import GroupSpec as GroupSpec
    from bettercompute._runtime.registry import MethodDef as MethodDef
    from bettercompute._runtime.registry import Registry as Registry
    from bettercompute._runtime.registry import method as method
    from bettercompute._runtime.shards import shard_of as shard_of
    from bettercompute._runtime.workflows import Step as Step
    from bettercompute._runtime.workflows import StepContext as StepContext
    from bettercompute._runtime.workflows import StepOutcome as StepOutcome
    from bettercompute._runtime.workflows import Workflow as Workflow
    from bettercompute._runtime.workflows import Workflows as Workflows
    from bettercompute._runtime.workflows import signal_in as signal_workflow_in
    from bettercompute._runtime.workflows import start_in as start_workflow_in
    from bettercompute.modules.nodes import JoinSettings as JoinSettings
    from bettercompute.modules.nodes import TunnelCheck as TunnelCheck
    from bettercompute.modules.nodes import TunnelGrant as TunnelGrant
    from bettercompute.modules.nodes import TunnelRecord as TunnelRecord
    from bettercompute.modules.nodes import TunnelTicket as TunnelTicket
    from bettercompute.modules.nodes import open_tunnel_in as open_tunnel_in

# Where each public name lives: (module, name there).
_HOMES: dict[str, tuple[str, str]] = {
    "Api": ("bettercompute._core", "Api"),
    "BetterCompute": ("bettercompute._core", "BetterCompute"),
    "better_compute": ("bettercompute._core", "better_compute"),
    "Options": ("bettercompute._options", "Options"),
    "Access": ("bettercompute._runtime.access", "Access"),
    "Caches": ("bettercompute._runtime.context", "Caches"),
    "DatabaseClock": ("bettercompute._runtime.context", "DatabaseClock"),
    "ModuleContext": ("bettercompute._runtime.context", "ModuleContext"),
    "Intercepted": ("bettercompute._runtime.declarations", "Intercepted"),
    "Module": ("bettercompute._runtime.declarations", "Module"),
    "Next": ("bettercompute._runtime.declarations", "Next"),
    "Plugin": ("bettercompute._runtime.declarations", "Plugin"),
    "Events": ("bettercompute._runtime.events", "Events"),
    "CertificateIssuer": ("bettercompute._runtime.gateway_methods", "CertificateIssuer"),
    "GatewayCall": ("bettercompute._runtime.gateway_methods", "GatewayCall"),
    "GatewayCaller": ("bettercompute._runtime.gateway_methods", "GatewayCaller"),
    "GatewayMethod": ("bettercompute._runtime.gateway_methods", "GatewayMethod"),
    "Request": ("bettercompute._runtime.http", "Request"),
    "Response": ("bettercompute._runtime.http", "Response"),
    "Job": ("bettercompute._runtime.jobs", "Job"),
    "KmsRing": ("bettercompute._runtime.kms", "KmsRing"),
    "LocalKeyKms": ("bettercompute._runtime.kms", "LocalKeyKms"),
    "Metrics": ("bettercompute._runtime.metrics", "Metrics"),
    "Outcome": ("bettercompute._runtime.reconcile", "Outcome"),
    "ReconcileContext": ("bettercompute._runtime.reconcile", "ReconcileContext"),
    "Reconciler": ("bettercompute._runtime.reconcile", "Reconciler"),
    "RetryPolicy": ("bettercompute._runtime.reconcile", "RetryPolicy"),
    "ApiBinding": ("bettercompute._runtime.registry", "ApiBinding"),
    "ApiCall": ("bettercompute._runtime.registry", "ApiCall"),
    "AsyncClientBinding": ("bettercompute._runtime.registry", "AsyncClientBinding"),
    "AsyncClientCall": ("bettercompute._runtime.registry", "AsyncClientCall"),
    "CallContext": ("bettercompute._runtime.registry", "CallContext"),
    "ClientBinding": ("bettercompute._runtime.registry", "ClientBinding"),
    "ClientCall": ("bettercompute._runtime.registry", "ClientCall"),
    "GroupSet": ("bettercompute._runtime.registry", "GroupSet"),
    "GroupSpec": ("bettercompute._runtime.registry", "GroupSpec"),
    "MethodDef": ("bettercompute._runtime.registry", "MethodDef"),
    "Registry": ("bettercompute._runtime.registry", "Registry"),
    "method": ("bettercompute._runtime.registry", "method"),
    "shard_of": ("bettercompute._runtime.shards", "shard_of"),
    "Step": ("bettercompute._runtime.workflows", "Step"),
    "StepContext": ("bettercompute._runtime.workflows", "StepContext"),
    "StepOutcome": ("bettercompute._runtime.workflows", "StepOutcome"),
    "Workflow": ("bettercompute._runtime.workflows", "Workflow"),
    "Workflows": ("bettercompute._runtime.workflows", "Workflows"),
    "signal_workflow_in": ("bettercompute._runtime.workflows", "signal_in"),
    "start_workflow_in": ("bettercompute._runtime.workflows", "start_in"),
    "JoinSettings": ("bettercompute.modules.nodes", "JoinSettings"),
    "TunnelCheck": ("bettercompute.modules.nodes", "TunnelCheck"),
    "TunnelGrant": ("bettercompute.modules.nodes", "TunnelGrant"),
    "TunnelRecord": ("bettercompute.modules.nodes", "TunnelRecord"),
    "TunnelTicket": ("bettercompute.modules.nodes", "TunnelTicket"),
    "open_tunnel_in": ("bettercompute.modules.nodes", "open_tunnel_in"),
}


if not _typing.TYPE_CHECKING:  # hidden from mypy, which would otherwise take any misspelt name as Any

    def __getattr__(name: str) -> _typing.Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(_importlib.import_module(home[0]), home[1])
        globals()[name] = value  # once loaded, a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_HOMES})


__all__ = [
    "Access",
    "Api",
    "ApiBinding",
    "ApiCall",
    "AsyncClientBinding",
    "AsyncClientCall",
    "BetterCompute",
    "Caches",
    "CallContext",
    "CertificateIssuer",
    "ClientBinding",
    "ClientCall",
    "DatabaseClock",
    "Events",
    "GatewayCall",
    "GatewayCaller",
    "GatewayMethod",
    "GroupSet",
    "GroupSpec",
    "Intercepted",
    "Job",
    "JoinSettings",
    "KmsRing",
    "LocalKeyKms",
    "MethodDef",
    "Metrics",
    "Module",
    "ModuleContext",
    "Next",
    "Options",
    "Outcome",
    "Plugin",
    "ReconcileContext",
    "Reconciler",
    "Registry",
    "Request",
    "Response",
    "RetryPolicy",
    "Step",
    "StepContext",
    "StepOutcome",
    "TunnelCheck",
    "TunnelGrant",
    "TunnelRecord",
    "TunnelTicket",
    "Workflow",
    "Workflows",
    "__version__",
    "better_compute",
    "method",
    "open_tunnel_in",
    "shard_of",
    "signal_workflow_in",
    "start_workflow_in",
]
