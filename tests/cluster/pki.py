"""Certificates and keys for the local control plane.

Why generate our own: kube-apiserver only serves TLS and authenticates clients by
certificate or token, so a throwaway CA, a serving cert, an admin client cert
(O=system:masters, so RBAC never blocks the harness itself) and a service-account
signing key pair are the minimum. Everything lives in the cluster's state directory
and dies with it. ECDSA P-256 keeps generation instant; the service-account key is
RSA because every Kubernetes version accepts it for token signing.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)
_PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class Pki:
    """Paths of the generated files (all PEM)."""

    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_crt(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def generate(directory: Path) -> Pki:
    """Create a CA, the apiserver serving cert, an admin client cert and SA keys."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("rooftop-local-ca")
    ca_cert = _builder(ca_name, ca_name, ca_key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True
    )
    ca = ca_cert.sign(ca_key, hashes.SHA256())
    _write(pki.ca_crt, pki.ca_key, ca, ca_key)
    _issue_server(pki, ca, ca_key)
    _issue_admin(pki, ca, ca_key)
    _write_sa_keys(pki)
    return pki


def _issue_server(pki: Pki, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey) -> None:
    """Serving cert: SANs cover loopback and the in-cluster service name/IP."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
    ]
    cert = (
        _builder(_name("kube-apiserver"), ca.subject, key.public_key())
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(pki.apiserver_crt, pki.apiserver_key, cert, key)


def _issue_admin(pki: Pki, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey) -> None:
    """Client cert in group system:masters: the harness and components bypass RBAC."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "admin"),
        ]
    )
    cert = (
        _builder(subject, ca.subject, key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(pki.admin_crt, pki.admin_key, cert, key)


def _write_sa_keys(pki: Pki) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pki.sa_key.write_bytes(_key_pem(key))
    pki.sa_key.chmod(0o600)
    pki.sa_pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + _VALIDITY)
    )


def _key_pem(key: _PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(crt: Path, key_path: Path, cert: x509.Certificate, key: _PrivateKey) -> None:
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_key_pem(key))
    key_path.chmod(0o600)
