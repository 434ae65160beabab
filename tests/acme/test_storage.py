"""Stored certificates and accounts: written whole (temporary file and
rename) with keys readable by the owner alone, read back by name with
their dates, refused with the file and the reason when they cannot serve
the name (key not the certificate's, name not covered, no certificate),
and no name reaching outside the storage directory."""

from __future__ import annotations

import datetime
import os
import stat
from unittest import mock

from twisted.trial.unittest import SynchronousTestCase

from prexy.acme.storage import Account, Storage, StorageError, covers, write_atomically
from tests.acme.certs import cert_pem, make_ca, make_leaf
from tests.cases import tmp_dir

START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


class StorageTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.dir = tmp_dir(self)
        self.storage = Storage(self.dir / "acme")
        self.ca = make_ca()

    def test_round_trip(self) -> None:
        """A saved certificate is read back by name, with the leaf's dates."""
        leaf = make_leaf(self.ca, ["shop.example"], not_before=START, lifetime=datetime.timedelta(days=90))
        chain = leaf.cert_pem + self.ca.cert_pem
        saved = self.storage.save("Shop.Example", leaf.key_pem, chain)
        loaded = self.storage.load("shop.example.")
        self.assertEqual(loaded, saved)
        assert loaded is not None
        self.assertEqual(loaded.name, "shop.example")
        self.assertEqual(loaded.chain_pem, chain)
        self.assertEqual(loaded.key_pem.strip(), leaf.key_pem.strip())
        self.assertEqual(loaded.not_before, START.timestamp())
        self.assertEqual(loaded.not_after, (START + datetime.timedelta(days=90)).timestamp())
        self.assertEqual(loaded.leaf().subject, leaf.cert.subject)

    def test_modes(self) -> None:
        """Key files are 0600, directories 0700, nothing temporary is left."""
        leaf = make_leaf(self.ca, ["shop.example"])
        self.storage.save("shop.example", leaf.key_pem, leaf.cert_pem)
        self.storage.save_account(Account("https://ca.test/dir", b"KEY", "https://ca.test/acct/1"))
        path = self.storage.certificate_path("shop.example")
        self.assertEqual(stat.S_IMODE(path.stat().st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(self.storage.account_path("https://ca.test/dir").stat().st_mode), 0o600)
        for d in (self.storage.root, self.storage.certs, self.storage.accounts, self.storage.locks):
            self.assertEqual(stat.S_IMODE(d.stat().st_mode), 0o700)
        self.assertEqual(sorted(p.name for p in self.storage.certs.iterdir()), ["shop.example.pem"])

    def test_replace(self) -> None:
        """A renewal replaces the stored certificate."""
        first = make_leaf(self.ca, ["shop.example"], not_before=START)
        second = make_leaf(self.ca, ["shop.example"], not_before=START + datetime.timedelta(days=60))
        self.storage.save("shop.example", first.key_pem, first.cert_pem)
        self.storage.save("shop.example", second.key_pem, second.cert_pem)
        loaded = self.storage.load("shop.example")
        assert loaded is not None
        self.assertEqual(loaded.chain_pem, second.cert_pem)

    def test_missing(self) -> None:
        self.assertIsNone(self.storage.load("none.example"))
        self.assertIsNone(self.storage.load_account("https://ca.test/dir"))

    def test_refused(self) -> None:
        """Nothing is stored for a key that is not the certificate's or a
        certificate that does not cover the name."""
        leaf = make_leaf(self.ca, ["shop.example"])
        other = make_leaf(self.ca, ["shop.example"])
        with self.assertRaises(StorageError) as e:
            self.storage.save("shop.example", other.key_pem, leaf.cert_pem)
        self.assertIn("not the certificate's", str(e.exception))
        with self.assertRaises(StorageError) as e:
            self.storage.save("other.example", leaf.key_pem, leaf.cert_pem)
        self.assertIn("does not cover", str(e.exception))
        self.assertRaises(StorageError, self.storage.save, "shop.example", leaf.key_pem, b"junk")
        self.assertRaises(StorageError, self.storage.save, "shop.example", b"junk", leaf.cert_pem)
        self.assertEqual(list(self.storage.certs.iterdir()), [])

    def test_bad_file(self) -> None:
        """A damaged file is an error naming it, not a crash or a None."""
        path = self.storage.certificate_path("shop.example")
        path.write_bytes(b"garbage")
        with self.assertRaises(StorageError) as e:
            self.storage.load("shop.example")
        self.assertIn(str(path), str(e.exception))
        leaf = make_leaf(self.ca, ["shop.example"])
        path.write_bytes(leaf.key_pem[:50] + leaf.cert_pem)
        self.assertRaises(StorageError, self.storage.load, "shop.example")
        self.storage.account_path("https://ca.test/dir").write_bytes(b"{")
        self.assertRaises(StorageError, self.storage.load_account, "https://ca.test/dir")

    def test_no_escape(self) -> None:
        for name in ["../x.example", "a/b.example", "", "x"]:
            self.assertRaises(StorageError, self.storage.load, name)

    def test_accounts_per_directory(self) -> None:
        a = Account("https://ca.test/dir", b"KEY-A", "https://ca.test/acct/1")
        b = Account("https://ca.test/other-dir", b"KEY-B")
        self.storage.save_account(a)
        self.storage.save_account(b)
        self.assertEqual(self.storage.load_account(a.directory), a)
        self.assertEqual(self.storage.load_account(b.directory), b)

    def test_atomic_failure_keeps_old(self) -> None:
        """A write that fails before its rename leaves the old file whole and
        no temporary file."""
        path = self.dir / "f"
        write_atomically(path, b"old")
        with mock.patch("prexy.acme.storage.os.replace", side_effect=OSError(28, "No space left on device")):
            self.assertRaises(OSError, write_atomically, path, b"new")
        self.assertEqual(path.read_bytes(), b"old")
        self.assertEqual(sorted(os.listdir(self.dir)), ["acme", "f"])


class LockTests(SynchronousTestCase):
    """A name's lock excludes every other holder, in this process or
    another (flock on its own open file), and is released on exit."""

    def test_exclusive(self) -> None:
        import fcntl

        storage = Storage(tmp_dir(self))
        path = storage.locks / "shop.example.lock"
        with storage.name_lock("Shop.Example"):
            fd = os.open(path, os.O_RDWR)
            self.addCleanup(os.close, fd)
            self.assertRaises(BlockingIOError, fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        self.assertRaises(StorageError, storage.name_lock("../x").__enter__)

    def test_modified(self) -> None:
        storage = Storage(tmp_dir(self))
        self.assertIsNone(storage.modified("shop.example"))
        leaf = make_leaf(make_ca(), ["shop.example"])
        storage.save("shop.example", leaf.key_pem, leaf.cert_pem)
        self.assertEqual(storage.modified("shop.example"), storage.certificate_path("shop.example").stat().st_mtime)


class CoversTests(SynchronousTestCase):
    def test_covers(self) -> None:
        ca = make_ca()
        cert = make_leaf(ca, ["shop.example", "*.fr.shop.example"]).cert
        self.assertTrue(covers(cert, "shop.example"))
        self.assertTrue(covers(cert, "a.fr.shop.example"))
        self.assertFalse(covers(cert, "a.b.fr.shop.example"))
        self.assertFalse(covers(cert, "fr.shop.example"))
        self.assertFalse(covers(ca.cert, "shop.example"))

    def test_pem_helper(self) -> None:
        self.assertTrue(cert_pem(make_ca().cert).startswith(b"-----BEGIN CERTIFICATE-----"))


