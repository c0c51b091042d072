"""The OpenAPI 3.1 document, generated from the registry (never written by hand)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from bettercompute._runtime.codec import json_schema
from bettercompute._version import __version__
from bettercompute.errors import ComputeError

if TYPE_CHECKING:
    from bettercompute._runtime.registry import Registry

__all__ = ["openapi_document"]

_ERROR_STATUSES = sorted({cls.http_status for cls in ComputeError.__subclasses__()} | {405, 413, 415})


_IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "Retry safely: the same key with the same request replays the first answer (kept 24 hours); "
    "with another request it is CONFLICT. Scoped to the caller.",
    "schema": {"type": "string", "pattern": "^[!-~]{1,255}$"},
}


def _has_required(cls: type) -> bool:
    return any(f.default is attrs.NOTHING for f in attrs.fields(cls))


def openapi_document(registry: Registry, endpoint: str) -> dict[str, Any]:
    """One path per method, its input as the request body and ``{"data": output}`` as the 200 response."""
    defs: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    tags = []
    for spec in registry.groups():
        tags.append({"name": spec.name, "description": spec.description})
    for method in registry.methods():
        input_schema = json_schema(method.input, defs)
        output_schema = json_schema(method.output, defs)
        responses: dict[str, Any] = {
            "200": {
                "description": "The method's result.",
                "content": {
                    "application/json": {
                        "schema": {"type": "object", "properties": {"data": output_schema}, "required": ["data"]}
                    }
                },
            }
        }
        for status in _ERROR_STATUSES:
            responses[str(status)] = {"$ref": "#/components/responses/Error"}
        operation: dict[str, Any] = {
            "operationId": f"{method.group}.{method.name}",
            "summary": method.summary,
            "tags": [method.group],
            # An empty body reads as ``{}``: it is optional only when no field is required.
            "requestBody": {
                "required": _has_required(method.input),
                "content": {"application/json": {"schema": input_schema}},
            },
            "responses": responses,
            "x-action": method.action,
            "x-mutates": method.mutates,
            "x-access": method.access,
        }
        if method.mutates:
            # The same key and request replay the first answer (see bettercompute._runtime.idempotency).
            operation["parameters"] = [_IDEMPOTENCY_KEY]
        if not method.authenticated:
            operation["security"] = []
        paths[f"{endpoint}{method.path}"] = {"post": operation}
    defs["Error"] = {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "enum": sorted(c.code for c in ComputeError.__subclasses__())},
                    "message": {"type": "string"},
                    "details": {"type": "object"},
                    "retryable": {"type": "boolean"},
                },
                "required": ["code", "message", "details", "retryable"],
            }
        },
        "required": ["error"],
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Better Compute", "version": __version__},
        "tags": tags,
        "paths": paths,
        "components": {
            "schemas": defs,
            "responses": {
                "Error": {
                    "description": "An error envelope.",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                }
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "bcak_<id>.<secret>"}},
        },
        "security": [{"bearer": []}],
    }
