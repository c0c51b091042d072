"""Better Compute: a control plane for GPU fleets, as a library.

Build one with ``better_compute(Options(store=..., iam=...))``; see ``BetterCompute`` for its members.
"""

from ._core import Api as Api
from ._core import BetterCompute as BetterCompute
from ._core import Caches as Caches
from ._core import DatabaseClock as DatabaseClock
from ._core import ModuleContext as ModuleContext
from ._core import better_compute as better_compute
from ._http import Request as Request
from ._http import Response as Response
from ._jobs import Events as Events
from ._jobs import Job as Job
from ._kms import LocalKeyKms as LocalKeyKms
from ._options import Module as Module
from ._options import Options as Options
from ._options import Plugin as Plugin
from ._reconcile import Outcome as Outcome
from ._reconcile import ReconcileContext as ReconcileContext
from ._reconcile import Reconciler as Reconciler
from ._reconcile import RetryPolicy as RetryPolicy
from ._registry import ApiBinding as ApiBinding
from ._registry import ApiCall as ApiCall
from ._registry import AsyncClientBinding as AsyncClientBinding
from ._registry import AsyncClientCall as AsyncClientCall
from ._registry import CallContext as CallContext
from ._registry import ClientBinding as ClientBinding
from ._registry import ClientCall as ClientCall
from ._registry import GroupSpec as GroupSpec
from ._registry import MethodDef as MethodDef
from ._registry import Registry as Registry
from ._shards import shard_of as shard_of
from ._version import __version__ as __version__
from ._workflows import Step as Step
from ._workflows import StepContext as StepContext
from ._workflows import StepOutcome as StepOutcome
from ._workflows import Workflow as Workflow
from ._workflows import Workflows as Workflows
from .joins import JoinSettings as JoinSettings

__all__ = [
    "Api",
    "ApiBinding",
    "ApiCall",
    "AsyncClientBinding",
    "AsyncClientCall",
    "BetterCompute",
    "Caches",
    "CallContext",
    "ClientBinding",
    "ClientCall",
    "DatabaseClock",
    "Events",
    "GroupSpec",
    "Job",
    "JoinSettings",
    "LocalKeyKms",
    "MethodDef",
    "Module",
    "ModuleContext",
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
    "Workflow",
    "Workflows",
    "__version__",
    "better_compute",
    "shard_of",
]
