"""An example third-party module: maintenance windows of a pool (``maintenance.create``, ``maintenance.list``).

It follows the pattern every module follows, from its own package, as ``bettercompute_iam`` does:

- ``_schemas.py``: inputs and outputs (attrs classes whose fields validate themselves);
- ``_port.py``: the record and the protocol of its own repository, and its typed key ``MAINTENANCE``;
- ``_pg.py``: the PostgreSQL adapter of that protocol (a ``PgRepository`` the key names) and the module's migrations
  (versioned under its name);
- ``_handlers.py``: the methods, declared once with ``@method``;
- ``_module.py``: the group, the typed group set and the module object.

Compose it with ``Options(modules=[MaintenanceModule()])``; call it with
``MaintenanceGroups(compute.api).maintenance.create(credential, CreateWindowInput(...))``. Its handlers write with
``tx.repository(MAINTENANCE).create(...)`` inside ``async with call.transaction() as tx:``.
"""

from examples.maintenance._module import MaintenanceGroup as MaintenanceGroup
from examples.maintenance._module import MaintenanceGroups as MaintenanceGroups
from examples.maintenance._module import MaintenanceModule as MaintenanceModule
from examples.maintenance._schemas import CreateWindowInput as CreateWindowInput
from examples.maintenance._schemas import ListWindowsInput as ListWindowsInput
from examples.maintenance._schemas import ListWindowsOutput as ListWindowsOutput
from examples.maintenance._schemas import Window as Window

__all__ = [
    "CreateWindowInput",
    "ListWindowsInput",
    "ListWindowsOutput",
    "MaintenanceGroup",
    "MaintenanceGroups",
    "MaintenanceModule",
    "Window",
]
