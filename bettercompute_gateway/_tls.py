"""The gateway's TLS: its server certificate, and the trust bundle that client certificates must chain to."""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bettercompute.modules.nodes import ServerCertificate

if TYPE_CHECKING:
    from ._port import GatewayServicesPort

__all__ = ["GatewayTls", "ServerTls", "csr_pem", "issue_tls", "renew_in", "server_context", "tls_of"]


@attrs.frozen(kw_only=True)
class GatewayTls:
    """What the gateway's TLS needs.

    Args:
        certificate_pem: The gateway's server certificate, then any intermediate (the control plane's CA issues one:
            ``CertificateAuthority.issue_server``; an operator's own works too, if the daemons trust its CA).
        private_key_pem: Its private key (PEM, unencrypted); never logged.
        trust_bundle_pem: The CA certificates client certificates must chain to (the node CA's trust bundle).
    """

    certificate_pem: str
    private_key_pem: str = attrs.field(repr=False)
    trust_bundle_pem: str


async def issue_tls(services: GatewayServicesPort, *, name: str, hosts: Sequence[str]) -> tuple[GatewayTls, float]:
    """A new key and a certificate for it from the control plane's CA (which every daemon trusts since its join),
    with the trust bundle; and how many seconds to use it before asking for the next (two thirds of its life, at
    least a minute). The key never leaves this process: the control plane sees only a CSR
    (``issue_server_certificate``), in process or over the internal channel.

    Args:
        services: ``compute.gateway_services`` (node identity configured, ``initialize()`` done), or
            ``RemoteGatewayServices``.
        name: The gateway's name, the certificate's common name.
        hosts: The names and addresses daemons dial it by (the certificate's subject alternative names).
    """
    key = ec.generate_private_key(ec.SECP256R1())
    issued = await services.issue_server_certificate(csr_pem(key, name), name=name, hosts=hosts)
    return tls_of(key, issued), renew_in(issued)


def csr_pem(key: ec.EllipticCurvePrivateKey, name: str) -> str:
    """A CSR for ``key`` with the common name ``name`` (PEM)."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def tls_of(key: ec.EllipticCurvePrivateKey, issued: ServerCertificate) -> GatewayTls:
    """The gateway's TLS from its key and the certificate issued for it."""
    return GatewayTls(
        certificate_pem=issued.certificate_pem + issued.chain_pem,
        private_key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
        trust_bundle_pem=issued.trust_bundle_pem,
    )


def renew_in(issued: ServerCertificate) -> float:
    """Seconds until a certificate should be renewed: two thirds of its life, at least a minute."""
    life = (issued.not_after - issued.not_before).total_seconds()
    return max(60.0, life * 2 / 3)


def server_context(tls: GatewayTls) -> ssl.SSLContext:
    """A TLS server context: TLS 1.2 or later, ALPN ``h2`` only, a client certificate optional at the handshake
    (``Join`` is made without one) and verified against the trust bundle whenever one is presented.

    Raises:
        ssl.SSLError: the certificate, key or bundle does not load.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_OPTIONAL
    context.set_alpn_protocols(["h2"])
    load(context, tls)
    return context


def load(context: ssl.SSLContext, tls: GatewayTls) -> None:
    """Put ``tls``'s certificate, key and bundle in ``context``; connections made after it use them (a renewed
    certificate, a CA added by a rotation). A CA that left the bundle stays trusted by the handshake until the
    process restarts, but the control plane refuses its certificates (they no longer chain to its bundle).

    Raises:
        ssl.SSLError: the certificate, key or bundle does not load.
    """
    context.load_verify_locations(cadata=tls.trust_bundle_pem)
    # The standard library loads a certificate and key only from files: a private file, removed at once.
    fd, path = tempfile.mkstemp(prefix="bc-gateway-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(tls.private_key_pem)
            file.write("\n")
            file.write(tls.certificate_pem)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)


class ServerTls:
    """The gateway's TLS in use: the ``GatewayTls`` it was given last, and the server context made from it once the
    gateway listens (``open``), which a reload updates in place."""

    def __init__(self, tls: GatewayTls) -> None:
        self.tls = tls
        self._context: ssl.SSLContext | None = None

    def open(self) -> ssl.SSLContext:
        """The server context for the listening socket.

        Raises:
            ssl.SSLError: the certificate, key or bundle does not load.
        """
        self._context = server_context(self.tls)
        return self._context

    def reload(self, tls: GatewayTls) -> None:
        """Use ``tls`` for the connections made from now on.

        Raises:
            ssl.SSLError: it does not load (the one in use stays).
        """
        server_context(tls)  # fails here, before the live context is touched, if it does not load
        if self._context is not None:
            load(self._context, tls)
        self.tls = tls
