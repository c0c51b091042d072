"""What the node CA reads and writes as X.509, with no store and no KMS: the CSRs it accepts, the leaf certificates
it signs (the profile is in ``_ca``'s docstring), serials, host names and key fingerprints."""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import re
from collections.abc import Sequence

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bettercompute.errors import InternalError, InvalidInputError
from bettercompute.ports import Kms

__all__ = [
    "AcceptedKey",
    "Leaf",
    "checked_csr_key",
    "checked_segment",
    "host_name",
    "key_sha256",
    "serial_hex",
    "sign_leaf",
    "unsealed_ec_key",
    "utc_seconds",
]

_ORG = "Better Compute"
_NODE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_MAX_CSR_BYTES = 16 * 1024


def serial_hex(serial: int | str) -> str:
    """The canonical serial text: lower-case hex without leading zeros (from an int or any-case hex text).

    Raises:
        InvalidInputError: not a positive serial.
    """
    if isinstance(serial, str):
        try:
            value = int(serial.strip().lower().removeprefix("0x"), 16)
        except ValueError:
            raise InvalidInputError("a certificate serial is hex digits", details={"field": "serial"}) from None
    else:
        value = serial
    if value <= 0:
        raise InvalidInputError("a certificate serial is a positive number", details={"field": "serial"})
    return format(value, "x")


def utc_seconds(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC, to the second (what a certificate's validity holds)."""
    return value.astimezone(dt.UTC).replace(microsecond=0)


def key_sha256(public_key: AcceptedKey | x509.Certificate) -> str:
    """SHA-256 (hex) of a public key's SubjectPublicKeyInfo (DER), or of a certificate's key."""
    key = public_key.public_key() if isinstance(public_key, x509.Certificate) else public_key
    spki = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).hexdigest()


def leaf_key_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


AcceptedKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | rsa.RSAPublicKey
"""The keys a CSR may carry: EC P-256 or P-384, Ed25519, RSA of at least 2048 bits."""
_HOST = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def host_name(host: str) -> x509.GeneralName:
    """A subject alternative name for a host a client dials: an IP address, or an ASCII DNS name.

    Raises:
        InvalidInputError: neither.
    """
    if not isinstance(host, str):
        raise InvalidInputError("a host must be text", details={"field": "hosts"})
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host.isascii() or not _HOST.fullmatch(host):
        raise InvalidInputError("a host must be an IP address or an ASCII DNS name", details={"field": "hosts"})
    return x509.DNSName(host.lower())


def checked_segment(name: str) -> str:
    """``name`` as the last segment of a SPIFFE ID (a gateway's name): 1 to 128 letters, digits, '.', '_', '-'."""
    if not isinstance(name, str) or not _NODE_ID.fullmatch(name):
        raise InvalidInputError("the name must be 1 to 128 letters, digits, '.', '_' or '-'", details={"field": "name"})
    return name


def checked_csr_key(csr_pem: str | bytes) -> AcceptedKey:
    """The public key of a well-formed, self-consistent CSR that asks for no name of its own."""
    if not isinstance(csr_pem, str | bytes):
        raise InvalidInputError("the CSR must be PEM text", details={"field": "csr"})
    data = csr_pem.encode() if isinstance(csr_pem, str) else csr_pem
    if len(data) > _MAX_CSR_BYTES:
        raise InvalidInputError("the CSR is too large", details={"field": "csr"})
    try:
        csr = x509.load_pem_x509_csr(data)
    except ValueError:
        raise InvalidInputError("the CSR is not a PEM certificate signing request", details={"field": "csr"}) from None
    try:
        valid = csr.is_signature_valid
    except (InvalidSignature, ValueError):
        valid = False
    if not valid:
        raise InvalidInputError(
            "the CSR's signature does not match its public key", details={"field": "csr", "reason": "signature"}
        )
    try:
        csr.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        pass
    except ValueError:
        raise InvalidInputError("the CSR's extensions do not parse", details={"field": "csr"}) from None
    else:
        raise InvalidInputError(
            "the CSR asks for its own subject alternative names; the CA sets the SPIFFE ID itself",
            details={"field": "csr", "reason": "san"},
        )
    try:
        key = csr.public_key()
    except (ValueError, x509.UnsupportedGeneralNameType):
        raise InvalidInputError("the CSR's public key is not supported", details={"field": "csr"}) from None
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1 | ec.SECP384R1):
        return key
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, rsa.RSAPublicKey) and key.key_size >= 2048:
        return key
    raise InvalidInputError(
        "the CSR's key must be EC P-256 or P-384, Ed25519, or RSA of at least 2048 bits",
        details={"field": "csr", "reason": "key_type"},
    )


@attrs.frozen(kw_only=True)
class Leaf:
    """A leaf certificate to sign: whose (``name``, ``role``, ``spiffe_id``), for which key, for how long, and the
    hosts a server certificate is for (none: a client certificate)."""

    name: str
    role: str
    spiffe_id: str
    public_key: AcceptedKey
    not_before: dt.datetime
    not_after: dt.datetime
    server_hosts: Sequence[str] = ()


def sign_leaf(
    leaf: Leaf, *, issuer: x509.Certificate, private: ec.EllipticCurvePrivateKey
) -> tuple[int, x509.Certificate]:
    """``(serial, certificate)``: ``leaf`` signed by the CA key ``private`` whose certificate is ``issuer``.

    Raises:
        InvalidInputError: a server host that is neither an IP address nor an ASCII DNS name.
    """
    serial = x509.random_serial_number()
    if leaf.role == "gateway":  # its server certificate is also its client certificate on the internal channel
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    elif leaf.role == "signer":  # signs instructions to nodes, never a TLS peer
        usages = [ExtendedKeyUsageOID.CODE_SIGNING]
    else:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH if leaf.server_hosts else ExtendedKeyUsageOID.CLIENT_AUTH]
    names = [x509.UniformResourceIdentifier(leaf.spiffe_id), *map(host_name, leaf.server_hosts)]
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORG),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, leaf.role),
            x509.NameAttribute(NameOID.COMMON_NAME, leaf.name),
        ]
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject)
        .public_key(leaf.public_key)
        .serial_number(serial)
        .not_valid_before(leaf.not_before)
        .not_valid_after(leaf.not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(leaf_key_usage(), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf.public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(private.public_key()), critical=False)
        .sign(private, hashes.SHA256())
    )
    return serial, certificate


async def unsealed_ec_key(kms: Kms, sealed: bytes, *, context: str, what: str) -> ec.EllipticCurvePrivateKey:
    """An EC private key (PKCS#8 DER) the KMS sealed under ``context``, opened.

    Raises:
        InternalError: what was sealed is not an EC key (``what`` names the key in the message).
    """
    der = await kms.decrypt(sealed, context=context)
    loaded = serialization.load_der_private_key(der, password=None)
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        raise InternalError(f"a stored {what} is not an EC key")
    return loaded
