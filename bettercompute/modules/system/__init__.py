"""The ``system`` group: version, whoami, health."""

from bettercompute.modules.system._methods import ACTIONS as ACTIONS
from bettercompute.modules.system._methods import SystemGroup as SystemGroup
from bettercompute.modules.system._module import SystemModule as SystemModule
from bettercompute.modules.system._schemas import HealthCheck as HealthCheck
from bettercompute.modules.system._schemas import HealthInput as HealthInput
from bettercompute.modules.system._schemas import HealthOutput as HealthOutput
from bettercompute.modules.system._schemas import ModuleVersion as ModuleVersion
from bettercompute.modules.system._schemas import VersionInput as VersionInput
from bettercompute.modules.system._schemas import VersionOutput as VersionOutput
from bettercompute.modules.system._schemas import WhoamiInput as WhoamiInput
from bettercompute.modules.system._schemas import WhoamiOutput as WhoamiOutput

__all__ = [
    "ACTIONS",
    "HealthCheck",
    "HealthInput",
    "HealthOutput",
    "ModuleVersion",
    "SystemGroup",
    "SystemModule",
    "VersionInput",
    "VersionOutput",
    "WhoamiInput",
    "WhoamiOutput",
]
