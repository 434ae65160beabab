"""Small certificates for the ACME tests: a CA and leaves it signs, on EC
P-256 keys (fast to make)."""

from __future__ import annotations

import datetime

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@attrs.frozen
class Issued:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def key_pem(self) -> bytes:
        return key_pem(self.key)

    @property
    def cert_pem(self) -> bytes:
        return cert_pem(self.cert)


def make_ca(name: str = "Test CA") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(key, cert)


def make_leaf(
    ca: Issued,
    names: list[str],
    *,
    not_before: datetime.datetime | None = None,
    lifetime: datetime.timedelta = datetime.timedelta(days=90),
    ips: list[x509.IPAddress] | None = None,
) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += ips or []
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0] if names else "ip")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + lifetime)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(key, cert)


def throwaway_rsa() -> tuple[bytes, rsa.RSAPrivateKey]:
    """A self-signed RSA certificate (PEM) for "default", valid for an hour,
    and its key: what a listener serves when no challenge is asked for (RSA,
    so that an EC answer beside it would show)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "default")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), key
