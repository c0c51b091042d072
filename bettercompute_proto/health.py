"""The standard gRPC health service (``protos/grpc/health/v1/health.proto``), as the gateway serves it to load
balancers: ``Check`` answers the status now, ``Watch`` the status and then each change of it."""

from __future__ import annotations

from bettercompute_proto._generated.grpc.health.v1 import HealthCheckRequest as HealthCheckRequest
from bettercompute_proto._generated.grpc.health.v1 import HealthCheckResponse as HealthCheckResponse
from bettercompute_proto._generated.grpc.health.v1 import HealthCheckResponseServingStatus as ServingStatus
from bettercompute_proto._generated.grpc.health.v1 import HealthStub as HealthStub

SERVICE = "grpc.health.v1.Health"
"""The health service's full name (``/grpc.health.v1.Health/Check`` and ``/Watch``)."""

__all__ = ["SERVICE", "HealthCheckRequest", "HealthCheckResponse", "HealthStub", "ServingStatus"]
