"""A control plane's instruction signer for the daemon's unit tests: a node CA, the signer's certificate under it
(as the control plane makes one: role ``signer``, code signing only), and its signatures."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import bettercompute_proto as wire
from bettercompute_daemon._state import StateDir

__all__ = ["TestSigner"]


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


class TestSigner:
    """A CA and a signer certificate of ``trust_domain``; ``certificate`` may be made with other properties to test
    what the daemon refuses."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, trust_domain: str = "example.com") -> None:
        self.trust_domain = trust_domain
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.ca = (
            x509.CertificateBuilder()
            .subject_name(_name("test node CA"))
            .issuer_name(_name("test node CA"))
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self.ca_key, hashes.SHA256())
        )
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.certificate = self.certify()

    def certify(
        self,
        *,
        uri: str | None = None,
        usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.CODE_SIGNING,
        ca: bool = False,
        lifetime: tuple[dt.timedelta, dt.timedelta] = (dt.timedelta(minutes=-5), dt.timedelta(hours=1)),
        issuer_key: ec.EllipticCurvePrivateKey | None = None,
    ) -> bytes:
        """A certificate (DER) for the signer's key; by default one the daemon accepts."""
        now = dt.datetime.now(dt.UTC)
        built = (
            x509.CertificateBuilder()
            .subject_name(_name("sgk_test"))
            .issuer_name(self.ca.subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now + lifetime[0])
            .not_valid_after(now + lifetime[1])
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.UniformResourceIdentifier(uri or f"spiffe://{self.trust_domain}/signer/sgk_test")]
                ),
                critical=False,
            )
            .sign(issuer_key or self.ca_key, hashes.SHA256())
        )
        return built.public_bytes(serialization.Encoding.DER)

    def pin(self, state: StateDir) -> None:
        """Make this CA the one the node pinned at join."""
        state.write("pinned-ca.pem", self.ca.public_bytes(serialization.Encoding.PEM))

    def sign(self, message: bytes) -> bytes:
        return self.key.sign(message, ec.ECDSA(hashes.SHA256()))

    def desired(self, node_id: str, generation: int, content_json: str) -> wire.DesiredState:
        """A desired state signed for ``node_id``."""
        message = wire.desired_state_message(node_id=node_id, generation=generation, content_json=content_json)
        return wire.DesiredState(
            generation=generation,
            content_json=content_json,
            signature=self.sign(message),
            signer_certificate=self.certificate,
        )

    def command(self, node_id: str, command_id: str, *, kind: str = "diag.nvml", deadline_ms: int) -> wire.Command:
        """A command signed for ``node_id``."""
        message = wire.command_message(
            command_id=command_id, node_id=node_id, kind=kind, arguments_json="{}", deadline_ms=deadline_ms
        )
        return wire.Command(
            id=command_id,
            kind=kind,
            arguments_json="{}",
            deadline_ms=deadline_ms,
            signature=self.sign(message),
            signer_certificate=self.certificate,
        )
