"""Test kits: doubles of the ports and conformance suites that implementations run against themselves."""

from ._clock import ManualClock as ManualClock
from ._guards import GuardedKms as GuardedKms
from ._guards import OutsideCallInTransaction as OutsideCallInTransaction
from ._guards import OutsideCallProbe as OutsideCallProbe
from ._iam_double import StaticIamDouble as StaticIamDouble
from ._iam_double import identity as identity
from ._iam_suite import IamCase as IamCase
from ._iam_suite import IamConformance as IamConformance
from ._replay import InMemoryReplayGuard as InMemoryReplayGuard
from ._store_suite import StoreConformance as StoreConformance
from ._workflow_suite import WorkflowStoreConformance as WorkflowStoreConformance

__all__ = [
    "GuardedKms",
    "IamCase",
    "IamConformance",
    "InMemoryReplayGuard",
    "ManualClock",
    "OutsideCallInTransaction",
    "OutsideCallProbe",
    "StaticIamDouble",
    "StoreConformance",
    "WorkflowStoreConformance",
    "identity",
]
