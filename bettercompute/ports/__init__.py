"""The ports: everything the core needs from the outside, as structural protocols.

Sibling packages satisfy these without importing anything but the core. Each protocol's docstring is its contract;
``bettercompute.testing`` holds the conformance suites that check an implementation against it.

Errors: an implementation raises only ``bettercompute.errors`` classes. A lost connection or an unreachable server is
``UnavailableError``; anything else unexpected is ``InternalError``, raised ``from`` the driver's exception so that
the cause stays in the traceback but never in the message.
"""

from __future__ import annotations

from bettercompute.ports._txscope import in_transaction as in_transaction
from bettercompute.ports._txscope import transaction_scope as transaction_scope
from bettercompute.ports.audit import AuditRecord as AuditRecord
from bettercompute.ports.clock import Clock as Clock
from bettercompute.ports.iam import Decision as Decision
from bettercompute.ports.iam import FreshIam as FreshIam
from bettercompute.ports.iam import Iam as Iam
from bettercompute.ports.iam import Identity as Identity
from bettercompute.ports.iam import ResourceRef as ResourceRef
from bettercompute.ports.idempotency import IdempotencyKeys as IdempotencyKeys
from bettercompute.ports.idempotency import IdempotencyOutcome as IdempotencyOutcome
from bettercompute.ports.kms import Kms as Kms
from bettercompute.ports.kms import Sealed as Sealed
from bettercompute.ports.kms import SealedBlob as SealedBlob
from bettercompute.ports.leases import Lease as Lease
from bettercompute.ports.leases import Leases as Leases
from bettercompute.ports.membership import Member as Member
from bettercompute.ports.membership import Membership as Membership
from bettercompute.ports.migrations import Migration as Migration
from bettercompute.ports.notifier import SINKS_POKE as SINKS_POKE
from bettercompute.ports.notifier import WORK_CHANNEL as WORK_CHANNEL
from bettercompute.ports.notifier import Notifier as Notifier
from bettercompute.ports.outbox import Outbox as Outbox
from bettercompute.ports.outbox import OutboxEvent as OutboxEvent
from bettercompute.ports.outbox import StoredEvent as StoredEvent
from bettercompute.ports.queue import Claim as Claim
from bettercompute.ports.queue import WorkItem as WorkItem
from bettercompute.ports.queue import WorkQueue as WorkQueue
from bettercompute.ports.replay import ReplayGuard as ReplayGuard
from bettercompute.ports.repository import Repository as Repository
from bettercompute.ports.store import Store as Store
from bettercompute.ports.transaction import Transaction as Transaction
from bettercompute.ports.workflows import WORKFLOWS as WORKFLOWS
from bettercompute.ports.workflows import WorkflowLogEntry as WorkflowLogEntry
from bettercompute.ports.workflows import WorkflowRecord as WorkflowRecord
from bettercompute.ports.workflows import WorkflowStore as WorkflowStore

__all__ = [
    "SINKS_POKE",
    "WORKFLOWS",
    "WORK_CHANNEL",
    "AuditRecord",
    "Claim",
    "Clock",
    "Decision",
    "FreshIam",
    "Iam",
    "IdempotencyKeys",
    "IdempotencyOutcome",
    "Identity",
    "Kms",
    "Lease",
    "Leases",
    "Member",
    "Membership",
    "Migration",
    "Notifier",
    "Outbox",
    "OutboxEvent",
    "ReplayGuard",
    "Repository",
    "ResourceRef",
    "Sealed",
    "SealedBlob",
    "Store",
    "StoredEvent",
    "Transaction",
    "WorkItem",
    "WorkQueue",
    "WorkflowLogEntry",
    "WorkflowRecord",
    "WorkflowStore",
    "in_transaction",
    "transaction_scope",
]
