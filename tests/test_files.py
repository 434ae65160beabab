"""``prexy.files``: a configuration loaded through a ``Recorder`` gives a
``Snapshot`` of the files its runtime is built from; handed to a worker
with the parsed configuration (``prexy.handoff``), the same configuration
serves again, byte for byte, with the disk changed, broken or gone; what a
load skipped reading (maps reused by their bytes) is in it too."""

from __future__ import annotations

import os
import shutil
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from prexy.config import ConfigError
from prexy.files import DiskFiles, FileStatus, IFiles, NotInSnapshot, Recorder, Snapshot
from prexy.service import ConfigLoader, Options


def write(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def worker_load(validated: Any) -> Any:
    """What a worker does: the configuration handed to it, parsed
    (``prexy.handoff``, through its bytes), and its runtime built from the
    files' bytes handed with it."""
    from types import SimpleNamespace

    from prexy import handoff
    from prexy.worker import build

    handed = handoff.decode(handoff.encode(handoff.Handoff(validated.config, validated.snapshot)))
    runtime, tls = build(handed)
    return SimpleNamespace(config=handed.config, runtime=runtime, tls=tls)


class _CountingDisk(DiskFiles):
    """The disk, noting which files were read."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def read(self, path: str) -> bytes:
        self.reads.append(path)
        return super().read(path)


class InterfaceTests(SynchronousTestCase):
    def test_all_provide_ifiles(self) -> None:
        """The disk, the recorder and a snapshot are the same seam."""
        for files in (DiskFiles(), Recorder(), Snapshot({})):
            assert verifyObject(IFiles, files)


class SnapshotTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.tmp = os.path.abspath(self.mktemp())
        self.main = write(f"{self.tmp}/prexy.toml", 'include = "sites.d/*.toml"\n[server]\nlisten = ["tcp:0"]\n')
        for name in ("a", "b"):
            write(f"{self.tmp}/{name}.rules", f"replace_filter 'x' '{name}' g;\n")
            write(f"{self.tmp}/sites.d/{name}.toml",
                  f'[sites.{name}]\nhosts = ["{name}.test"]\nupstream = "http://{name}.origin"\n'
                  f'rules = "../{name}.rules"\nmap = "../{name}.map"\n')
            write(f"{self.tmp}/{name}.map", f"/old-{name} /new-{name};\ninclude more/*.map;\n")
        write(f"{self.tmp}/more/x.map", "/old-x /new-x;\n")
        self.argv = ["--config", self.main]

    def served(self, options: Options, host: bytes) -> tuple[Any, Any]:
        """What a site serves with: its rules' digest and its map's answer."""
        site = options.runtime.select(host)
        return site.rules.digest, site.urlmap.lookup("/old-x")

    def test_the_same_configuration_loads_without_the_disk(self) -> None:
        """Encoded and decoded, the snapshot of a validated load gives an
        equal configuration and the same rules and maps, after every file
        on disk is gone."""
        loader = ConfigLoader()
        validated = loader(self.argv)
        snapshot = Snapshot.decode(validated.snapshot.encode())
        assert snapshot == validated.snapshot
        master = loader.runtime
        shutil.rmtree(self.tmp)
        worker = worker_load(validated)
        assert worker.config == validated.config
        for host in (b"a.test", b"b.test"):
            site = master.select(host)
            assert self.served(worker, host) == (site.rules.digest, site.urlmap.lookup("/old-x"))
        assert worker.runtime.select(b"a.test").urlmap.lookup("/old-a") == "/new-a"

    def test_files_changed_after_the_check_are_not_seen(self) -> None:
        """Rules, maps and site files changed (or broken) after the master's
        load: a worker loading from its snapshot serves what was checked."""
        validated = ConfigLoader()(self.argv)
        write(f"{self.tmp}/a.rules", "replace_filter 'x' 'y' gx;\n")  # broken
        write(f"{self.tmp}/more/x.map", "/old-x /elsewhere;\n")
        write(f"{self.tmp}/sites.d/b.toml", '[sites.b]\nupstream = "ftp://b"\n')  # broken
        write(f"{self.tmp}/sites.d/c.toml", '[sites.c]\nupstream = "http://c"\n')  # new
        worker = worker_load(validated)
        assert worker.config == validated.config
        assert self.served(worker, b"a.test")[1] == "/new-x"
        self.assertRaises(SystemExit, ConfigLoader(), self.argv)  # (the disk no longer loads)

    def test_a_relative_config_path_reloads_in_a_worker(self) -> None:
        """``--config prexy.toml`` given relative to the working directory:
        the configuration handed to a worker names its ``source`` by its
        absolute path, and a reload's handoff carries the changed rules."""
        self.addCleanup(os.chdir, os.getcwd())
        os.chdir(self.tmp)
        argv = ["--config", "prexy.toml"]
        loader = ConfigLoader()
        worker = worker_load(loader(argv))
        assert worker.config.source == os.path.join(self.tmp, "prexy.toml")
        write(f"{self.tmp}/a.rules", "replace_filter 'x' 'changed' g;\n")
        reloaded = worker_load(loader(argv))
        assert reloaded.runtime.select(b"a.test").rules.digest != worker.runtime.select(b"a.test").rules.digest

    def test_what_a_reload_did_not_read_is_in_its_snapshot(self) -> None:
        """A second load with the same loader skips unchanged site files
        (``ConfigMemo``) and reuses the maps whose bytes did not change: its
        snapshot still holds the bytes of every rules and map file, enough
        for a fresh worker to build its runtime with the disk gone; the main
        file and the site files are not in it (the workers are handed them
        parsed)."""
        disk = _CountingDisk()
        loader = ConfigLoader(files=Recorder(disk))
        loader(self.argv)
        write(f"{self.tmp}/b.rules", "replace_filter 'x' 'B' g;\n")
        disk.reads.clear()
        validated = loader(self.argv)
        assert f"{self.tmp}/sites.d/a.toml" not in disk.reads  # (maps are compared by content: read)
        snapshot = validated.snapshot
        for name in ("a.rules", "b.rules", "a.map", "more/x.map"):
            assert f"{self.tmp}/{name}" in snapshot.contents, name
        for name in ("prexy.toml", "sites.d/a.toml", "sites.d/b.toml"):
            assert f"{self.tmp}/{name}" not in snapshot.contents, name
        shutil.rmtree(self.tmp)
        worker = worker_load(validated)
        assert worker.config == validated.config
        assert worker.runtime.select(b"b.test").rules.digest == loader.runtime.select(b"b.test").rules.digest

    def test_a_refused_load_does_not_leak_into_the_next(self) -> None:
        """A load refused (broken site file), then one that succeeds with that
        file fixed: the snapshot holds the fixed bytes, and a worker loads."""
        loader = ConfigLoader()
        loader(self.argv)
        write(f"{self.tmp}/sites.d/b.toml", '[sites.b]\nupstream = "ftp://b"\n')
        self.assertRaises(SystemExit, loader, self.argv)
        fixed = '[sites.b]\nhosts = ["b.test"]\nupstream = "http://b2.origin"\n'
        write(f"{self.tmp}/sites.d/b.toml", fixed)
        validated = loader(self.argv)
        assert str(validated.config.site("b").upstream) == "http://b2.origin"
        shutil.rmtree(self.tmp)
        worker = worker_load(validated)
        assert str(worker.config.site("b").upstream) == "http://b2.origin"

    def test_a_file_missing_from_the_snapshot_is_a_clear_error(self) -> None:
        """A snapshot that lacks a file the configuration names refuses the
        load, naming the file, rather than reading the disk."""
        from prexy.handoff import Handoff
        from prexy.worker import build

        validated = ConfigLoader()(self.argv)
        contents = dict(validated.snapshot.contents)
        del contents[f"{self.tmp}/a.rules"]
        with self.assertRaises(ConfigError) as caught:
            build(Handoff(validated.config, Snapshot(contents)))
        assert f"{self.tmp}/a.rules" in str(caught.exception)
        with self.assertRaises(NotInSnapshot) as missing:
            Snapshot(contents).read(f"{self.tmp}/a.rules")
        assert "not in the configuration the master validated" in str(missing.exception)

    def test_single_site_command_line(self) -> None:
        """``--upstream --rules --map``: the rules and map come from the snapshot."""
        argv = ["--listen", "tcp:0", "--upstream", "http://o", "--rules", f"{self.tmp}/a.rules",
                "--map", f"{self.tmp}/a.map"]
        validated = ConfigLoader()(argv)
        shutil.rmtree(self.tmp)
        worker = worker_load(validated)
        assert worker.config == validated.config
        assert worker.runtime.default.urlmap.lookup("/old-a") == "/new-a"


def ca_pem() -> bytes:
    """A self-signed CA certificate, PEM."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return ca.public_bytes(serialization.Encoding.PEM)


class UpstreamCATests(SynchronousTestCase):
    """A site's ``upstream_ca`` is read with the rest: checked by the
    master, in the snapshot, and trusted from the bytes validated."""

    def setUp(self) -> None:
        self.tmp = os.path.abspath(self.mktemp())
        self.pem = ca_pem()
        self.ca = f"{self.tmp}/ca.pem"
        os.makedirs(self.tmp)
        with open(self.ca, "wb") as f:
            f.write(self.pem)
        self.main = write(f"{self.tmp}/prexy.toml",
                          '[sites.a]\nupstream = "https://origin.test"\nupstream_ca = "ca.pem"\n')
        self.argv = ["--config", self.main]

    def test_the_validated_ca_is_trusted(self) -> None:
        validated = ConfigLoader()(self.argv)
        with open(self.ca, "wb") as f:
            f.write(b"garbage")
        worker = worker_load(validated)
        assert worker.runtime.default.origin_key.ca_pem == self.pem
        assert worker.runtime.default.origin_key.ca_file == self.ca

    def test_a_file_that_is_no_ca_is_refused(self) -> None:
        with open(self.ca, "wb") as f:
            f.write(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
        with self.assertRaises(SystemExit) as caught:
            ConfigLoader()(self.argv)
        assert str(caught.exception).startswith(f"{self.ca}: not PEM CA certificates")


class ListenerTLSTests(SynchronousTestCase):
    """The ssl: listeners' key and certificate are read with the rest:
    checked by the master, in the snapshot, adopted from those bytes."""

    def setUp(self) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        self.tmp = os.path.abspath(self.mktemp())
        os.makedirs(self.tmp)
        key = ec.generate_private_key(ec.SECP256R1())
        self.key = write(f"{self.tmp}/key.pem", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode())
        self.cert = write(f"{self.tmp}/cert.pem", ca_pem().decode())
        self.argv = ["--listen", f"ssl:0:privateKey={self.key}:certKey={self.cert}", "--upstream", "http://o"]

    def test_in_the_snapshot(self) -> None:
        loader = ConfigLoader()
        validated = loader(self.argv)
        assert set(validated.tls) == {self.key, self.cert}
        shutil.rmtree(self.tmp)
        assert worker_load(validated).tls == validated.tls

    def test_garbage_is_refused(self) -> None:
        write(self.cert, "garbage\n")
        with self.assertRaises(SystemExit) as caught:
            ConfigLoader()(self.argv)
        assert str(caught.exception).startswith(f"{self.cert}: not a PEM certificate")


_paths = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20).map(lambda s: "/" + s)


class EncodingTests(SynchronousTestCase):
    @settings(max_examples=100, deadline=None)
    @given(
        st.dictionaries(_paths, st.binary(max_size=50), max_size=5),
        st.dictionaries(_paths, st.none() | st.builds(FileStatus, *[st.integers(0, 2**63)] * 5), max_size=3),
        st.dictionaries(_paths, st.booleans(), max_size=3),
        st.dictionaries(_paths, st.lists(_paths, max_size=3), max_size=3),
        st.dictionaries(_paths, st.none() | st.lists(_paths, max_size=3), max_size=3),
    )
    def test_round_trip(self, contents: Any, status: Any, is_file: Any, globs: Any, dirs: Any) -> None:
        """Any snapshot decodes to an equal one (binary contents, newlines,
        non-ASCII names); cut short or followed by more bytes, it is refused."""
        snapshot = Snapshot(contents, status, is_file, globs, dirs)
        data = snapshot.encode()
        assert Snapshot.decode(data) == snapshot
        self.assertRaises(ValueError, Snapshot.decode, data + b"x")
        if any(contents.values()):
            self.assertRaises(ValueError, Snapshot.decode, data[:-1])

    def test_listings_replayed(self) -> None:
        """A directory listing is answered as recorded; a file is not a
        directory; a path the load never asked about is not in it."""
        snapshot = Snapshot({"/d/a.map": b"x"}, dirs={"/d": ["a.map"]})
        assert snapshot.listdir("/d") == ["a.map"]
        self.assertRaises(NotADirectoryError, snapshot.listdir, "/d/a.map")
        self.assertRaises(NotInSnapshot, snapshot.listdir, "/e")

    def test_not_a_snapshot(self) -> None:
        for data in (b"", b"no index", b"[1]\n", b'{"files": 3}\n'):
            self.assertRaises(ValueError, Snapshot.decode, data)

    def test_encoded_once(self) -> None:
        """Encoding is done once per snapshot, however many workers get it."""
        snapshot = Snapshot({"/a": b"x"})
        assert snapshot.encode() is snapshot.encode()
