"""A listener's certificates as values: a PEM certificate chain with its
private key, checked at load time.

:func:`load_certificate` turns the bytes of a certificate file (the leaf
first, then its chain) and a key file into a :class:`Certificate`, or
raises :class:`CertificateError` saying which file is wrong and why (not
PEM, key not matching the certificate).  :meth:`Certificate.problem` says
whether it can serve a site's hosts at a given time: valid then, and
covering every host (subjectAltName, wildcards by RFC 6125).

Pure: ``cryptography`` only, no Twisted, no OpenSSL connections (the
listener's contexts are made from these values by :mod:`prexy.sni`).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress

import attrs


class CertificateError(ValueError):
    """A certificate or key that does not load: ``which`` is
    ``"certificate"`` or ``"key"``, ``reason`` why."""

    def __init__(self, which: str, reason: str) -> None:
        super().__init__(reason)
        self.which = which
        self.reason = reason


@attrs.frozen
class Certificate:
    """A certificate chain and its key, as PEM bytes, with what the checks
    need (read once).  Equal when the bytes are."""

    #: The certificate file: the leaf first, then the chain.
    chain_pem: bytes = attrs.field(repr=False)
    key_pem: bytes = attrs.field(repr=False)
    #: The leaf's DNS names (lower-case) and IP addresses (subjectAltName).
    dns_names: tuple[str, ...] = attrs.field(eq=False)
    ip_addresses: tuple[str, ...] = attrs.field(eq=False, default=())
    #: Validity of the leaf, seconds since the epoch.
    not_before: float = attrs.field(eq=False, default=0.0)
    not_after: float = attrs.field(eq=False, default=0.0)
    #: The leaf's subject, for messages.
    subject: str = attrs.field(eq=False, default="")

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the leaf's PEM block and the key, short: what logs name."""
        return hashlib.sha256(self.chain_pem + self.key_pem).hexdigest()[:16]

    def covers(self, host: str) -> bool:
        """Whether a client checking ``host`` (lower-case) would accept this
        certificate (RFC 6125 6.4: subjectAltName only, a wildcard only as
        the whole left-most label and for one label; a wildcard host is
        covered by the same wildcard only)."""
        return covers(self.dns_names, self.ip_addresses, host)

    def problem(self, hosts: tuple[str, ...], now: float) -> str | None:
        """Why this certificate cannot serve ``hosts`` at ``now``, or None."""
        if now < self.not_before:
            return f"certificate is not valid before {_when(self.not_before)} ({self.subject})"
        if now >= self.not_after:
            return f"certificate expired on {_when(self.not_after)} ({self.subject})"
        missing = [h for h in hosts if not self.covers(h)]
        if missing:
            names = ", ".join([*self.dns_names, *self.ip_addresses]) or "none"
            return f"certificate does not cover host {missing[0]!r} (its subjectAltName: {names})"
        return None


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def covers(dns_names: tuple[str, ...], ip_addresses: tuple[str, ...], host: str) -> bool:
    """See :meth:`Certificate.covers`."""
    address = _ip(host)
    if address is not None:
        return address in ip_addresses
    for name in dns_names:
        if name == host:
            return True
        if name.startswith("*.") and not host.startswith("*."):
            head, dot, rest = host.partition(".")
            if dot and head and rest == name[2:]:
                return True
    return False


def _ip(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def load_certificate(chain_pem: bytes, key_pem: bytes) -> Certificate:
    """The certificate of these files' bytes; :class:`CertificateError` when
    the chain or the key is not PEM, or the key is not the leaf's."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_private_key,
    )

    try:
        chain = x509.load_pem_x509_certificates(chain_pem)
    except ValueError as exc:
        raise CertificateError("certificate", f"not a PEM certificate: {exc}") from None
    try:
        # Without cryptography's RSA consistency check (tens of ms a key,
        # minutes for thousands of sites): the key is still checked to be
        # the certificate's below, by its public half.
        key = load_pem_private_key(key_pem, None, unsafe_skip_rsa_key_validation=True)
    except (ValueError, TypeError) as exc:
        raise CertificateError("key", f"not a PEM private key (unencrypted): {exc}") from None
    leaf = chain[0]

    def spki(public: object) -> bytes:
        return public.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)  # type: ignore[attr-defined]

    try:
        matches = spki(leaf.public_key()) == spki(key.public_key())
    except (ValueError, TypeError, AttributeError):
        matches = False
    if not matches:
        raise CertificateError("key", f"the key does not match the certificate ({leaf.subject.rfc4514_string()})")
    dns: list[str] = []
    ips: list[str] = []
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        pass
    else:
        dns = [name.lower().rstrip(".") for name in san.get_values_for_type(x509.DNSName)]
        ips = [str(address) for address in san.get_values_for_type(x509.IPAddress)]
    return Certificate(
        chain_pem, key_pem, tuple(dns), tuple(ips),
        leaf.not_valid_before_utc.timestamp(), leaf.not_valid_after_utc.timestamp(),
        leaf.subject.rfc4514_string(),
    )
