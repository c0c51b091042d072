"""A gateway serving the operator's own certificate (a CA of theirs, not the node CA): ``bcd join`` given a bundle
that holds both CAs joins through it, and ``bcd node`` keeps trusting it after the control plane's answers replaced
the node CA's bundle on disk; a daemon pinned to the node CA alone refuses it at the handshake."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import json
import shlex
import sys
from pathlib import Path

import anyio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bettercompute_gateway import GatewayTls, create_gateway

from .conftest import OPTIONS, Wire
from .test_daemon import fake_inventory, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

BCD = str(Path(sys.executable).parent / "bcd")


def operator_certificate() -> tuple[str, str, str]:
    """A CA of the operator's and a server certificate from it for loopback: (CA PEM, certificate PEM, key PEM)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Operator Root")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gw.operator.example")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return (
        ca.public_bytes(pem).decode(),
        certificate.public_bytes(pem).decode(),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode(),
    )


async def test_bcd_trusts_the_operators_gateway_certificate_it_was_given(gw: Wire, tmp_path: Path) -> None:
    ca_pem, certificate_pem, key_pem = operator_certificate()
    node_ca = await gw.fleet.services.trust_bundle_pem()
    tls = GatewayTls(certificate_pem=certificate_pem, private_key_pem=key_pem, trust_bundle_pem=node_ca)
    gateway = create_gateway(gw.fleet.services, gw.fleet.store, tls, OPTIONS)
    port = await gateway.start("127.0.0.1", 0)
    try:
        for trusted, works in ((node_ca, False), (node_ca + ca_pem, True)):
            token = await gw.fleet.token()
            printed = shlex.split(token.join_command)
            printed[printed.index("--gateway") + 1] = f"127.0.0.1:{port}"
            printed[printed.index("--ca-bundle") + 1] = base64.b64encode(trusted.encode()).decode()
            state = tmp_path / f"bcd-{works}"
            inventory = fake_inventory(tmp_path, f"SN-OP-{works}")
            common = ["--state-dir", str(state), "--fake-inventory", str(inventory)]
            joined = await anyio.run_process([BCD, *common, *printed[1:]], check=False)
            if not works:  # pinned to the node CA alone: the operator's certificate does not verify
                assert joined.returncode == 1 and b"could not be reached: SSLCertVerificationError" in joined.stderr
                assert not (state / "node.json").exists()
                continue
            assert joined.returncode == 0, joined.stderr.decode()
            assert (state / "ca-bundle.pem").read_text() == node_ca  # what the control plane sent
            node_id = json.loads((state / "node.json").read_text())["node_id"]
            daemon = await asyncio.create_subprocess_exec(
                BCD, *common, "node", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            try:

                async def in_session(node_id: str = node_id) -> bool:
                    return node_id in gateway.sessions

                await wait_for(in_session)
            finally:
                daemon.terminate()
                await daemon.wait()
    finally:
        await gateway.close()
