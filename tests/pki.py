"""A test CA and the certificates it issues, made with ``cryptography``
(EC P-256 keys: fast), for the tests of certificates per site."""

from __future__ import annotations

import datetime
import ipaddress
import os
from typing import Any

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

DAY = datetime.timedelta(days=1)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@attrs.frozen
class Issued:
    """A leaf certificate: its chain (leaf, then the CA's certificate) and key, as PEM."""

    chain_pem: bytes
    key_pem: bytes
    leaf: x509.Certificate

    def write(self, directory: str, stem: str) -> tuple[str, str]:
        """``stem.crt`` and ``stem.key`` in ``directory``; their paths."""
        cert, key = os.path.join(directory, f"{stem}.crt"), os.path.join(directory, f"{stem}.key")
        with open(cert, "wb") as f:
            f.write(self.chain_pem)
        with open(key, "wb") as f:
            f.write(self.key_pem)
        return cert, key


def self_signed(
    name: str, key: Any = None, *, dns: tuple[str, ...] = (), ips: tuple[str, ...] = (), ca: bool = False,
    valid_for: datetime.timedelta = 365 * DAY, backdate: datetime.timedelta = DAY,
) -> tuple[x509.Certificate, Any]:
    """A self-signed certificate for ``name`` (an EC P-256 key unless
    ``key`` is given), with ``dns`` and ``ips`` as subject alternative
    names, a CA's basic constraints when ``ca``; and its key."""
    key = key if key is not None else ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(_now() - backdate).not_valid_after(_now() + valid_for)
    )
    alt = [x509.DNSName(n) for n in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return builder.sign(key, hashes.SHA256()), key


def throwaway_rsa() -> tuple[bytes, rsa.RSAPrivateKey]:
    """A self-signed RSA certificate (PEM) for "default", valid for an hour,
    and its key: what a listener serves when no challenge is asked for (RSA,
    so that an EC answer beside it would show)."""
    cert, key = self_signed(
        "default", rsa.generate_private_key(public_exponent=65537, key_size=2048),
        valid_for=datetime.timedelta(hours=1), backdate=datetime.timedelta(minutes=1),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key


class TestCA:
    """A certification authority for tests."""

    __test__ = False  # (not a pytest class)

    def __init__(self, name: str = "Prexy test CA") -> None:
        self.cert, self.key = self_signed(name, ca=True)
        self.name = self.cert.subject
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, directory: str) -> str:
        path = os.path.join(directory, "ca.pem")
        with open(path, "wb") as f:
            f.write(self.pem)
        return path

    def issue(
        self, *names: str, ips: tuple[str, ...] = (), valid_from: float = -1, valid_to: float = 30,
        common_name: str | None = None,
    ) -> Issued:
        """A leaf for DNS ``names`` and ``ips``, valid from ``valid_from`` to
        ``valid_to`` days from now."""
        key = ec.generate_private_key(ec.SECP256R1())
        cn = common_name or (names[0] if names else "no name")
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self.name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(_now() + valid_from * DAY).not_valid_after(_now() + valid_to * DAY)
        )
        alt = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        leaf = builder.sign(self.key, hashes.SHA256())
        return Issued(leaf.public_bytes(serialization.Encoding.PEM) + self.pem, key_pem(key), leaf)
