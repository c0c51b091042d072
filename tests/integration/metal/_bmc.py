"""A real Redfish BMC for tests: the ``sushy-emulator`` from sushy-tools, on loopback, over TLS, with basic auth.

``start_bmc(folder)`` writes everything the emulator needs into ``folder`` (a CA and a server certificate made here
with ``cryptography``, an htpasswd file with a bcrypt hash, a config file, the fake driver's state directory), starts
the emulator's console script as a subprocess on a free port and waits until its service root answers. The fake
driver serves one system whose UUID, name, MAC addresses and disk are chosen at random per start, so a test compares
what the client read against what the emulator was given, not against constants.

Facts about the emulator (sushy-tools 2.2) a test can rely on:

- The fake driver's system is reached as ``/redfish/v1/Systems/<uuid>``; it reports no CPUs, no memory and no
  SimpleStorage (its driver raises "not supported" for them), ``Manufacturer: "Sushy Emulator"``, no serial number.
- A power change lands 1 to 11 seconds after the request (the driver applies it on a later read); a restart reads
  ``Off`` until then.
- ``BootSourceOverrideEnabled`` is always reported as ``Continuous``: the emulator ignores it in a PATCH.
- The service root (``/redfish/v1/``) needs no credentials; everything else does.
- Every request reaches stderr as a werkzeug access-log line (``"GET /redfish/v1/... HTTP/1.1" 200 -``), which
  ``Bmc.log()`` reads back.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import random
import secrets
import socket
import ssl
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO

import attrs
import bcrypt
import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests._timing import deadline

EMULATOR = Path(sys.executable).parent / "sushy-emulator"
STORAGE_ID = "1"
START_TIMEOUT = 30.0


@attrs.frozen
class TestCertificates:
    """A CA and a server certificate it signed for 127.0.0.1 and localhost (PEM), and the server's key file."""

    ca_pem: str
    cert_pem: str
    cert_file: Path
    key_file: Path

    @property
    def pin_sha256(self) -> str:
        """The SHA-256 of the server certificate's DER, as lowercase hex."""
        der = x509.load_pem_x509_certificate(self.cert_pem.encode()).public_bytes(serialization.Encoding.DER)
        return hashlib.sha256(der).hexdigest()


