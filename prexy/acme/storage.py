"""Certificates and the ACME account key, stored once per machine.

A directory (``[acme] storage``) holds::

    accounts/<host>-<digest>.json   one per CA directory URL: its URL, the
                                    account key (PEM) and the account's URL
    certs/<name>.pem                one per name: the private key, then the
                                    certificate chain (leaf first), PEM
    locks/<name>.lock               held (flock) by the process ordering
                                    the name, so one process of the machine
                                    orders it at a time

Each file is written whole to a temporary file beside it and renamed over
the old one, so a reader (any worker, any time) sees the old file or the
new one, never half of one; every file holds a private key and is mode
0600, the directories 0700.  A certificate is read by its name when it is
asked for, never by scanning the directory, so start-up costs nothing per
stored certificate.  Nothing here runs on the reactor's behalf: callers
read at a handshake (one small file) and write from the issuer's thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from prexy.acme.policy import BadName, normalize_name


class StorageError(Exception):
    """A stored file that cannot be used, or a certificate refused for
    storage; the message names the file or the name and says why."""


def covers(certificate: x509.Certificate, name: str) -> bool:
    """True when ``certificate``'s subject alternative names cover ``name``
    (exactly, or by a wildcard of one label)."""
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    for entry in san.get_values_for_type(x509.DNSName):
        pattern = entry.lower().rstrip(".")
        if pattern == name:
            return True
        if pattern.startswith("*.") and name.partition(".")[2] == pattern[2:]:
            return True
    return False


def _public_bytes(key: PrivateKeyTypes | x509.Certificate) -> bytes:
    public = key.public_key()
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


@attrs.frozen
class StoredCertificate:
    """A certificate chain with its key, as stored for ``name``.

    ``not_before`` and ``not_after`` are POSIX seconds, from the leaf."""

    name: str
    key_pem: bytes = attrs.field(repr=False)
    chain_pem: bytes
    not_before: float
    not_after: float

    @classmethod
    def parse(cls, name: str, key_pem: bytes, chain_pem: bytes) -> StoredCertificate:
        """Check and parse: the chain has a leaf, the key is the leaf's and
        the leaf covers ``name``.  Raises :class:`StorageError`."""
        try:
            chain = x509.load_pem_x509_certificates(chain_pem)
        except ValueError as e:
            raise StorageError(f"{name}: no PEM certificate ({e})") from None
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as e:
            raise StorageError(f"{name}: no unencrypted PEM private key ({e})") from None
        leaf = chain[0]
        if _public_bytes(key) != _public_bytes(leaf):
            raise StorageError(f"{name}: the private key is not the certificate's")
        if not covers(leaf, name):
            raise StorageError(f"{name}: the certificate does not cover the name")
        return cls(
            name=name,
            key_pem=key_pem,
            chain_pem=chain_pem,
            not_before=leaf.not_valid_before_utc.timestamp(),
            not_after=leaf.not_valid_after_utc.timestamp(),
        )

    def leaf(self) -> x509.Certificate:
        return x509.load_pem_x509_certificates(self.chain_pem)[0]


@attrs.frozen
class Account:
    """An ACME account at one CA: its key (PEM) and, once registered, its URL."""

    directory: str
    key_pem: bytes = attrs.field(repr=False)
    uri: str | None = None


def write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` at once: written and synced to a
    temporary file of mode ``mode`` in the same directory, then renamed."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class Storage:
    """The storage directory at ``root`` (made, mode 0700, when missing)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.certs = self.root / "certs"
        self.accounts = self.root / "accounts"
        self.locks = self.root / "locks"
        for d in (self.root, self.certs, self.accounts, self.locks):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)

    # -- certificates

    def certificate_path(self, name: str) -> Path:
        """The file of ``name``'s certificate (the name is normalised first,
        so no name reaches outside ``certs/``; :class:`StorageError` else)."""
        try:
            return self.certs / f"{normalize_name(name)}.pem"
        except BadName as e:
            raise StorageError(str(e)) from None

    def load(self, name: str) -> StoredCertificate | None:
        """The stored certificate of ``name``, None when there is none.
        Raises :class:`StorageError` for a file that cannot be used."""
        path = self.certificate_path(name)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StorageError(f"{path}: {e.strerror}") from None
        marker = data.find(b"-----BEGIN CERTIFICATE-----")
        if marker < 0:
            raise StorageError(f"{path}: no certificate")
        try:
            return StoredCertificate.parse(normalize_name(name), data[:marker], data[marker:])
        except StorageError as e:
            raise StorageError(f"{path}: {e}") from None

    def save(self, name: str, key_pem: bytes, chain_pem: bytes) -> StoredCertificate:
        """Check (see :meth:`StoredCertificate.parse`) and store ``name``'s
        certificate, replacing the one before."""
        path = self.certificate_path(name)
        stored = StoredCertificate.parse(normalize_name(name), key_pem, chain_pem)
        key = key_pem if key_pem.endswith(b"\n") else key_pem + b"\n"
        write_atomically(path, key + chain_pem)
        return stored

    def modified(self, name: str) -> float | None:
        """When ``name``'s certificate file was last written (POSIX
        seconds), None when there is none."""
        try:
            return self.certificate_path(name).stat().st_mtime
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def name_lock(self, name: str) -> Iterator[None]:
        """Hold ``name``'s lock (an flock, so it is released when its holder
        dies): blocks while another process or thread holds it."""
        path = self.locks / self.certificate_path(name).with_suffix(".lock").name
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- accounts

    def account_path(self, directory: str) -> Path:
        host = urlsplit(directory).hostname or "ca"
        safe = "".join(c if c.isalnum() or c in ".-" else "_" for c in host)
        digest = hashlib.sha256(directory.encode("utf-8")).hexdigest()[:16]
        return self.accounts / f"{safe}-{digest}.json"

    def load_account(self, directory: str) -> Account | None:
        """The account stored for the CA at ``directory``, None when none is."""
        path = self.account_path(directory)
        try:
            data = json.loads(path.read_bytes())
            return Account(directory=data["directory"], key_pem=data["key"].encode("ascii"), uri=data.get("uri"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise StorageError(f"{path}: not an account file ({e})") from None

    def save_account(self, account: Account) -> None:
        data = {"directory": account.directory, "key": account.key_pem.decode("ascii"), "uri": account.uri}
        write_atomically(self.account_path(account.directory), json.dumps(data, indent=1).encode("utf-8") + b"\n")
