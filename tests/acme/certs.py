"""Small certificates for the ACME tests: a CA and leaves it signs, on EC
P-256 keys (fast to make)."""

from __future__ import annotations

import datetime

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.pki import key_pem, self_signed, throwaway_rsa

__all__ = ["Issued", "cert_pem", "key_pem", "make_ca", "make_leaf", "throwaway_rsa"]


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
    cert, key = self_signed(name, ca=True, valid_for=datetime.timedelta(days=3650))
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

