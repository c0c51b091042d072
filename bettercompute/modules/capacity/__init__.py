"""The ``capacity`` module: ``quotas`` (per pool and tenant limits, enforced at admission), ``capacity`` (a pool's
atoms and bookings at a glance) and ``reservations`` (GPUs of a pool for a time, admitted, placed, bound through the
nodes' desired state)."""

from bettercompute.modules.capacity._methods import ACTIONS as ACTIONS
from bettercompute.modules.capacity._methods import CapacityGroup as CapacityGroup
from bettercompute.modules.capacity._methods import QuotasGroup as QuotasGroup
from bettercompute.modules.capacity._methods import ReservationsGroup as ReservationsGroup
from bettercompute.modules.capacity._module import CapacityModule as CapacityModule
from bettercompute.modules.capacity._port import CAPACITY as CAPACITY
from bettercompute.modules.capacity._port import QUOTAS as QUOTAS
from bettercompute.modules.capacity._port import AtomCount as AtomCount
from bettercompute.modules.capacity._port import BookedHours as BookedHours
from bettercompute.modules.capacity._port import CapacityReads as CapacityReads
from bettercompute.modules.capacity._port import QuotaRecord as QuotaRecord
from bettercompute.modules.capacity._port import Quotas as Quotas
from bettercompute.modules.capacity._reservation_port import RESERVATIONS as RESERVATIONS
from bettercompute.modules.capacity._reservation_port import AdmitOutcome as AdmitOutcome
from bettercompute.modules.capacity._reservation_port import AdmitRequest as AdmitRequest
from bettercompute.modules.capacity._reservation_port import BeginOutcome as BeginOutcome
from bettercompute.modules.capacity._reservation_port import Draft as Draft
from bettercompute.modules.capacity._reservation_port import ReservationRecord as ReservationRecord
from bettercompute.modules.capacity._reservation_port import Reservations as Reservations
from bettercompute.modules.capacity._reservation_schemas import MAX_GPUS_PER_RESERVATION as MAX_GPUS_PER_RESERVATION
from bettercompute.modules.capacity._reservation_schemas import MAX_HORIZON as MAX_HORIZON
from bettercompute.modules.capacity._reservation_schemas import CancelReservationInput as CancelReservationInput
from bettercompute.modules.capacity._reservation_schemas import Constraints as Constraints
from bettercompute.modules.capacity._reservation_schemas import CreateReservationInput as CreateReservationInput
from bettercompute.modules.capacity._reservation_schemas import ExplainReservationInput as ExplainReservationInput
from bettercompute.modules.capacity._reservation_schemas import Explanation as Explanation
from bettercompute.modules.capacity._reservation_schemas import ExtendReservationInput as ExtendReservationInput
from bettercompute.modules.capacity._reservation_schemas import GetReservationInput as GetReservationInput
from bettercompute.modules.capacity._reservation_schemas import ListReservationsInput as ListReservationsInput
from bettercompute.modules.capacity._reservation_schemas import ListReservationsOutput as ListReservationsOutput
from bettercompute.modules.capacity._reservation_schemas import PlacedNode as PlacedNode
from bettercompute.modules.capacity._reservation_schemas import Reservation as Reservation
from bettercompute.modules.capacity._reservation_schemas import ReservationState as ReservationState
from bettercompute.modules.capacity._reservation_schemas import Transition as Transition
from bettercompute.modules.capacity._reservations import PLACEMENT_KIND as PLACEMENT_KIND
from bettercompute.modules.capacity._reservations import RESERVATION as RESERVATION
from bettercompute.modules.capacity._reservations import RESERVATION_KIND as RESERVATION_KIND
from bettercompute.modules.capacity._reservations import event_type as event_type
from bettercompute.modules.capacity._schemas import Capacity as Capacity
from bettercompute.modules.capacity._schemas import CapacityDay as CapacityDay
from bettercompute.modules.capacity._schemas import EffectiveQuota as EffectiveQuota
from bettercompute.modules.capacity._schemas import GetCapacityInput as GetCapacityInput
from bettercompute.modules.capacity._schemas import GetQuotaInput as GetQuotaInput
from bettercompute.modules.capacity._schemas import ListQuotasInput as ListQuotasInput
from bettercompute.modules.capacity._schemas import ListQuotasOutput as ListQuotasOutput
from bettercompute.modules.capacity._schemas import ModelCapacity as ModelCapacity
from bettercompute.modules.capacity._schemas import Quota as Quota
from bettercompute.modules.capacity._schemas import SetQuotaInput as SetQuotaInput
from bettercompute.modules.capacity._settings import CapacitySettings as CapacitySettings

__all__ = [
    "ACTIONS",
    "CAPACITY",
    "MAX_GPUS_PER_RESERVATION",
    "MAX_HORIZON",
    "PLACEMENT_KIND",
    "QUOTAS",
    "RESERVATION",
    "RESERVATIONS",
    "RESERVATION_KIND",
    "AdmitOutcome",
    "AdmitRequest",
    "AtomCount",
    "BeginOutcome",
    "BookedHours",
    "CancelReservationInput",
    "Capacity",
    "CapacityDay",
    "CapacityGroup",
    "CapacityModule",
    "CapacityReads",
    "CapacitySettings",
    "Constraints",
    "CreateReservationInput",
    "Draft",
    "EffectiveQuota",
    "ExplainReservationInput",
    "Explanation",
    "ExtendReservationInput",
    "GetCapacityInput",
    "GetQuotaInput",
    "GetReservationInput",
    "ListQuotasInput",
    "ListQuotasOutput",
    "ListReservationsInput",
    "ListReservationsOutput",
    "ModelCapacity",
    "PlacedNode",
    "Quota",
    "QuotaRecord",
    "Quotas",
    "QuotasGroup",
    "Reservation",
    "ReservationRecord",
    "ReservationState",
    "Reservations",
    "ReservationsGroup",
    "SetQuotaInput",
    "Transition",
    "event_type",
]
