"""Inputs and outputs of the ``secrets`` group.

Tenant-scoped: every input names its ``tenant``, so the core's pre-check refuses a caller from another tenant
before any database access. A secret's value goes in through ``create`` and never comes back out of this group: it
leaves only through ``SecretBroker.secret``, as JWE to one node's ephemeral key.
"""

from __future__ import annotations

import datetime as dt
import re

import attrs

from bettercompute.fields import Text
from bettercompute.paging import PageInput

__all__ = [
    "CreateSecretInput",
    "DeleteSecretInput",
    "DeleteSecretOutput",
    "ListSecretsInput",
    "ListSecretsOutput",
    "Secret",
]

MAX_VALUE_CHARS = 64 * 1024
SCOPE = re.compile(r"(node|pool|site):[A-Za-z0-9._-]{1,128}")
_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_SCOPE = Text(pattern=SCOPE.pattern, reason="must be 'node:<id>', 'pool:<id>' or 'site:<id>'")
# The rules never quote the value they refuse: for ``value`` it is the secret itself.
_VALUE = Text(min_length=1, max_length=MAX_VALUE_CHARS, reason=f"must be 1 to {MAX_VALUE_CHARS} characters")
_DESCRIPTION = Text(max_length=500, reason="must be at most 500 characters")


@attrs.frozen(kw_only=True)
class CreateSecretInput:
    """A secret: its name (unique in the tenant), who may have it (``node:<id>``, ``pool:<id>`` or ``site:<id>``)
    and its value, which is sealed by the KMS and never shown again (its ``repr`` hides it)."""

    tenant: str = attrs.field(validator=_ID)
    name: str = attrs.field(validator=_ID)
    scope: str = attrs.field(validator=_SCOPE)
    value: str = attrs.field(validator=_VALUE, repr=False)
    description: str = attrs.field(default="", validator=_DESCRIPTION)


@attrs.frozen(kw_only=True)
class Secret:
    """A secret's metadata; there is no way to read its value back."""

    id: str
    tenant: str
    name: str
    scope: str
    description: str
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class ListSecretsInput(PageInput):
    """The tenant whose secrets to list, one page at a time."""

    tenant: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListSecretsOutput:
    """A page of the tenant's secrets by name (metadata only); ``next_cursor`` is null on the last page."""

    secrets: tuple[Secret, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class DeleteSecretInput:
    """A secret to delete, by name."""

    tenant: str = attrs.field(validator=_ID)
    name: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class DeleteSecretOutput:
    """Always ``deleted=True`` (an unknown secret is ``NOT_FOUND``)."""

    deleted: bool
