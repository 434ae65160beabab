"""End to end through the real entry point: ``twistd -n prexy`` in a child
process, a real origin on loopback, real sockets."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from .conftest import Cleanups
from .origin import Origin, origin_site
from .test_service import RawClient, connect, held_back
from .twistd_support import TWISTD, Twistd, child_env, free_port, free_port_block, scratch_dir

RULES = b"""
replace_filter 'https://www\\.original-shop\\.example' 'http://clone.test' g;
replace_filter '(UA-)\\d+-\\d+' '${1}99999-9' g;
"""


def write(directory: str, name: str, data: bytes) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


class TestTwistd:
    @pytest.fixture(autouse=True)
    def served(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup
        self.origin = Origin()
        self.origin_port = reactor.listenTCP(0, origin_site(self.origin), interface="127.0.0.1")
        cleanup(self.origin_port.stopListening)
        self.upstream = f"http://127.0.0.1:{self.origin_port.getHost().port}"
        self.dir = scratch_dir("prexy-files-")

    @defer.inlineCallbacks
    def start(self, *args: str, env: dict[str, str] | None = None, port: int | None = None) -> Any:
        port = port or free_port()
        child = Twistd(*args, env=env) if "--demo" in args else Twistd(
            "--listen", f"tcp:{port}:interface=127.0.0.1", *args, env=env
        )
        self.cleanup(child.stop)
        yield child.ready()
        return child, port

    def serve(self, resource: Any) -> str:
        """An extra origin on loopback for ``resource``, its URL."""
        from twisted.web.server import Site

        site = Site(resource)
        site.log = lambda r: None  # type: ignore[method-assign]
        listening = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.cleanup(listening.stopListening)
        return f"http://127.0.0.1:{listening.getHost().port}"

    @defer.inlineCallbacks
    def fetch(self, port: int, path: str, headers: bytes = b"", version: bytes = b"HTTP/1.1") -> Any:
        client = RawClient(
            b"GET " + path.encode() + b" " + version + b"\r\nHost: t\r\nConnection: close\r\n" + headers + b"\r\n"
        )
        yield connect(port, client)
        head, _, body = bytes(client.data).partition(b"\r\n\r\n")
        if b"Transfer-Encoding: chunked" in head:
            out, rest = b"", body
            while rest:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size, 16)
                if n == 0:
                    break
                out, rest = out + rest[:n], rest[n + 2 :]
            body = out
        return head, body

    @pytest_twisted.inlineCallbacks
    def test_rules_rewrite_through_twistd(self) -> Any:
        """--upstream with --rules: the page comes back rewritten."""
        rules = write(self.dir, "site.rules", RULES)
        child, port = yield self.start("--upstream", self.upstream, "--rules", rules)
        head, body = yield self.fetch(port, "/html")
        assert b"http://clone.test/x" in body
        assert b"UA-99999-9" in body
        assert b"original-shop" not in body
        assert b"Server-Timing:" in head
        # The upstream's length is dropped: the rewritten body is chunked.
        assert b"Content-Length" not in head
        assert b"Transfer-Encoding: chunked" in head
        # The small page comes with its head (one write by the origin), so
        # it is rewritten at once, after the head went out: the rewrite's
        # timing is the trailer.  An HTTP/1.0 client has it in the head.
        assert b"Trailer: Server-Timing" in head
        head, body = yield self.fetch(port, "/html", version=b"HTTP/1.0")
        assert head.startswith(b"HTTP/1.0 200")
        assert b"http://clone.test/x" in body
        assert re.search(rb"Server-Timing: [^\r]*rewrite;dur=[\d.]+, rewrite-rules;desc=\"2 matched of 2 run\"", head)

    @pytest_twisted.inlineCallbacks
    def test_sregex_order_rule_through_twistd(self) -> Any:
        """A rule that runs on the sregex-order VM gives the module's bytes
        (conformance TEST 22's trim rule), not Perl's."""
        from twisted.web.static import Data

        page = Data(b"  hello  \nbaby!\n     \nabc\n", "text/html")
        page.isLeaf = True
        upstream = self.serve(page)
        rules = write(self.dir, "trim.rules", b"replace_filter '^\\s+|\\s+$' '[$&]' g;\n")
        child, port = yield self.start("--upstream", upstream, "--rules", rules)
        head, body = yield self.fetch(port, "/")
        assert head.startswith(b"HTTP/1.1 200")
        assert body == b"[  ]hello[  ]\nbaby!\n[     \n]abc[\n]"

    @pytest_twisted.inlineCallbacks
    def test_map_redirect_through_twistd(self) -> Any:
        """--map: an old URL is redirected without touching the origin."""
        map_file = write(self.dir, "old.map", b"/old/page  /new/page;\n~^/item/(\\d+)$  /items/$1;\n")
        child, port = yield self.start("--upstream", self.upstream, "--map", map_file)
        head, _ = yield self.fetch(port, "/item/42")
        assert head.startswith(b"HTTP/1.1 301")
        assert b"Location: http://t/items/42" in head
        assert self.origin.requests == []
        head, body = yield self.fetch(port, "/hello")
        assert body == b"hello world!"

    @pytest_twisted.inlineCallbacks
    def test_demo(self) -> Any:
        """--demo starts its origin and Prexy; the page is rewritten and the
        demo map redirects."""
        base = free_port_block(3)
        child, port = yield self.start("--demo", env={"PREXY_DEMO_PORT": str(base)}, port=base)
        head, body = yield self.fetch(base, "/")
        assert b"UA-99999-9" in body
        assert b"Cloned Shop" in body
        # Links point at the demo's own port, whichever it is.
        assert b"http://127.0.0.1:%d/style.css" % base in body
        head, _ = yield self.fetch(base, "/blog/2024/summer-sale")
        assert b"Location: http://t/news/summer-sale.html" in head
        assert "Prexy demo is running" in child.output()

    @pytest.mark.parametrize(("workers", "signum"), [("0", signal.SIGINT), ("2", signal.SIGTERM)])
    @pytest_twisted.inlineCallbacks
    def test_demo_removes_its_files(self, workers: str, signum: int) -> Any:
        """The demo keeps what it writes (its cache store, the notice
        sockets beside it, its rules for another port) in one directory,
        and removes it when it stops on SIGINT or SIGTERM, in-process or
        with workers; nothing is left where the store used to go."""
        from prexy.cache.paths import default_cache_path
        from prexy.demo import demo_dir

        base = free_port_block(3)
        files = demo_dir(base)
        child, port = yield self.start(
            "--demo", "--workers", workers, env={"PREXY_DEMO_PORT": str(base)}, port=base
        )
        head, _ = yield self.fetch(base, "/")
        assert head.startswith(b"HTTP/1.1 200")
        assert {"cache", "demo.rules"} <= set(os.listdir(files)), child.output()
        child.process.send_signal(signum)
        code = yield child.wait_exit(20)
        assert code in (0, -signum), child.output()  # twistd re-raises the signal it stopped on
        assert not os.path.exists(files), os.listdir(files)
        assert not os.path.exists(os.path.join(default_cache_path(), f"demo-{base}"))

    @pytest_twisted.inlineCallbacks
    def test_gzip_upstream_rewritten(self) -> Any:
        """Compressed answers from an upstream that ignores identity are
        decoded, rewritten and compressed again."""
        rules = write(self.dir, "site.rules", RULES)
        child, port = yield self.start("--upstream", self.upstream, "--rules", rules)
        # The test origin does not compress; use twisted.web's gzip encoder.
        from twisted.web.resource import EncodingResourceWrapper
        from twisted.web.server import GzipEncoderFactory

        upstream = self.serve(EncodingResourceWrapper(Origin(), [GzipEncoderFactory()]))
        child.stop()
        child, port = yield self.start("--upstream", upstream, "--rules", rules)
        head, body = yield self.fetch(port, "/html", b"Accept-Encoding: gzip\r\n")
        # The proxy asked for identity, so twisted's encoder did not
        # compress (and the 147-byte page is under Prexy's min_length):
        assert b"Content-Encoding" not in head
        assert b"UA-99999-9" in body

    @pytest_twisted.inlineCallbacks
    def test_every_upstream_coding_rewritten(self) -> Any:
        """An upstream that compresses whatever it is asked (br, zstd, and
        gzip then br): through twistd the rules apply, an identity client
        gets identity, a gzip client gzip of the same bytes."""
        import gzip

        import brotli
        import zstandard
        from twisted.web import resource as web_resource

        from .origin import HTML

        codings = {
            b"/br": (b"br", brotli.compress(HTML)),
            b"/zstd": (b"zstd", zstandard.ZstdCompressor().compress(HTML)),
            b"/stacked": (b"gzip, br", brotli.compress(gzip.compress(HTML))),
        }

        class Compressing(web_resource.Resource):
            isLeaf = True

            def render_GET(self, request: Any) -> bytes:
                coding, body = codings[request.path]
                request.setHeader(b"content-type", b"text/html")
                request.setHeader(b"content-encoding", coding)
                return body

        rules = write(self.dir, "site.rules", RULES)
        child, port = yield self.start("--upstream", self.serve(Compressing()), "--rules", rules)
        expected = HTML.replace(b"https://www.original-shop.example", b"http://clone.test").replace(
            b"UA-12345-1", b"UA-99999-9"
        )
        for path in ("/br", "/zstd", "/stacked"):
            head, body = yield self.fetch(port, path)
            assert b"Content-Encoding" not in head, (path, head)
            assert body == expected, (path, body)
            head, body = yield self.fetch(port, path, b"Accept-Encoding: gzip\r\n")
            assert b"Content-Encoding: gzip" in head, (path, head)
            assert gzip.decompress(body) == expected, path
        assert "Traceback" not in child.output()

    @pytest_twisted.inlineCallbacks
    def test_answers_compressed_for_the_client(self) -> Any:
        """A rewritten 20 KB page from an identity upstream goes out in the
        coding the client prefers (br, zstd or gzip), with Vary, and decodes
        to exactly what an identity client gets."""
        import gzip

        import brotli
        import zstandard
        from twisted.web import resource as web_resource

        from .origin import HTML

        page = HTML * 140  # about 20 KB

        class Page(web_resource.Resource):
            isLeaf = True

            def render_GET(self, request: Any) -> bytes:
                request.setHeader(b"content-type", b"text/html; charset=utf-8")
                request.setHeader(b"etag", b'"v1"')
                return page

        rules = write(self.dir, "site.rules", RULES)
        child, port = yield self.start("--upstream", self.serve(Page()), "--rules", rules)
        head, identity = yield self.fetch(port, "/page")
        assert b"Content-Encoding" not in head
        assert b"UA-99999-9" in identity and b"UA-12345-1" not in identity
        decoders = {
            b"br": brotli.decompress,
            b"zstd": lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b),
            b"gzip": gzip.decompress,
        }
        for accept, coding in ((b"gzip, deflate, br", b"br"), (b"zstd, gzip;q=0.5", b"zstd"), (b"gzip", b"gzip")):
            head, body = yield self.fetch(port, "/page", b"Accept-Encoding: " + accept + b"\r\n")
            assert b"Content-Encoding: " + coding in head, (accept, head)
            assert re.search(rb"(?i)\r\nvary: [^\r]*accept-encoding", head), head
            assert len(body) < len(identity) / 3
            assert decoders[coding](body) == identity, coding
        assert "Traceback" not in child.output()

    @pytest_twisted.inlineCallbacks
    def test_slow_client_memory_bounded(self) -> Any:
        """A slow client reading a huge rewritten body: the proxy's memory
        stays flat (< 20 MB growth) because the upstream is paused."""
        rules = write(self.dir, "site.rules", RULES)
        child, port = yield self.start("--upstream", self.upstream, "--rules", rules)
        head, _ = yield self.fetch(port, "/hello")  # warm up
        before = child.rss_kib()
        client = RawClient(b"GET /big?mb=1024 HTTP/1.1\r\nHost: t\r\n\r\n", read_limit=1)
        connect(port, client)
        yield client.stopped_reading
        peak = before
        for _ in range(30):
            # The reader stalls until the origin is held back (every buffer
            # on the way full: the proxy's memory at its highest), then
            # takes 1 MB more: a slow reader.
            yield held_back(self.origin, lambda: self.fetch(port, "/hello"))
            peak = max(peak, child.rss_kib())
            yield client.read_more(1024 * 1024)
        received = len(client.data)
        assert received > 30 * 1024 * 1024
        assert self.origin.produced < 200 * 1024 * 1024
        assert peak - before < 20 * 1024, f"RSS grew from {before} to {peak} KiB"
        client.transport.abortConnection()
        yield client.closed


class TestCheck:
    """``--check`` exits 0 or 1 like ``nginx -t``; a broken config does not start."""

    def run_twistd(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "prexy", *args],
            capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir(), env=child_env(),
        )

    def test_check_good_and_bad(self) -> None:
        d = scratch_dir("prexy-check-")
        write(d, "ok.rules", RULES)
        good = write(d, "good.toml", b"[sites.a]\nupstream = 'http://127.0.0.1:1'\nrules = ['ok.rules']\n")
        result = self.run_twistd("--config", good, "--check")
        assert result.returncode == 0, result.stderr
        assert "is ok" in result.stdout

        bad = write(d, "bad.toml", b"[sites.a]\nupstream = 'http://127.0.0.1:1'\n\ntimeout = 3\n")
        result = self.run_twistd("--config", bad, "--check")
        assert result.returncode == 1
        assert f"{bad}:4: sites.a.timeout: unknown key" in result.stderr

        write(d, "broken.rules", b"replace_filter 'a' 'b' gx;\n")
        bad_rules = write(d, "badrules.toml", b"[sites.a]\nupstream = 'http://127.0.0.1:1'\nrules = ['broken.rules']\n")
        result = self.run_twistd("--config", bad_rules, "--check")
        assert result.returncode == 1
        assert os.path.join(d, "broken.rules") + ":1:" in result.stderr

    def _engine_lines(self, rules: bytes) -> tuple[str, list[str]]:
        """``twistd --config --check`` on a site with ``rules`` (accepted):
        the rules file's path and the lines that name a rule's engine."""
        d = scratch_dir("prexy-check-")
        write(d, "site.rules", rules)
        config = write(d, "site.toml", b"[sites.a]\nupstream = 'http://127.0.0.1:1'\nrules = ['site.rules']\n")
        result = self.run_twistd("--config", config, "--check")
        assert result.returncode == 0, result.stderr
        return os.path.join(d, "site.rules"), [x for x in result.stdout.splitlines() if "runs on" in x]

    def test_check_lists_rules_on_the_linear_engine(self) -> None:
        """A pattern ``regex`` cannot bound is accepted, and ``--check``
        names it with its file:line, the engine (RE2) and why."""
        path, lines = self._engine_lines(b"replace_filter 'foo' 'bar' g;\nreplace_filter '(a|aa)*b' 'X' g;\n")
        assert len(lines) == 1, lines
        assert path + ":2: '(a|aa)*b' runs on re2: regex could backtrack" in lines[0]

    def test_check_lists_rules_on_the_sregex_order_vm(self) -> None:
        """``--check`` names a rule whose matches follow sregex's thread
        order, with its file:line, the engine and why."""
        path, lines = self._engine_lines(b"replace_filter 'foo' 'bar' g;\nreplace_filter '^\\s+|\\s+$' '' g;\n")
        assert len(lines) == 2, lines
        # With a flagged rule, the whole (small) rule set is one program.
        assert path + ":1: 'foo' runs on sregex-vm: the rule set runs as one" in lines[0]
        expected = path + ":2: '^\\s+|\\s+$' runs on sregex-vm: sregex's thread order"
        assert expected in lines[1]

    def test_broken_config_refuses_to_start(self) -> None:
        """Without --check, a broken config stops twistd with the reason."""
        d = scratch_dir("prexy-check-")
        bad = write(d, "bad.toml", b"[sites.a]\nupstream = 'gopher://x'\n")
        result = self.run_twistd("--config", bad)
        assert result.returncode != 0
        assert "bad.toml:2: sites.a.upstream" in result.stdout + result.stderr

    def test_port_in_use_refuses_to_start(self) -> None:
        """In-process (--workers 0), a listen port already taken stops twistd
        at start-up with the address and the reason."""
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            result = self.run_twistd(
                "--workers", "0", "--listen", f"tcp:{port}:interface=127.0.0.1", "--upstream", "http://127.0.0.1:1"
            )
        assert result.returncode == 1
        output = result.stdout + result.stderr
        assert f"cannot listen on tcp:{port}:interface=127.0.0.1: Address already in use" in output
        assert "Traceback" not in output
