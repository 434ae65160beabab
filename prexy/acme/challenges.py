"""The answers to the CA's challenges, held for the listeners to serve.

HTTP-01 (RFC 8555, 8.3): ``GET /.well-known/acme-challenge/<token>`` on
port 80 answers the key authorization.  TLS-ALPN-01 (RFC 8737): a handshake
for the name offering ALPN ``acme-tls/1`` gets a self-signed certificate
for the name whose critical acmeIdentifier extension carries the SHA-256 of
the key authorization.  The issuer puts the answers in a
:class:`ChallengeRegistry` before it tells the CA to validate and takes them
out once the authorization is settled; the listeners look them up.

The registry keeps the answers in memory, and, when given a directory,
also as files there, so that every worker of the machine (which the CA's
request may reach through the shared port) answers what the one issuing
process registered.  A look-up reads only the one file its token or name
names, and only after the token or name has passed a strict check.

certbot's ``acme`` library (5.x) no longer carries TLS-ALPN-01; the two
classes below add it to the library's own challenge registry so that an
authorization's ``tls-alpn-01`` challenge parses to a typed challenge and
its answer is the library's response object (an empty JSON object).
"""

from __future__ import annotations

import datetime
import hashlib
import re
import threading
from pathlib import Path
from typing import Any

import attrs
import josepy as jose
from acme import challenges
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID, ObjectIdentifier

from prexy.acme.policy import BadName, normalize_name
from prexy.acme.storage import write_atomically

#: The path under which HTTP-01 answers are asked for.
HTTP01_PREFIX = b"/.well-known/acme-challenge/"
#: The ALPN protocol of a TLS-ALPN-01 validation handshake.
ACME_TLS_ALPN = b"acme-tls/1"
#: id-pe-acmeIdentifier (RFC 8737, 6.1).
ACME_IDENTIFIER = ObjectIdentifier("1.3.6.1.5.5.7.1.31")

_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,256}\Z")


@challenges.ChallengeResponse.register
class TLSALPN01Response(challenges.KeyAuthorizationChallengeResponse):
    """The answer posted for a ``tls-alpn-01`` challenge (``{}`` on the wire)."""

    typ = "tls-alpn-01"


@challenges.Challenge.register
class TLSALPN01(challenges.KeyAuthorizationChallenge):
    """A ``tls-alpn-01`` challenge (RFC 8737); its validation is the
    certificate and key to serve for ``acme-tls/1``."""

    response_cls = TLSALPN01Response
    typ = response_cls.typ

    def validation(self, account_key: jose.JWK, **kwargs: Any) -> tuple[bytes, bytes]:
        return tls_alpn01_certificate(kwargs["domain"], self.key_authorization(account_key))


def tls_alpn01_certificate(name: str, key_authorization: str) -> tuple[bytes, bytes]:
    """The self-signed certificate (PEM) and its key (PEM) that answer
    TLS-ALPN-01 for ``name``: the name as its only subject alternative name
    and the critical acmeIdentifier extension, an ASN.1 OCTET STRING of the
    SHA-256 digest of ``key_authorization``."""
    digest = hashlib.sha256(key_authorization.encode("ascii")).digest()
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
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        # DER of OCTET STRING (SIZE (32)): tag 0x04, length 0x20, the digest.
        .add_extension(x509.UnrecognizedExtension(ACME_IDENTIFIER, b"\x04\x20" + digest), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def acme_identifier(certificate: x509.Certificate) -> bytes | None:
    """The digest an acmeIdentifier extension carries, None without one."""
    try:
        ext = certificate.extensions.get_extension_for_oid(ACME_IDENTIFIER)
    except x509.ExtensionNotFound:
        return None
    value = ext.value
    if not isinstance(value, x509.UnrecognizedExtension):
        return None
    data = value.value
    if len(data) != 34 or data[:2] != b"\x04\x20":
        return None
    return data[2:]


@attrs.frozen
class AlpnAnswer:
    """What a TLS-ALPN-01 handshake for a name is served."""

    cert_pem: bytes
    key_pem: bytes = attrs.field(repr=False)


def check_token(token: str | bytes) -> str | None:
    """``token`` when it is a base64url token (the only alphabet RFC 8555
    allows, and one that cannot name a path), None else."""
    if isinstance(token, bytes):
        try:
            token = token.decode("ascii")
        except UnicodeDecodeError:
            return None
    return token if _TOKEN.match(token) else None


class ChallengeRegistry:
    """The answers in force: HTTP-01 by token, TLS-ALPN-01 by name.

    Written by the issuer (from its thread), read by the listeners; a lock
    keeps the two apart.  With ``directory``, every answer is also written
    there (``http-01/<token>``, ``tls-alpn-01/<name>.pem``) and a look-up
    that misses in memory reads that one file, so another process of the
    machine answers too."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self._lock = threading.Lock()
        self._http01: dict[str, str] = {}
        self._alpn: dict[str, AlpnAnswer] = {}
        self.directory = None if directory is None else Path(directory)
        if self.directory is not None:
            for sub in ("http-01", "tls-alpn-01"):
                (self.directory / sub).mkdir(mode=0o700, parents=True, exist_ok=True)

    # -- HTTP-01

    def add_http01(self, token: str, key_authorization: str) -> None:
        checked = check_token(token)
        if checked is None:
            raise ValueError(f"not a base64url token: {token!r}")
        with self._lock:
            self._http01[checked] = key_authorization
        if self.directory is not None:
            write_atomically(self.directory / "http-01" / checked, key_authorization.encode("ascii"), 0o644)

    def remove_http01(self, token: str) -> None:
        with self._lock:
            self._http01.pop(token, None)
        if self.directory is not None and check_token(token):
            (self.directory / "http-01" / token).unlink(missing_ok=True)

    def http01(self, token: str | bytes) -> str | None:
        """The key authorization to answer for ``token``, None when there
        is none (or the token is not one)."""
        checked = check_token(token)
        if checked is None:
            return None
        with self._lock:
            found = self._http01.get(checked)
        if found is not None or self.directory is None:
            return found
        try:
            return (self.directory / "http-01" / checked).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            return None

    # -- TLS-ALPN-01

    def add_tls_alpn01(self, name: str, cert_pem: bytes, key_pem: bytes) -> None:
        checked = normalize_name(name)
        with self._lock:
            self._alpn[checked] = AlpnAnswer(cert_pem, key_pem)
        if self.directory is not None:
            write_atomically(self.directory / "tls-alpn-01" / f"{checked}.pem", key_pem + cert_pem)

    def remove_tls_alpn01(self, name: str) -> None:
        checked = normalize_name(name)
        with self._lock:
            self._alpn.pop(checked, None)
        if self.directory is not None:
            (self.directory / "tls-alpn-01" / f"{checked}.pem").unlink(missing_ok=True)

    def tls_alpn01(self, name: str | bytes) -> AlpnAnswer | None:
        """The certificate to serve a validation handshake for ``name``."""
        try:
            checked = normalize_name(name)
        except BadName:
            return None
        with self._lock:
            found = self._alpn.get(checked)
        if found is not None or self.directory is None:
            return found
        try:
            data = (self.directory / "tls-alpn-01" / f"{checked}.pem").read_bytes()
        except OSError:
            return None
        marker = data.find(b"-----BEGIN CERTIFICATE-----")
        if marker < 0:
            return None
        return AlpnAnswer(data[marker:], data[:marker])

    def __len__(self) -> int:
        with self._lock:
            return len(self._http01) + len(self._alpn)
