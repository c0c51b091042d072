"""The ``system`` group: version, whoami, health."""

from ._methods import ACTIONS as ACTIONS
from ._methods import SystemGroup as SystemGroup
from ._schemas import HealthCheck as HealthCheck
from ._schemas import HealthInput as HealthInput
from ._schemas import HealthOutput as HealthOutput
from ._schemas import ModuleVersion as ModuleVersion
from ._schemas import VersionInput as VersionInput
from ._schemas import VersionOutput as VersionOutput
from ._schemas import WhoamiInput as WhoamiInput
from ._schemas import WhoamiOutput as WhoamiOutput

__all__ = [
    "ACTIONS",
    "HealthCheck",
    "HealthInput",
    "HealthOutput",
    "ModuleVersion",
    "SystemGroup",
    "VersionInput",
    "VersionOutput",
    "WhoamiInput",
    "WhoamiOutput",
]
