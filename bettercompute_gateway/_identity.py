"""A gateway process's own identity when it holds no other key: its key and certificate in a state directory, its
first certificate from a one-time enrolment token, and renewals over the internal channel.

The state directory holds ``gateway.key`` (mode 0600, made here and never sent anywhere), ``gateway.pem`` (the
certificate and the issuing CA certificate) and ``bundle.pem`` (the trust bundle). A gateway that restarts with a
certificate that has more than a minute left uses it and needs no token; one whose certificate expired (it was down
for longer than a certificate lives) needs a new token.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bettercompute.errors import FailedPreconditionError, InvalidConfigError, UnauthenticatedError
from bettercompute.modules.nodes import ServerCertificate, bundle_pin, parse_gateway_token

from ._internal import Address, RemoteGatewayServices, client_context
from ._tls import GatewayTls, csr_pem, renew_in, tls_of

__all__ = ["GatewayIdentity"]

log = logging.getLogger("bettercompute.gateway")

KEY_FILE = "gateway.key"
CERTIFICATE_FILE = "gateway.pem"
BUNDLE_FILE = "bundle.pem"
_MARGIN = dt.timedelta(minutes=1)


class GatewayIdentity:
    """The gateway ``name``'s identity in ``state_dir``, and its channel to the api processes' internal listeners at
    ``addresses`` (see ``RemoteGatewayServices``): ``await open()``, then ``await renew()`` at the interval each
    returns, then ``close()``."""

    def __init__(
        self,
        state_dir: Path,
        *,
        name: str,
        hosts: Sequence[str],
        addresses: Sequence[Address],
        trust_domain: str,
        token: str | None = None,
    ) -> None:
        self._dir = state_dir
        self._name = name
        self._hosts = tuple(hosts)
        self._addresses = tuple(addresses)
        self._trust_domain = trust_domain
        self._token = token
        self.services: RemoteGatewayServices | None = None

    def __repr__(self) -> str:
        return f"GatewayIdentity({self._name!r}, {str(self._dir)!r})"

    async def open(self) -> tuple[RemoteGatewayServices, GatewayTls, float]:
        """The channel, the gateway's TLS, and seconds until it should be renewed: from the state directory when it
        holds a current certificate, else enrolled with the token.

        Raises:
            InvalidConfigError: no current certificate and no token, or a state directory that cannot be used.
            UnauthenticatedError: the listener's trust bundle is not the token's pin, or the token is refused.
            UnavailableError: the listener cannot be reached.
        """
        saved = self._load()
        if saved is not None:
            key, issued = saved
            log.info("gateway %s: certificate from %s (valid until %s)", self._name, self._dir, issued.not_after)
        else:
            key, issued = await self._enrol()
        self.services = RemoteGatewayServices(
            self._addresses, trust_domain=self._trust_domain, context=self._context(key, issued)
        )
        return self.services, tls_of(key, issued), self._renew_in(issued)

    async def renew(self) -> tuple[GatewayTls, float]:
        """A new key and certificate over the channel, saved and put to use on the channel; the gateway's TLS and
        seconds until the next renewal.

        Raises:
            ComputeError: the control plane refused or cannot be reached (the certificate in use stays).
        """
        if self.services is None:
            raise FailedPreconditionError("open() first")
        key = ec.generate_private_key(ec.SECP256R1())
        issued = await self.services.issue_server_certificate(
            csr_pem(key, self._name), name=self._name, hosts=self._hosts
        )
        self._save(key, issued)
        self.services.reload(self._context(key, issued))
        return tls_of(key, issued), self._renew_in(issued)

    def close(self) -> None:
        if self.services is not None:
            self.services.close()

    def _context(self, key: ec.EllipticCurvePrivateKey, issued: ServerCertificate) -> ssl.SSLContext:
        tls = tls_of(key, issued)
        return client_context(issued.trust_bundle_pem, tls.certificate_pem, tls.private_key_pem)

    def _renew_in(self, issued: ServerCertificate) -> float:
        left = (issued.not_after - dt.datetime.now(dt.UTC)).total_seconds()
        return max(10.0, min(renew_in(issued), left * 2 / 3))

    async def _enrol(self) -> tuple[ec.EllipticCurvePrivateKey, ServerCertificate]:
        if self._token is None:
            raise InvalidConfigError(
                f"gateway {self._name} has no current certificate in {self._dir}: give it an enrolment token "
                "(gateway_token; mint one with `better-compute gateways token`)"
            )
        pin, _ = parse_gateway_token(self._token)
        # Before any certificate: fetch the bundle without trusting the listener, and trust it only if it has the
        # token's pin (the bundle is public; the pin is what makes it trusted).
        probe = RemoteGatewayServices(self._addresses, trust_domain=self._trust_domain, context=_unverified_context())
        try:
            bundle = await probe.trust_bundle_pem()
        finally:
            probe.close()
        try:
            matches = bundle_pin(bundle) == pin
        except ValueError:
            matches = False
        if not matches:
            raise UnauthenticatedError(
                "the internal listener's trust bundle does not have the enrolment token's pin",
                details={"reason": "pin_mismatch"},
            )
        key = ec.generate_private_key(ec.SECP256R1())
        channel = RemoteGatewayServices(
            self._addresses, trust_domain=self._trust_domain, context=client_context(bundle)
        )
        try:
            issued = await channel.enrol(self._token, csr_pem=csr_pem(key, self._name), hosts=self._hosts)
        finally:
            channel.close()
        self._save(key, issued)
        log.info("gateway %s: enrolled; certificate valid until %s", self._name, issued.not_after)
        return key, issued

    def _load(self) -> tuple[ec.EllipticCurvePrivateKey, ServerCertificate] | None:
        paths = [self._dir / f for f in (KEY_FILE, CERTIFICATE_FILE, BUNDLE_FILE)]
        if not all(p.is_file() for p in paths):
            return None
        try:
            key = serialization.load_pem_private_key(paths[0].read_bytes(), password=None)
            chain = x509.load_pem_x509_certificates(paths[1].read_bytes())
            bundle = paths[2].read_text()
        except (OSError, ValueError) as exc:
            raise InvalidConfigError(
                f"the gateway's state in {self._dir} cannot be read ({type(exc).__name__}): remove it and enrol again"
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not chain:
            raise InvalidConfigError(f"the gateway's state in {self._dir} is not one this gateway wrote")
        leaf = chain[0]
        if leaf.not_valid_after_utc - _MARGIN <= dt.datetime.now(dt.UTC):
            log.info("gateway %s: the certificate in %s has expired", self._name, self._dir)
            return None
        pem = serialization.Encoding.PEM
        return key, ServerCertificate(
            certificate_pem=leaf.public_bytes(pem).decode(),
            chain_pem="".join(c.public_bytes(pem).decode() for c in chain[1:]),
            trust_bundle_pem=bundle,
            not_before=leaf.not_valid_before_utc,
            not_after=leaf.not_valid_after_utc,
        )

    def _save(self, key: ec.EllipticCurvePrivateKey, issued: ServerCertificate) -> None:
        """Write the three files, each replaced whole (a crash leaves the old one or the new one)."""
        try:
            self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            key_pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            _replace(self._dir / KEY_FILE, key_pem, mode=0o600)
            _replace(self._dir / CERTIFICATE_FILE, (issued.certificate_pem + issued.chain_pem).encode(), mode=0o644)
            _replace(self._dir / BUNDLE_FILE, issued.trust_bundle_pem.encode(), mode=0o644)
        except OSError as exc:
            raise InvalidConfigError(
                f"the gateway's state cannot be written to {self._dir} ({exc.strerror or type(exc).__name__})"
            ) from None


def _replace(path: Path, data: bytes, *, mode: int) -> None:
    temporary = path.with_name(path.name + ".new")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def _unverified_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context
