"""Gateway methods: how a module answers its own agents (a site, a ramdisk) over the gateway's ``Call`` RPC.

The gateway knows no module. It reads the client certificate off the TLS connection (when there is one) and relays
``(method, certificate, input)`` to the control plane, which checks the certificate as for every other call (it
chains to the CA, this CA issued it, it is not revoked, it has not expired), checks its role against the method's
``roles``, and only then runs the module's handler with a verified ``GatewayCaller``. A method declared ``open``
takes calls without a certificate too: the joins that hand one out.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from bettercompute.ports import Transaction

if TYPE_CHECKING:
    from cryptography.x509 import Certificate

    from bettercompute._runtime.context import ModuleContext

__all__ = ["CertificateIssuer", "GatewayCall", "GatewayCaller", "GatewayMethod", "IssuedCertificate"]

_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}\.[a-z][a-z0-9-]{0,31}")


@attrs.frozen(kw_only=True)
class GatewayCaller:
    """Who made a call, read from a certificate the control plane verified.

    ``id`` is the last segment of the SPIFFE ID: a node id, a site id or a machine id (a ramdisk's).
    """

    role: str
    id: str
    spiffe_id: str
    serial: str
    not_after: dt.datetime
    certificate: Certificate


class IssuedCertificate(Protocol):
    """What the CA returns for a certificate it signed."""

    @property
    def certificate_pem(self) -> str: ...
    @property
    def chain_pem(self) -> str: ...
    @property
    def serial(self) -> str: ...
    @property
    def spiffe_id(self) -> str: ...
    @property
    def not_after(self) -> dt.datetime: ...


class CertificateIssuer(Protocol):
    """The control plane's CA, as a gateway method sees it: it may sign for the roles ``site`` and ``ramdisk``."""

    async def prepare(self) -> Any:
        """Load the active signing key, before a transaction that issues."""
        ...

    async def issue_in(
        self,
        tx: Transaction,
        csr_pem: str | bytes,
        *,
        node_id: str,
        role: str = "node",
        ttl: dt.timedelta | None = None,
    ) -> IssuedCertificate:
        """Sign ``csr_pem`` for ``node_id`` in ``role`` and record it in ``tx``."""
        ...

    async def trust_bundle_pem(self) -> str:
        """Every CA certificate to trust now (PEM)."""
        ...

    async def revoke_spiffe_id_in(self, tx: Transaction, spiffe_id: str, *, reason: str = "") -> Any:
        """Revoke every certificate of ``spiffe_id`` in ``tx``."""
        ...


@attrs.frozen(kw_only=True)
class GatewayCall:
    """One call of a gateway method: who (``None`` on an open method called without a certificate), what, and the
    parts a handler may use."""

    method: str
    caller: GatewayCaller | None
    input: Mapping[str, Any]
    context: ModuleContext
    issuer: CertificateIssuer


def _name(instance: Any, attribute: Any, value: str) -> None:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(f"a gateway method's name is <area>.<name> in lower case, not {value!r}")


def _roles(value: Any) -> frozenset[str]:
    return frozenset(value)


@attrs.frozen(kw_only=True)
class GatewayMethod:
    """A method a module answers over the gateway's ``Call`` RPC.

    Args:
        name: ``<area>.<name>`` (``site.sync``), unique in the control plane.
        roles: The certificate roles that may call it (``node``, ``site``, ``ramdisk``).
        handler: ``async (GatewayCall) -> dict``; what it returns goes back as JSON. Raise a ``ComputeError`` to
            refuse: the daemon gets its code and message, never anything else.
        open: Whether a call without a client certificate is taken (``caller`` is then ``None``); a call with one is
            still checked against ``roles``.
    """

    name: str = attrs.field(validator=_name)
    roles: frozenset[str] = attrs.field(converter=_roles)
    handler: Callable[[GatewayCall], Awaitable[Mapping[str, Any]]]
    open: bool = False
