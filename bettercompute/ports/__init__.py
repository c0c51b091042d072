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
from bettercompute.ports.certificates import CaKey as CaKey
from bettercompute.ports.certificates import Certificates as Certificates
from bettercompute.ports.certificates import IssuedCertificate as IssuedCertificate
from bettercompute.ports.certificates import Revocation as Revocation
from bettercompute.ports.clock import Clock as Clock
from bettercompute.ports.commands import CommandRecord as CommandRecord
from bettercompute.ports.commands import Commands as Commands
from bettercompute.ports.commands import SessionRecord as SessionRecord
from bettercompute.ports.commands import Sessions as Sessions
from bettercompute.ports.iam import Decision as Decision
from bettercompute.ports.iam import Iam as Iam
from bettercompute.ports.iam import Identity as Identity
from bettercompute.ports.iam import ResourceRef as ResourceRef
from bettercompute.ports.idempotency import IdempotencyKeys as IdempotencyKeys
from bettercompute.ports.idempotency import IdempotencyOutcome as IdempotencyOutcome
from bettercompute.ports.kms import Kms as Kms
from bettercompute.ports.leases import Lease as Lease
from bettercompute.ports.leases import Leases as Leases
from bettercompute.ports.membership import Member as Member
from bettercompute.ports.membership import Membership as Membership
from bettercompute.ports.migrations import Migration as Migration
from bettercompute.ports.nodes import Enrollment as Enrollment
from bettercompute.ports.nodes import JoinKeyRecord as JoinKeyRecord
from bettercompute.ports.nodes import JoinKeys as JoinKeys
from bettercompute.ports.nodes import NodeRecord as NodeRecord
from bettercompute.ports.nodes import Nodes as Nodes
from bettercompute.ports.notifier import Notifier as Notifier
from bettercompute.ports.outbox import Outbox as Outbox
from bettercompute.ports.outbox import OutboxEvent as OutboxEvent
from bettercompute.ports.outbox import StoredEvent as StoredEvent
from bettercompute.ports.pools import JoinTokenRecord as JoinTokenRecord
from bettercompute.ports.pools import JoinTokens as JoinTokens
from bettercompute.ports.pools import PoolRecord as PoolRecord
from bettercompute.ports.pools import Pools as Pools
from bettercompute.ports.pools import TokenConsumption as TokenConsumption
from bettercompute.ports.queue import Claim as Claim
from bettercompute.ports.queue import WorkItem as WorkItem
from bettercompute.ports.queue import WorkQueue as WorkQueue
from bettercompute.ports.replay import ReplayGuard as ReplayGuard
from bettercompute.ports.secrets import SecretRecord as SecretRecord
from bettercompute.ports.secrets import SecretStore as SecretStore
from bettercompute.ports.store import Store as Store
from bettercompute.ports.transaction import Transaction as Transaction
from bettercompute.ports.usage import Booking as Booking
from bettercompute.ports.usage import Bookings as Bookings
from bettercompute.ports.usage import Usage as Usage
from bettercompute.ports.usage import UsageRecord as UsageRecord
from bettercompute.ports.webhooks import DeliveryOutcome as DeliveryOutcome
from bettercompute.ports.webhooks import DueDelivery as DueDelivery
from bettercompute.ports.webhooks import WebhookDelivery as WebhookDelivery
from bettercompute.ports.webhooks import Webhooks as Webhooks
from bettercompute.ports.webhooks import WebhookSubscription as WebhookSubscription
from bettercompute.ports.workflows import WorkflowLogEntry as WorkflowLogEntry
from bettercompute.ports.workflows import WorkflowRecord as WorkflowRecord
from bettercompute.ports.workflows import WorkflowStore as WorkflowStore

__all__ = [
    "AuditRecord",
    "Booking",
    "Bookings",
    "CaKey",
    "Certificates",
    "Claim",
    "Clock",
    "CommandRecord",
    "Commands",
    "Decision",
    "DeliveryOutcome",
    "DueDelivery",
    "Enrollment",
    "Iam",
    "IdempotencyKeys",
    "IdempotencyOutcome",
    "Identity",
    "IssuedCertificate",
    "JoinKeyRecord",
    "JoinKeys",
    "JoinTokenRecord",
    "JoinTokens",
    "Kms",
    "Lease",
    "Leases",
    "Member",
    "Membership",
    "Migration",
    "NodeRecord",
    "Nodes",
    "Notifier",
    "Outbox",
    "OutboxEvent",
    "PoolRecord",
    "Pools",
    "ReplayGuard",
    "ResourceRef",
    "Revocation",
    "SecretRecord",
    "SecretStore",
    "SessionRecord",
    "Sessions",
    "Store",
    "StoredEvent",
    "TokenConsumption",
    "Transaction",
    "Usage",
    "UsageRecord",
    "WebhookDelivery",
    "WebhookSubscription",
    "Webhooks",
    "WorkItem",
    "WorkQueue",
    "WorkflowLogEntry",
    "WorkflowRecord",
    "WorkflowStore",
    "in_transaction",
    "transaction_scope",
]
