"""The gateway's TLS: its server certificate, and the trust bundle that client certificates must chain to."""

from __future__ import annotations

import os
import ssl
import tempfile

import attrs

__all__ = ["GatewayTls", "server_context"]


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
