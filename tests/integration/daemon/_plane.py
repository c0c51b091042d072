"""A stand-in for the gateway and the metal module behind it, enough to drive ``bcd ramdisk`` and ``bcd site`` over
the real wire: a grpclib server on loopback with TLS that implements only ``Call``, a test CA that signs the CSRs
of ``ramdisk.join`` and ``site.join``, and a few methods to test the client with (``echo``, ``refuse``, ``whoami``).

It checks what the real control plane checks of these clients' calls (the token, a client certificate for the
methods that need one, the report's signature over the exact bytes) and answers in the contract's shapes."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

import bettercompute_proto as wire
from bettercompute_daemon.identity import ramdisk_report_message

TRUST_DOMAIN = "test.example"
RAMDISK_TOKEN = "bcrt_tok1.secret"
SITE_TOKEN = "bcst_tok2.secret"
MACHINE_ID = "mach_0001"
SITE_ID = "site_0001"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@attrs.define
class FakeCa:
    """A CA that signs the gateway's server certificate and the clients' CSRs."""

    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    @classmethod
    def make(cls) -> FakeCa:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name("test CA"))
            .issuer_name(_name("test CA"))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key=key, certificate=certificate)

    @property
    def pem(self) -> str:
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    def issue(self, public_key: Any, san: x509.GeneralName, *, server: bool, hours: float = 2) -> x509.Certificate:
        now = dt.datetime.now(dt.UTC)
        usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
        return (
            x509.CertificateBuilder()
            .subject_name(_name("leaf"))
            .issuer_name(self.certificate.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=hours))
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )

    def sign_csr(self, csr_pem: str, spiffe_id: str) -> str:
        csr = x509.load_pem_x509_csr(csr_pem.encode())
        certificate = self.issue(csr.public_key(), x509.UniformResourceIdentifier(spiffe_id), server=False)
        return certificate.public_bytes(serialization.Encoding.PEM).decode()

    def server_context(self, folder: Path) -> ssl.SSLContext:
        """The gateway's TLS: a certificate for 127.0.0.1, client certificates of this CA asked for, not required."""
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = self.issue(key.public_key(), x509.IPAddress(ipaddress.ip_address("127.0.0.1")), server=True)
        path = folder / "server.pem"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            + certificate.public_bytes(serialization.Encoding.PEM)
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=self.pem)
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_cert_chain(path)
        context.set_alpn_protocols(["h2"])
        return context


def refusal(status: Status, code: str, message: str, **details: Any) -> GRPCError:
    body = {"error": {"code": code, "message": message, "details": details, "retryable": False}}
    return GRPCError(status, json.dumps(body))


def _spiffe(stream: Stream[Any, Any]) -> str | None:
    """The SPIFFE ID of the client's certificate, if it sent one."""
    peer = stream.peer.cert()
    for kind, value in (peer or {}).get("subjectAltName", ()):
        if kind == "URI" and value.startswith("spiffe://"):
            return str(value)
    return None