@attrs.frozen
class Bmc:
    """A running emulator and what a client needs to reach it.

    ``macs`` and ``disk_bytes`` are what the emulator was configured with, in its order.
    """

    url: str
    username: str
    password: str
    pin_sha256: str
    ca_pem: str
    system_uuid: str
    system_name: str
    macs: tuple[str, ...]
    disk_bytes: tuple[int, ...]
    proc: subprocess.Popen[bytes]
    log_file: Path

    def log(self) -> str:
        """Everything the emulator has written to stderr so far (its access log among it)."""
        return self.log_file.read_text(errors="replace")

    def stop(self) -> None:
        """End the emulator process (only this one) and wait for it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=deadline(10))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=deadline(10))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at this moment."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def make_certificates(
    folder: Path, *, common_name: str = "bmc.test", names: tuple[str, ...] = ("localhost", "127.0.0.1")
) -> TestCertificates:
    """A fresh CA and a server certificate for ``names`` (DNS names or IP addresses), written to ``folder``."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([_general_name(name) for name in names]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    cert_file = folder / "server.crt"
    key_file = folder / "server.key"
    cert_file.write_text(cert_pem)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return TestCertificates(
        ca_pem=ca_cert.public_bytes(serialization.Encoding.PEM).decode(),
        cert_pem=cert_pem,
        cert_file=cert_file,
        key_file=key_file,
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _random_mac() -> str:
    # A locally administered unicast address (second-lowest bit of the first octet set, lowest clear).
    octets = [0x02 | (random.randrange(256) & 0xFC)] + [random.randrange(256) for _ in range(5)]
    return ":".join(f"{octet:02x}" for octet in octets)


def _write_config(
    folder: Path,
    *,
    port: int,
    certs: TestCertificates,
    auth_file: Path,
    power_state: str,
    system_uuid: str,
    system_name: str,
    macs: tuple[str, ...],
    disk_bytes: tuple[int, ...],
) -> Path:
    """The emulator's configuration file: one fake system with ``macs`` and one drive of ``disk_bytes[0]``."""
    drive_id = secrets.token_hex(8).upper()
    config = {
        "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
        "SUSHY_EMULATOR_LISTEN_PORT": port,
        "SUSHY_EMULATOR_SSL_CERT": str(certs.cert_file),
        "SUSHY_EMULATOR_SSL_KEY": str(certs.key_file),
        "SUSHY_EMULATOR_AUTH_FILE": str(auth_file),
        "SUSHY_EMULATOR_FAKE_DRIVER": True,
        "SUSHY_EMULATOR_STATE_DIR": str(folder / "state"),
        "SUSHY_EMULATOR_FEATURE_SET": "full",
        "SUSHY_EMULATOR_FAKE_SYSTEMS": [
            {
                "uuid": system_uuid,
                "name": system_name,
                "power_state": power_state,
                "external_notifier": False,
                "nics": [{"mac": mac, "ip": f"192.0.2.{index + 10}"} for index, mac in enumerate(macs)],
            }
        ],
        "SUSHY_EMULATOR_STORAGE": {
            system_uuid: [
                {
                    "Id": STORAGE_ID,
                    "Name": "Local Storage Controller",
                    "StorageControllers": [{"MemberId": "0", "Name": "Integrated RAID", "SpeedGbps": 12}],
                    "Drives": [drive_id],
                }
            ]
        },
    }
    # The drives are keyed by (system UUID, storage id), a tuple: the config file is Python, so repr() writes it.
    drives = {
        (system_uuid, STORAGE_ID): [
            {"Id": drive_id, "Name": "Drive 0", "CapacityBytes": disk_bytes[0], "Protocol": "SATA"}
        ]
    }
    config_file = folder / "emulator.conf"
    lines = [f"{name} = {value!r}" for name, value in config.items()]
    lines.append(f"SUSHY_EMULATOR_DRIVES = {drives!r}")
    config_file.write_text("\n".join(lines) + "\n")
    return config_file


def start_bmc(
    folder: Path,
    *,
    username: str = "admin",
    power_state: str = "Off",
    system_uuid: str | None = None,
    macs: tuple[str, ...] | None = None,
) -> Bmc:
    """Start a sushy-tools emulator whose files live in ``folder``; it is answering when this returns.

    ``system_uuid`` and ``macs`` are random unless given (a test that boots a VM gives the VM's).

    Raises:
        RuntimeError: The emulator's console script is missing (sushy-tools is a dev dependency) or it did not
            answer within ``START_TIMEOUT`` seconds (its stderr is in the message).
    """
    if not EMULATOR.exists():
        raise RuntimeError(f"{EMULATOR} is missing: install the dev extra (sushy-tools)")
    folder.mkdir(parents=True, exist_ok=True)
    certs = make_certificates(folder / "tls")
    password = secrets.token_urlsafe(18)
    auth_file = folder / "htpasswd"
    auth_file.write_text(f"{username}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    system_uuid = system_uuid or str(uuid.uuid4())
    system_name = f"node-{system_uuid[:8]}"
    macs = macs or (_random_mac(), _random_mac())
    disk_bytes = (random.randrange(100, 4000) * 10**9,)
    port = free_port()
    config_file = _write_config(
        folder,
        port=port,
        certs=certs,
        auth_file=auth_file,
        power_state=power_state,
        system_uuid=system_uuid,
        system_name=system_name,
        macs=macs,
        disk_bytes=disk_bytes,
    )
    log_file = folder / "emulator.log"
    log: IO[bytes]
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            [str(EMULATOR), "--config", str(config_file)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
        )
    bmc = Bmc(
        url=f"https://127.0.0.1:{port}",
        username=username,
        password=password,
        pin_sha256=certs.pin_sha256,
        ca_pem=certs.ca_pem,
        system_uuid=system_uuid,
        system_name=system_name,
        macs=macs,
        disk_bytes=disk_bytes,
        proc=proc,
        log_file=log_file,
    )
    try:
        _wait_until_answering(bmc)
    except BaseException:
        bmc.stop()
        raise
    return bmc


def _wait_until_answering(bmc: Bmc) -> None:
    context = ssl.create_default_context(cadata=bmc.ca_pem)
    ends = time.monotonic() + deadline(START_TIMEOUT)
    with httpx.Client(verify=context, timeout=deadline(2.0), trust_env=False) as client:
        while True:
            if bmc.proc.poll() is not None:
                raise RuntimeError(f"sushy-emulator exited with {bmc.proc.returncode}:\n{bmc.log()[-4000:]}")
            try:
                if client.get(f"{bmc.url}/redfish/v1/").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > ends:
                raise RuntimeError(f"sushy-emulator did not answer in {START_TIMEOUT} s:\n{bmc.log()[-4000:]}")
            time.sleep(0.1)
