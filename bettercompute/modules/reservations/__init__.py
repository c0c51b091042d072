"""The ``reservations`` module: GPUs of a pool for a time, admitted, placed, and bound through the nodes' desired
state (the ``reservations`` group and the reservation controller).

``create`` is the spec's admission sequence (DESIGN §5): the dispatcher authenticates and does the tenant pre-check;
then transaction 1 (``Reservations.begin``: the idempotency key, the draft, its projection row), the IAM decision on
the draft, and transaction 2 (``Reservations.admit``: quota, placement, bookings, the audit row with the decision
id, the ``reservation.placed`` event, the controller's work item). Each transaction is one statement in the
PostgreSQL store.

Decisions the spec leaves open, made here:

- The pool must belong to the reservation's tenant; a root-tenant caller may also book a tenant into a pool of its
  own tenant (the operator's shared pools, where per-tenant quotas then apply). Any other pool, like an unknown
  one, is ``NOT_FOUND`` ("no such pool"), as everywhere else in the API: another tenant's pool cannot be told from
  none.
- A request over its quota is ``QUOTA_EXCEEDED`` (with the limit, what is used and what was asked), not
  ``NO_CAPACITY``; ``NO_CAPACITY`` counts the pool's atoms by the first reason each was left out for (``profile``,
  ``model``, ``memory``, ``cordoned``, ``unhealthy``, ``booked``; ``free`` ones that still did not fit the shape
  asked for) and gives the earliest start within 30 days at which the same request would fit.
- A request that does not fit, or that the IAM refuses, leaves nothing: its draft, projection row and idempotency
  key go, so a retry with the same key runs again.
- A replay answers what the first call answered; if that answer was lost (the process stopped after transaction 2),
  it answers the reservation as it is now.

The controller (kind ``reservation``, keyed by reservation id) carries each live reservation in its nodes' desired
states (``{"allocations": [{"id", "gpus": [uuid, ...], "mig": [uuid, ...], "start_at", "end_at"}]}``), marks it
``bound`` once every node acknowledged a generation that carries it (gateways enqueue ``desired-acked`` items, and a
pass comes back every few seconds anyway), ``active`` from ``start_at``, ``ended`` at ``end_at``, and ``failed``
when one of its nodes fails or retires for good. Each transition publishes ``reservation.<state>``.
"""

from bettercompute.modules.reservations._controller import ACKED as ACKED
from bettercompute.modules.reservations._controller import CONTROLLER as CONTROLLER
from bettercompute.modules.reservations._controller import LIVE as LIVE
from bettercompute.modules.reservations._controller import PLACEMENT_KIND as PLACEMENT_KIND
from bettercompute.modules.reservations._controller import PLACER as PLACER
from bettercompute.modules.reservations._controller import RESERVATION_KIND as RESERVATION_KIND
from bettercompute.modules.reservations._controller import event_type as event_type
from bettercompute.modules.reservations._methods import ACTIONS as ACTIONS
from bettercompute.modules.reservations._methods import ReservationsGroup as ReservationsGroup
from bettercompute.modules.reservations._module import ReservationsModule as ReservationsModule
from bettercompute.modules.reservations._port import RESERVATIONS as RESERVATIONS
from bettercompute.modules.reservations._port import AdmitOutcome as AdmitOutcome
from bettercompute.modules.reservations._port import AdmitRequest as AdmitRequest
from bettercompute.modules.reservations._port import BeginOutcome as BeginOutcome
from bettercompute.modules.reservations._port import Draft as Draft
from bettercompute.modules.reservations._port import ReservationRecord as ReservationRecord
from bettercompute.modules.reservations._port import Reservations as Reservations
from bettercompute.modules.reservations._schemas import MAX_GPUS_PER_RESERVATION as MAX_GPUS_PER_RESERVATION
from bettercompute.modules.reservations._schemas import MAX_HORIZON as MAX_HORIZON
from bettercompute.modules.reservations._schemas import CancelReservationInput as CancelReservationInput
from bettercompute.modules.reservations._schemas import Constraints as Constraints
from bettercompute.modules.reservations._schemas import CreateReservationInput as CreateReservationInput
from bettercompute.modules.reservations._schemas import ExplainReservationInput as ExplainReservationInput
from bettercompute.modules.reservations._schemas import Explanation as Explanation
from bettercompute.modules.reservations._schemas import ExtendReservationInput as ExtendReservationInput
from bettercompute.modules.reservations._schemas import GetReservationInput as GetReservationInput
from bettercompute.modules.reservations._schemas import ListReservationsInput as ListReservationsInput
from bettercompute.modules.reservations._schemas import ListReservationsOutput as ListReservationsOutput
from bettercompute.modules.reservations._schemas import PlacedNode as PlacedNode
from bettercompute.modules.reservations._schemas import Reservation as Reservation
from bettercompute.modules.reservations._schemas import ReservationState as ReservationState
from bettercompute.modules.reservations._schemas import Transition as Transition
from bettercompute.modules.reservations._service import RESERVATION as RESERVATION

__all__ = [
    "ACKED",
    "ACTIONS",
    "CONTROLLER",
    "LIVE",
    "MAX_GPUS_PER_RESERVATION",
    "MAX_HORIZON",
    "PLACEMENT_KIND",
    "PLACER",
    "RESERVATION",
    "RESERVATIONS",
    "RESERVATION_KIND",
    "AdmitOutcome",
    "AdmitRequest",
    "BeginOutcome",
    "CancelReservationInput",
    "Constraints",
    "CreateReservationInput",
    "Draft",
    "ExplainReservationInput",
    "Explanation",
    "ExtendReservationInput",
    "GetReservationInput",
    "ListReservationsInput",
    "ListReservationsOutput",
    "PlacedNode",
    "Reservation",
    "ReservationRecord",
    "ReservationState",
    "Reservations",
    "ReservationsGroup",
    "ReservationsModule",
    "Transition",
    "event_type",
]
