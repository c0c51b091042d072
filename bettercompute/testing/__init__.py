"""Test kits: doubles of the ports and conformance suites that implementations run against themselves."""

from bettercompute.testing._clock import ManualClock as ManualClock
from bettercompute.testing._guards import GuardedKms as GuardedKms
from bettercompute.testing._guards import OutsideCallInTransaction as OutsideCallInTransaction
from bettercompute.testing._guards import OutsideCallProbe as OutsideCallProbe
from bettercompute.testing._iam_double import StaticIamDouble as StaticIamDouble
from bettercompute.testing._iam_double import identity as identity
from bettercompute.testing._iam_suite import IamCase as IamCase
from bettercompute.testing._iam_suite import IamConformance as IamConformance
from bettercompute.testing._replay import InMemoryReplayGuard as InMemoryReplayGuard
from bettercompute.testing._store_suite import StoreConformance as StoreConformance
from bettercompute.testing._workflow_suite import WorkflowStoreConformance as WorkflowStoreConformance

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
