"""Better Compute: a control plane for GPU fleets, as a library.

Build one with ``better_compute(Options(store=..., iam=...))``; see ``BetterCompute`` for its members.
"""

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
from bettercompute._version import __version__ as __version__
from bettercompute.modules.nodes import JoinSettings as JoinSettings
from bettercompute.modules.nodes import TunnelCheck as TunnelCheck
from bettercompute.modules.nodes import TunnelGrant as TunnelGrant
from bettercompute.modules.nodes import TunnelRecord as TunnelRecord
from bettercompute.modules.nodes import TunnelTicket as TunnelTicket
from bettercompute.modules.nodes import open_tunnel_in as open_tunnel_in

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
