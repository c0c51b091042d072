"""The ``capacity`` module: ``quotas`` (per pool and tenant limits, enforced when reservations are admitted) and
``capacity`` (a pool's atoms and bookings at a glance), and ``CapacitySettings`` (how reservations are placed)."""

from bettercompute.modules.capacity._methods import ACTIONS as ACTIONS
from bettercompute.modules.capacity._methods import CapacityGroup as CapacityGroup
from bettercompute.modules.capacity._methods import QuotasGroup as QuotasGroup
from bettercompute.modules.capacity._module import CapacityModule as CapacityModule
from bettercompute.modules.capacity._port import CAPACITY as CAPACITY
from bettercompute.modules.capacity._port import QUOTAS as QUOTAS
from bettercompute.modules.capacity._port import AtomCount as AtomCount
from bettercompute.modules.capacity._port import BookedHours as BookedHours
from bettercompute.modules.capacity._port import CapacityReads as CapacityReads
from bettercompute.modules.capacity._port import QuotaRecord as QuotaRecord
from bettercompute.modules.capacity._port import Quotas as Quotas
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
    "QUOTAS",
    "AtomCount",
    "BookedHours",
    "Capacity",
    "CapacityDay",
    "CapacityGroup",
    "CapacityModule",
    "CapacityReads",
    "CapacitySettings",
    "EffectiveQuota",
    "GetCapacityInput",
    "GetQuotaInput",
    "ListQuotasInput",
    "ListQuotasOutput",
    "ModelCapacity",
    "Quota",
    "QuotaRecord",
    "Quotas",
    "QuotasGroup",
    "SetQuotaInput",
]
