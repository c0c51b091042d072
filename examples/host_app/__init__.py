"""An example host application: a Starlette app that serves its own routes and mounts the control plane.

The control plane is a library: the host composes it (``better_compute(Options(...))``), mounts its ASGI
application under a path of its choosing (here ``/compute``: the API is then at ``/compute/api/compute/...``), runs
``initialize()`` and ``close()`` in its own lifespan (a mounted app's lifespan is not run by Starlette), and may also
call it in process from its own routes (``compute.api``), with the caller's credential, so the same authorization,
audit and idempotency apply as over HTTP.

Run it with ``uvicorn --factory examples.host_app:app_from_env`` and ``BETTERCOMPUTE_DATABASE_URL``.
"""

from examples.host_app._app import app_from_env as app_from_env
from examples.host_app._app import make_app as make_app

__all__ = ["app_from_env", "make_app"]