@attrs.define
class Plane:
    """The stand-in's state: the tasks to hand out and what came back."""

    ca: FakeCa
    tasks: list[dict[str, Any]] = attrs.field(factory=list)
    reports: list[dict[str, Any]] = attrs.field(factory=list)
    joins: list[dict[str, Any]] = attrs.field(factory=list)
    syncs: list[dict[str, Any]] = attrs.field(factory=list)
    ramdisk_key: Any = None
    current: dict[str, Any] | None = None
    calls: list[tuple[str, str | None]] = attrs.field(factory=list)
    """Each call's method and the caller's SPIFFE ID."""

    def __mapping__(self) -> dict[str, Handler]:
        return {
            f"/{wire.SERVICE}/Call": Handler(self._handle, Cardinality.UNARY_UNARY, wire.CallRequest, wire.CallResponse)
        }

    async def _handle(self, stream: Stream[wire.CallRequest, wire.CallResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None
        caller = _spiffe(stream)
        self.calls.append((request.method, caller))
        output = self.answer(request.method, json.loads(request.input_json), caller)
        await stream.send_message(wire.CallResponse(output_json=json.dumps(output)))

    def answer(self, method: str, input: dict[str, Any], caller: str | None) -> dict[str, Any]:
        if method == "echo":
            return {"echo": input}
        if method == "whoami":
            return {"spiffe_id": caller}
        if method == "refuse":
            raise refusal(Status.PERMISSION_DENIED, "ACCESS_DENIED", "not for you", reason="wrong_role")
        if method == "refuse_plainly":
            raise GRPCError(Status.UNIMPLEMENTED, "no such method")
        if method == "not_an_object":
            return [1, 2]  # type: ignore[return-value]
        if method == "ramdisk.join":
            return self._ramdisk_join(input)
        if method == "ramdisk.task":
            return self._ramdisk_task(input, caller)
        if method == "site.join":
            return self._site_join(input)
        if method == "site.sync":
            return self._site_sync(input, caller)
        raise refusal(Status.NOT_FOUND, "NOT_FOUND", f"no method {method}")

    def _ramdisk_join(self, input: Mapping[str, Any]) -> dict[str, Any]:
        if input.get("token") != RAMDISK_TOKEN:
            raise refusal(Status.PERMISSION_DENIED, "ACCESS_DENIED", "the token is not good", reason="bad_token")
        self.joins.append(dict(input))
        certificate = self.ca.sign_csr(input["csr_pem"], f"spiffe://{TRUST_DOMAIN}/ramdisk/{MACHINE_ID}")
        self.ramdisk_key = x509.load_pem_x509_certificate(certificate.encode()).public_key()
        return {
            "machine_id": MACHINE_ID,
            "certificate_pem": certificate,
            "chain_pem": "",
            "trust_bundle_pem": self.ca.pem,
            "not_after_ms": 0,
        }

    def _ramdisk_task(self, input: Mapping[str, Any], caller: str | None) -> dict[str, Any]:
        if caller != f"spiffe://{TRUST_DOMAIN}/ramdisk/{MACHINE_ID}":
            raise refusal(Status.PERMISSION_DENIED, "ACCESS_DENIED", "a ramdisk certificate is needed")
        report = input.get("report")
        if report is not None:
            self._check_report(report)
            self.reports.append(report)
            self.current = None
        if self.current is None and self.tasks:
            self.current = self.tasks.pop(0)
        if self.current is None:
            return {"task": None, "poll_after_ms": 100, "done": True}
        return {"task": self.current, "poll_after_ms": 100}

    def _check_report(self, report: Mapping[str, Any]) -> None:
        assert self.current is not None and report["task_id"] == self.current["task_id"]
        message = ramdisk_report_message(
            machine_id=MACHINE_ID,
            task_id=report["task_id"],
            kind=report["kind"],
            ok=report["ok"],
            result=report["result"],
            error=report["error"],
            signed_at_ms=report["signed_at_ms"],
        )
        try:
            self.ramdisk_key.verify(base64.b64decode(report["signature"]), message, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            raise refusal(Status.INVALID_ARGUMENT, "INVALID_INPUT", "bad signature") from None

    def _site_join(self, input: Mapping[str, Any]) -> dict[str, Any]:
        if input.get("token") != SITE_TOKEN:
            raise refusal(Status.PERMISSION_DENIED, "ACCESS_DENIED", "the token is not good", reason="bad_token")
        self.joins.append(dict(input))
        certificate = self.ca.sign_csr(input["csr_pem"], f"spiffe://{TRUST_DOMAIN}/site/{SITE_ID}")
        return {
            "site_id": SITE_ID,
            "tenant": "tn_1",
            "certificate_pem": certificate,
            "chain_pem": "",
            "trust_bundle_pem": self.ca.pem,
            "not_after_ms": 1_700_000_000_000,
        }

    def _site_sync(self, input: Mapping[str, Any], caller: str | None) -> dict[str, Any]:
        if caller != f"spiffe://{TRUST_DOMAIN}/site/{SITE_ID}":
            raise refusal(Status.PERMISSION_DENIED, "ACCESS_DENIED", "a site certificate is needed")
        self.syncs.append(dict(input))
        holder = self.syncs[0]["agent"]
        active = input["agent"] == holder
        plan = {"generation": 3, "entries": [{"machine_id": MACHINE_ID, "action": "ramdisk"}]} if active else {}
        return {"active": active, "holder": holder, "lease_ttl_ms": 30_000, "sync_after_ms": 5_000, "plan": plan}


@attrs.define
class Running:
    plane: Plane
    server: Server
    port: int

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def bundle_b64(self) -> str:
        return base64.b64encode(self.plane.ca.pem.encode()).decode()


async def start(folder: Path) -> Running:
    """The stand-in, listening on a free loopback port."""
    ca = FakeCa.make()
    plane = Plane(ca=ca)
    server = Server([plane])
    await server.start("127.0.0.1", 0, ssl=ca.server_context(folder))
    listening: Any = server._server  # grpclib keeps the asyncio server private; the port is all that is read
    port = int(listening.sockets[0].getsockname()[1])
    return Running(plane=plane, server=server, port=port)


async def stop(running: Running) -> None:
    running.server.close()
    await running.server.wait_closed()
