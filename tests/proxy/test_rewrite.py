"""Substitution inside the proxy: which responses are rewritten, what
happens to their headers, and that the body streams through the transducer."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy import exchange
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.exchange import BodyPipeline, derived_etag
from prexy.proxy import forward, rewriting
from prexy.substitution import parse_rules

from .support import Harness, header, parse_response, site_runtime
from .test_proxy import request_head

RULES = b"""
replace_filter 'www\\.origin\\.example' 'www.clone.example' g;
replace_filter '(UA-)\\d+-\\d+' '${1}99999-9' g;
replace_filter_types text/html text/css;
"""
PAGE = b"<a href='https://www.origin.example/x'>x</a><script>ga('UA-123-4')</script>"
REWRITTEN = b"<a href='https://www.clone.example/x'>x</a><script>ga('UA-99999-9')</script>"


def harness(rules: bytes = RULES) -> Harness:
    config = Config(
        listen=("tcp:0",),
        sites=(SiteConfig("s", UpstreamURL.parse("http://origin.test")),),
        default_site="s",
    )
    return Harness(config, site_runtime(config, s={"rules": parse_rules(rules, "test.rules")}))


def respond(h: Harness, head: bytes, body: bytes, request: bytes = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", pieces: int = 1):
    _, client = h.send(request)
    conn = h.conns[-1]
    sent = conn.sent()
    conn.reply(head + b"\r\n")
    step = max(1, len(body) // pieces)
    for i in range(0, len(body), step):
        conn.reply(body[i : i + step])
    h.settle()
    return sent, client


class RewriteTests(SynchronousTestCase):
    def test_html_is_rewritten_and_chunked(self) -> None:
        """A matching text/html body is rewritten even when it arrives split in
        single bytes; Content-Length is dropped for chunked framing, and the
        trailer reports the substitution time."""
        h = harness()
        _, client = respond(
            h,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n" % len(PAGE),
            PAGE,
            pieces=len(PAGE),
        )
        raw = client.value()
        status, headers, body = parse_response(raw)
        self.assertEqual((status, body), (200, REWRITTEN))
        self.assertEqual(header(headers, b"content-length"), [])
        self.assertEqual(header(headers, b"transfer-encoding"), [b"chunked"])
        self.assertEqual(header(headers, b"trailer"), [b"Server-Timing"])
        self.assertRegex(
            raw, rb'0\r\nServer-Timing: rewrite;dur=[\d.]+, rewrite-rules;desc="2 matched of 2 run"\r\n\r\n$'
        )
        self.assertEqual(h.pool.idle_connections(), 1)

    def test_identity_encoding_requested(self) -> None:
        """A rewriting site asks upstream for an uncompressed body."""
        h = harness()
        sent, _ = respond(
            h, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", b"",
            request=b"GET / HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip, br\r\n\r\n",
        )
        _, headers = request_head(sent)
        self.assertEqual(headers[b"accept-encoding"], [b"identity"])

    def test_other_types_pass_with_length(self) -> None:
        """An image is not rewritten and keeps its Content-Length."""
        h = harness()
        body = b"www.origin.example UA-1-2"
        _, client = respond(h, b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: %d\r\n" % len(body), body)
        status, headers, out = parse_response(client.value())
        self.assertEqual(out, body)
        self.assertEqual(header(headers, b"content-length"), [b"%d" % len(body)])

    def test_validators(self) -> None:
        """Last-Modified is cleared, a strong ETag becomes a derived one that
        carries the rule set's hash, and a conditional request with it is sent
        upstream with the upstream's own tag (so a 304 can come back)."""
        h = harness()
        ruleset = h.runtime.default.rules
        _, client = respond(
            h,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nETag: \"abc\"\r\n"
            b"Last-Modified: Mon, 30 Nov 2026 00:00:00 GMT\r\nContent-Length: %d\r\n" % len(PAGE),
            PAGE,
        )
        _, headers, _ = parse_response(client.value())
        derived = derived_etag(b'"abc"', ruleset.digest)
        self.assertEqual(header(headers, b"etag"), [derived])
        self.assertNotEqual(derived, b'"abc"')
        self.assertEqual(header(headers, b"last-modified"), [])
        sent, client = respond(
            h, b"HTTP/1.1 304 Not Modified\r\nETag: \"abc\"\r\n", b"",
            request=b"GET / HTTP/1.1\r\nHost: x\r\nIf-None-Match: " + derived + b', "other"\r\n\r\n',
        )
        _, req_headers = request_head(sent)
        self.assertEqual(req_headers[b"if-none-match"], [b'"abc", "other"'])
        status, headers, _ = parse_response(client.value())
        self.assertEqual(status, 304)

    def test_keep_last_modified(self) -> None:
        """replace_filter_last_modified keep keeps Last-Modified."""
        h = harness(RULES + b"replace_filter_last_modified keep;\n")
        _, client = respond(
            h,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nLast-Modified: Mon, 30 Nov 2026 00:00:00 GMT\r\n"
            b"Content-Length: %d\r\n" % len(PAGE),
            PAGE,
        )
        _, headers, _ = parse_response(client.value())
        self.assertEqual(header(headers, b"last-modified"), [b"Mon, 30 Nov 2026 00:00:00 GMT"])

    def test_head_gets_the_get_head(self) -> None:
        """HEAD of a rewritable page shows no Content-Length (a GET's body
        length would differ) and the derived ETag."""
        h = harness()
        _, client = respond(
            h, b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nETag: \"abc\"\r\nContent-Length: 500\r\n", b"",
            request=b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        raw = client.value()
        self.assertNotIn(b"Content-Length", raw)
        self.assertIn(b"-px", raw)
        self.assertTrue(raw.endswith(b"\r\n\r\n"))

    def test_empty_body_not_rewritten(self) -> None:
        """Content-Length: 0 responses are left alone (as the module does)."""
        h = harness()
        _, client = respond(h, b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 0\r\n", b"")
        self.assertIn(b"Content-Length: 0\r\n", client.value())


class CompressedUpstreamTests(SynchronousTestCase):
    """Compressed bodies are decoded before the rules, never rewritten raw."""

    def _gzip(self, data: bytes) -> bytes:
        import gzip

        return gzip.compress(data)

    def test_gzip_decoded_rewritten_and_recompressed(self) -> None:
        """A gzip body is rewritten and sent gzip to a client that accepts it,
        with Vary: Accept-Encoding."""
        import gzip

        h = harness()
        body = self._gzip(PAGE * 50)
        _, client = respond(
            h,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n" % len(body),
            body,
            request=b"GET / HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n",
            pieces=7,
        )
        status, headers, out = parse_response(client.value())
        self.assertEqual(header(headers, b"content-encoding"), [b"gzip"])
        self.assertEqual(header(headers, b"vary"), [b"Accept-Encoding"])
        self.assertEqual(gzip.decompress(out), REWRITTEN * 50)

    def test_deflate_decoded_for_identity_client(self) -> None:
        """A deflate body goes out rewritten and uncompressed to a client that
        did not ask for compression (raw deflate is accepted too)."""
        import zlib

        for wbits in (zlib.MAX_WBITS, -zlib.MAX_WBITS):
            c = zlib.compressobj(6, zlib.DEFLATED, wbits)
            body = c.compress(PAGE) + c.flush()
            h = harness()
            _, client = respond(
                h,
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n" % len(body),
                body,
            )
            status, headers, out = parse_response(client.value())
            self.assertEqual(header(headers, b"content-encoding"), [])
            self.assertEqual(out, REWRITTEN)

    def _identity_client(self, coding: bytes, body: bytes, pieces: int = 7) -> tuple[list[tuple[bytes, bytes]], bytes, Harness]:
        h = harness()
        _, client = respond(
            h,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: %s\r\nContent-Length: %d\r\n"
            % (coding, len(body)),
            body,
            pieces=pieces,
        )
        self.assertFalse(client.aborted)
        status, headers, out = parse_response(client.value())
        self.assertEqual(status, 200)
        return headers, out, h

    def test_br_and_zstd_decoded_and_rewritten(self) -> None:
        """br and zstd bodies are decoded, rewritten by the site's rules and
        reach a client that takes no compression as identity."""
        import brotli
        import zstandard

        for coding, body in (
            (b"br", brotli.compress(PAGE * 50)),
            (b"zstd", zstandard.ZstdCompressor().compress(PAGE * 50)),
        ):
            headers, out, _ = self._identity_client(coding, body)
            self.assertEqual(header(headers, b"content-encoding"), [], coding)
            self.assertEqual(header(headers, b"vary"), [b"Accept-Encoding"], coding)
            self.assertEqual(out, REWRITTEN * 50, coding)

    def test_stacked_codings_decoded_and_recompressed(self) -> None:
        """``Content-Encoding: gzip, br`` is undone in reverse order and the
        rewritten body sent gzip to a client that takes gzip."""
        import gzip

        import brotli

        h = harness()
        body = brotli.compress(gzip.compress(PAGE * 50))
        _, client = respond(
            h,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip, br\r\nContent-Length: %d\r\n"
            % len(body),
            body,
            request=b"GET / HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n",
            pieces=5,
        )
        status, headers, out = parse_response(client.value())
        self.assertEqual(header(headers, b"content-encoding"), [b"gzip"])
        self.assertEqual(gzip.decompress(out), REWRITTEN * 50)

    def test_unknown_coding_passes_unchanged(self) -> None:
        """A coding we cannot decode, alone or stacked with known ones,
        passes through untouched with its length (compressed bytes never
        reach the transducer); it is counted each time and logged once per
        site and coding."""
        from twisted.logger import globalLogPublisher

        logged: list[dict[str, object]] = []
        globalLogPublisher.addObserver(logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, logged.append)
        h = harness()
        body = b"\x8b\x00www.origin.example"
        for coding in (b"compress", b"gzip, compress", b"compress"):
            _, client = respond(
                h,
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: %s\r\nContent-Length: %d\r\n"
                % (coding, len(body)),
                body,
            )
            status, headers, out = parse_response(client.value())
            self.assertEqual(out, body)
            self.assertEqual(header(headers, b"content-encoding"), [coding])
            self.assertEqual(header(headers, b"content-length"), [b"%d" % len(body)])
        self.assertEqual(h.metrics.counters[("prexy_unknown_coding_total", (("coding", "compress"),))], 3)
        notes = [e for e in logged if "cannot be decoded" in str(e.get("log_format", ""))]
        self.assertEqual(len(notes), 1)
        self.assertEqual(notes[0]["coding"], "compress")

    def test_trailing_garbage_served_counted_logged_once(self) -> None:
        """A compressed body with garbage after the end of its stream (every
        coding, stacked too, with a length or chunked, whole or in pieces)
        is served whole and rewritten, status 200, never a reset; each is
        counted by coding and the site is logged once."""
        import gzip
        import zlib

        import brotli
        import zstandard
        from twisted.logger import globalLogPublisher

        logged: list[dict[str, object]] = []
        globalLogPublisher.addObserver(logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, logged.append)
        page = PAGE * 50
        bodies = [
            (b"gzip", gzip.compress(page) + b"\r\n", "gzip"),
            (b"gzip", gzip.compress(page[:100]) + gzip.compress(page[100:]) + b"\x00" * 8, "gzip"),
            (b"deflate", zlib.compress(page) + b"junk", "deflate"),
            (b"br", brotli.compress(page) + b"<!-- end -->", "br"),
            (b"zstd", zstandard.ZstdCompressor().compress(page) + b"\n", "zstd"),
            (b"gzip, br", brotli.compress(gzip.compress(page)) + b"junk", "br"),
            (b"gzip, br", brotli.compress(gzip.compress(page) + b"junk"), "gzip"),
        ]
        h = harness()
        counts: dict[str, int] = {}
        for coding, body, label in bodies:
            for chunked in (False, True):
                for pieces in (1, 7):
                    _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    conn = h.conns[-1]
                    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body)
                    conn.reply(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: %s\r\n%s\r\n\r\n"
                        % (coding, framing)
                    )
                    step = max(1, len(body) // pieces)
                    for i in range(0, len(body), step):
                        piece = body[i : i + step]
                        conn.reply(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                    if chunked:
                        conn.reply(b"0\r\n\r\n")
                    h.settle()
                    what = (coding, body[-4:], chunked, pieces)
                    self.assertFalse(client.aborted, what)
                    status, headers, out = parse_response(client.value())
                    self.assertEqual((status, out), (200, REWRITTEN * 50), what)
                    counts[label] = counts.get(label, 0) + 1
        for label, n in counts.items():
            self.assertEqual(h.metrics.counters[("prexy_decode_trailing_garbage_total", (("coding", label),))], n)
        self.assertEqual(h.metrics.counters[("prexy_decode_errors_total", (("coding", "gzip"),))], 0)
        notes = [e for e in logged if "garbage after the end" in str(e.get("log_format", ""))]
        self.assertEqual([(n["site"], n["coding"], n["size"]) for n in notes], [("s", "gzip", 2)])

    def test_corrupt_gzip_before_the_head_is_502(self) -> None:
        """A compressed body that is corrupt before anything of the answer
        went out gets a 502 (never a clean short answer, nor a silent close
        that a keep-alive client would retry); the connection stays open."""
        h = harness()
        body = b"\x1f\x8b\x08\x00garbage-not-gzip-at-all"
        _, client = respond(
            h,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\nETag: \"e\"\r\n"
            b"Content-Length: %d\r\n" % len(body),
            body,
        )
        status, headers, out = parse_response(client.value())
        self.assertEqual((status, out), (502, b"502 Bad Gateway\n"))
        self.assertEqual(header(headers, b"etag") + header(headers, b"trailer"), [])
        self.assertFalse(client.disconnecting)
        self.assertEqual(h.metrics.counters[("prexy_decode_errors_total", (("coding", "gzip"),))], 1)

    def test_corrupt_br_mid_stream_resets_client(self) -> None:
        """A br body that goes bad after rewritten bytes already reached the
        client resets the connection (the client sees no terminating chunk)
        and is counted; so does one cut short at a clean chunk boundary."""
        import random

        import brotli

        from prexy.codec import BrotliDecoder, DecodeError

        rng = random.Random(18)
        page = b"".join(PAGE + b"%032x\n" % rng.getrandbits(128) for _ in range(2000))
        good = brotli.compress(page, quality=5)
        cut = len(good) // 2
        corrupt = good[:cut] + b"\xff" * 64 + good[cut:]
        with self.assertRaises(DecodeError):
            d = BrotliDecoder()
            d.feed(corrupt)
        for body, chunked in ((corrupt, False), (good[:cut], True)):
            h = harness()
            _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            conn = h.conns[-1]
            framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body)
            conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: br\r\n%s\r\n\r\n" % framing)
            for i in range(0, len(body), 4096):
                piece = body[i : i + 4096]
                conn.reply(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                h.settle()
                if i == 0:
                    self.assertIn(b"www.clone.example", client.value())  # streaming had begun
            if chunked:
                conn.reply(b"0\r\n\r\n")
            h.settle()
            self.assertTrue(client.aborted, chunked)
            self.assertFalse(client.value().endswith(b"0\r\n\r\n"))
            self.assertEqual(h.metrics.counters[("prexy_decode_errors_total", (("coding", "br"),))], 1)


class FairnessTests(SynchronousTestCase):
    """A big body is rewritten a slice per reactor turn, with the upstream
    paused meanwhile, so other requests are not held up behind it."""

    def test_large_chunk_yields_between_slices(self) -> None:
        self.patch(rewriting, "WORK_BUDGET", 0.0)  # yield after every slice
        self.patch(exchange, "MAX_SLICE", 16 * 1024)  # slices of at most 16 KB
        h = harness()
        body = PAGE * 2000  # ~150 KB: several 16 KB slices
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        conn = h.conns[0]
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % (len(body) + len(PAGE)))
        conn.reply(body)
        # The rewriting waits for later reactor turns (callLater(0): I/O of
        # other connections runs first), upstream paused.
        self.assertTrue(conn.paused)
        first = len(client.value())
        self.assertLess(first, 20 * 1024)
        turns = []
        real_call_later = h.clock.callLater

        def counting(delay: float, f, *a, **kw):  # type: ignore[no-untyped-def]
            turns.append(delay)
            return real_call_later(delay, f, *a, **kw)

        h.clock.callLater = counting  # type: ignore[method-assign]
        h.clock.advance(0)
        self.assertGreaterEqual(len(turns), 5)  # one turn per 16 KB slice
        self.assertFalse(conn.paused)
        conn.reply(PAGE)
        h.settle()
        status, headers, out = parse_response(client.value())
        self.assertEqual(out, REWRITTEN * 2001)
        self.assertLess(first, len(client.value()))
        self.assertEqual(h.pool.idle_connections(), 1)

    def test_small_pieces_are_joined_into_slices(self) -> None:
        """Small upstream pieces queued for the scheduler are rewritten a
        slice at a time, joined, not one feed per piece (each feed has a
        fixed cost); the output is the same."""
        self.patch(rewriting, "WORK_BUDGET", 0.0)
        fed: list[int] = []
        real = BodyPipeline.feed

        def spy(pipeline, data, last=False):  # type: ignore[no-untyped-def]
            fed.append(len(data))
            return real(pipeline, data, last)

        self.patch(BodyPipeline, "feed", spy)
        h = harness()
        big = PAGE * 1000  # several slices: the scheduler is busy after the first
        piece = PAGE * 4
        pieces = 200
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        conn = h.conns[0]
        conn.reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n"
            % (len(big) + len(piece) * pieces)
        )
        conn.reply(big)
        self.assertTrue(h.resource.rewriting.busy)
        for _ in range(pieces):  # arriving while the rewriting waits for its turn
            conn.reply(piece)
        h.settle()
        self.assertEqual(parse_response(client.value())[2], REWRITTEN * (1000 + 4 * pieces))
        self.assertEqual(sum(fed), len(big) + len(piece) * pieces)
        self.assertLess(len(fed), pieces // 4)
        self.assertTrue(all(n <= exchange.FIRST_SLICE for n in fed))

    def test_chunks_of_one_read_arrive_in_one_piece(self) -> None:
        """The data of all the chunks an upstream read completes reaches
        the exchange in one piece; the output is the same."""
        pieces: list[int] = []
        real = forward.Exchange.bodyData

        def spy(exchange, data):  # type: ignore[no-untyped-def]
            pieces.append(len(data))
            return real(exchange, data)

        self.patch(forward.Exchange, "bodyData", spy)
        h = harness()
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(PAGE), PAGE) for _ in range(50))
        h.conns[0].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunks[: len(chunks) // 2]
        )
        h.conns[0].reply(chunks[len(chunks) // 2 :] + b"0\r\n\r\n")
        h.settle()
        self.assertEqual(parse_response(client.value())[2], REWRITTEN * 50)
        self.assertEqual(len(pieces), 2)
        self.assertEqual(sum(pieces), len(PAGE) * 50)

    def test_small_backlog_keeps_reading(self) -> None:
        """While less than BACKLOG_PAUSE waits to be rewritten, the upstream
        is not paused (no epoll churn per turn); the output is the same."""
        self.patch(rewriting, "WORK_BUDGET", 0.0)
        self.patch(exchange, "MAX_SLICE", 16 * 1024)
        h = harness()
        body = PAGE * 800  # ~60 KB, below BACKLOG_PAUSE
        self.assertLess(len(body), exchange.BACKLOG_PAUSE)
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        conn = h.conns[0]
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % (len(body) * 4))
        conn.reply(body)
        self.assertFalse(conn.paused)
        conn.reply(body)
        self.assertFalse(conn.paused)
        conn.reply(body)  # now more than BACKLOG_PAUSE waits: paused
        self.assertTrue(conn.paused)
        for _ in range(100):
            h.clock.advance(0)
        self.assertFalse(conn.paused)
        conn.reply(body)
        for _ in range(100):
            h.clock.advance(0)
        self.assertEqual(parse_response(client.value())[2], REWRITTEN * 3200)

    def test_one_slow_slice_halves_the_slice_at_most(self) -> None:
        """A slice that seemed to take a second (a preemption) halves the
        next slice size instead of dropping it to the minimum for this and
        every later response of the rule set."""
        class SlowClock:
            now = 0.0

            def __call__(self) -> float:
                self.now += 1.0
                return self.now

        h = harness()
        body = PAGE * 2000
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        conn = h.conns[0]
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(body))
        h.resource.rewriting.timer = SlowClock()
        conn.reply(body[: 64 * 1024])
        h.settle()
        digest = h.runtime.default.rules.digest
        self.assertEqual(h.resource.slices[digest], exchange.FIRST_SLICE // 2)

    def test_client_pause_survives_work_resume(self) -> None:
        """Finishing the backlog does not resume an upstream that a slow
        client paused."""
        self.patch(rewriting, "WORK_BUDGET", 0.0)
        h = harness()
        body = PAGE * 2000
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        conn = h.conns[0]
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % (len(body) + 10))
        conn.reply(body)
        client.producer.pauseProducing()
        for _ in range(100):
            h.clock.advance(0)
        self.assertTrue(conn.paused)
        client.producer.resumeProducing()
        self.assertFalse(conn.paused)


class ApplicabilityTests(SynchronousTestCase):
    """The proxy remembers, per resource version, which rules matched."""

    def fetch(self, h: Harness, etag: bytes, body: bytes) -> bytes:
        _, client = respond(
            h,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nETag: %s\r\nContent-Length: %d\r\n" % (etag, len(body)),
            body,
        )
        return client.value()

    def test_version_without_matches_passes_unscanned(self) -> None:
        """The second response of a version no rule matched keeps its
        Content-Length and says the scan was skipped; a new version (other
        ETag) is scanned again."""
        h = harness()
        plain = b"<p>nothing to replace here</p>"
        first = self.fetch(h, b'"v1"', plain)
        self.assertIn(b"Transfer-Encoding: chunked", first)
        second = self.fetch(h, b'"v1"', plain)
        self.assertIn(b"Content-Length: %d" % len(plain), second)
        self.assertIn(b"rewrite-skipped", second)
        self.assertEqual(parse_response(second)[2], plain)
        changed = self.fetch(h, b'"v2"', PAGE)
        self.assertEqual(parse_response(changed)[2], REWRITTEN)

    def test_only_matching_rules_run_again(self) -> None:
        """A version where one of two rules matched runs only that rule next
        time, with the same output."""
        h = harness()
        body = b"<a href='https://www.origin.example/'>x</a>"
        first = self.fetch(h, b'"v1"', body)
        second = self.fetch(h, b'"v1"', body)
        self.assertIn(b'rewrite-rules;desc="1 matched of 2 run"', first)
        self.assertIn(b'rewrite-rules;desc="1 matched of 1 run"', second)
        self.assertEqual(parse_response(first)[2], parse_response(second)[2])

    def test_no_validator_no_memory(self) -> None:
        """Without ETag or Last-Modified nothing is remembered."""
        h = harness()
        for _ in range(2):
            _, client = respond(h, b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 3\r\n", b"abc")
            self.assertIn(b"Transfer-Encoding: chunked", client.value())


class SchedulerTests(SynchronousTestCase):
    """All rewriting in a process shares one budget per reactor turn."""

    def test_two_heavy_responses_take_turns(self) -> None:
        """With a zero budget, each reactor turn rewrites one slice of one
        response, alternating between them; both end complete."""
        self.patch(rewriting, "WORK_BUDGET", 0.0)
        self.patch(exchange, "MAX_SLICE", 16 * 1024)
        h = harness()
        body = PAGE * 1000
        clients, conns = [], []
        for _ in range(2):
            _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            clients.append(client)
            conns.append(h.conns[-1])
        for conn in conns:
            conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(body))
            conn.reply(body)
        order = []
        real = forward.Exchange._work_one

        def spy(exchange):  # type: ignore[no-untyped-def]
            order.append(id(exchange))
            return real(exchange)

        self.patch(forward.Exchange, "_work_one", spy)
        h.settle()
        self.assertGreater(len(order), 4)
        # Round robin: no exchange runs twice in a row while the other waits.
        first_done = max(i for i, x in enumerate(order) if x == order[0])
        second_done = max(i for i, x in enumerate(order) if x != order[0])
        for a, b in zip(order[: min(first_done, second_done)], order[1 : min(first_done, second_done) + 1], strict=True):
            self.assertNotEqual(a, b)
        for client in clients:
            self.assertEqual(parse_response(client.value())[2], REWRITTEN * 1000)


class WholeBodyTests(SynchronousTestCase):
    """A body that arrives whole with its head, within about a millisecond
    of rewriting (WHOLE_SECONDS, a few slices), is rewritten at once instead
    of through the scheduler's queue: right after the head is sent where the
    answer can carry trailers (HTTP/1.1), before it otherwise (HTTP/1.0)."""

    def _spy_work_one(self) -> list[object]:
        calls: list[object] = []
        real = forward.Exchange._work_one

        def spy(exchange):  # type: ignore[no-untyped-def]
            calls.append(exchange)
            return real(exchange)

        self.patch(forward.Exchange, "_work_one", spy)
        return calls

    def test_whole_body_skips_the_queue(self) -> None:
        """Same bytes as when the body trickles in, all written while the
        upstream's read is handled (no reactor turn): chunked (no
        Content-Length, as for every rewritten body), one chunk and the last
        chunk, the rewrite's timing in the trailer; the upstream connection
        is back in the pool."""
        h = harness()
        calls = self._spy_work_one()
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        h.conns[0].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
        )
        raw = client.value()
        status, headers, body = parse_response(raw)
        self.assertEqual((status, body), (200, REWRITTEN))
        self.assertEqual(header(headers, b"content-length"), [])
        self.assertEqual(header(headers, b"transfer-encoding"), [b"chunked"])
        self.assertEqual(header(headers, b"trailer"), [b"Server-Timing"])
        [timing] = header(headers, b"server-timing")
        self.assertRegex(timing, rb"prexy;dur=[\d.]+$")
        body_and_end = b"\r\n\r\n%x\r\n%s\r\n0\r\n" % (len(REWRITTEN), REWRITTEN)
        self.assertIn(body_and_end, raw)
        self.assertRegex(
            raw[raw.index(body_and_end) + len(body_and_end) :],
            rb'^Server-Timing: rewrite;dur=[\d.]+, rewrite-rules;desc="2 matched of 2 run"\r\n\r\n$',
        )
        self.assertEqual(calls, [])
        self.assertEqual(h.pool.idle_connections(), 1)
        # The next request reuses that connection.
        h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(len(h.conns), 1)

    def test_the_head_leaves_before_the_rewrite(self) -> None:
        """Over HTTP/1.1 the client has the whole head before the body is
        rewritten (it can read it meanwhile); the body follows in the same
        turn."""
        seen: list[bytes] = []
        real = forward.Exchange._feed
        h = harness()
        _, client = h.client()

        def feed(exchange, data, last):  # type: ignore[no-untyped-def]
            seen.append(client.value())
            return real(exchange, data, last)

        self.patch(forward.Exchange, "_feed", feed)
        client.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        h.conns[0].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
        )
        [before] = seen
        self.assertTrue(before.startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertTrue(before.endswith(b"\r\n\r\n"))
        self.assertEqual(parse_response(client.value())[2], REWRITTEN)

    def test_two_writes(self) -> None:
        """The head is one write; the body, the last chunk and the trailer
        section are the other (one send each, not three)."""
        h = harness()
        _, client = h.client()
        writes = client.record_writes()
        client.protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        h.conns[0].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
        )
        self.assertEqual(len(writes), 2)
        self.assertTrue(writes[0].endswith(b"\r\n\r\n"))
        self.assertTrue(writes[1].startswith(b"%x\r\n%s\r\n0\r\nServer-Timing: " % (len(REWRITTEN), REWRITTEN)))
        self.assertTrue(writes[1].endswith(b"\r\n\r\n"))

    def test_http10_whole_body_timing_in_the_head(self) -> None:
        """An HTTP/1.0 answer has no trailer: the whole body is rewritten
        before the head, which gives the rewrite's time, and the body is
        delimited by the close."""
        h = harness()
        _, client = h.send(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        h.conns[0].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
        )
        raw = client.value()
        head, _, body = raw.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.0 200 OK\r\n"))
        self.assertEqual(body, REWRITTEN)
        [timing] = header(parse_response(raw)[1], b"server-timing")
        self.assertRegex(timing, rb'prexy;dur=[\d.]+, rewrite;dur=[\d.]+, rewrite-rules;desc="2 matched of 2 run"$')
        self.assertTrue(client.disconnecting)

    def test_a_few_slices_whole_skip_the_queue(self) -> None:
        """A body of several slices, within WHOLE_SECONDS of work at the
        rule set's speed, is still rewritten at once; one past that queues."""
        self.patch(rewriting, "WORK_BUDGET", 0.0)
        h = harness()
        calls = self._spy_work_one()
        limit = exchange.whole_limit(exchange.FIRST_SLICE)
        fits = PAGE * (limit // len(PAGE))
        self.assertGreater(len(fits), 2 * exchange.FIRST_SLICE)
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        h.conns[0].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(fits), fits)
        )
        self.assertEqual(parse_response(client.value())[2], REWRITTEN * (limit // len(PAGE)))
        self.assertEqual(calls, [])
        h.resource.slices.clear()
        over = fits + PAGE
        _, client2 = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        h.conns[-1].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(over), over)
        )
        h.settle()
        self.assertEqual(parse_response(client2.value())[2], REWRITTEN * (limit // len(PAGE) + 1))
        self.assertGreater(len(calls), 0)

    def test_trailing_bytes_close_the_upstream(self) -> None:
        """Bytes past the announced length are dropped and the upstream
        connection is not reused, as on the streaming path."""
        h = harness()
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        h.conns[0].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%sjunk" % (len(PAGE), PAGE)
        )
        self.assertEqual(parse_response(client.value())[2], REWRITTEN)
        self.assertEqual(h.pool.idle_connections(), 0)
        self.assertTrue(h.conns[0].transport.disconnecting)

    def test_bodies_past_one_slice_or_behind_others_queue(self) -> None:
        """A body larger than the rule set's slice, or one arriving while
        other responses wait for the scheduler, goes through the queue."""
        self.patch(rewriting, "WORK_BUDGET", 0.0)  # yield after every slice
        self.patch(exchange, "MAX_SLICE", 16 * 1024)
        h = harness()
        calls = self._spy_work_one()
        big = PAGE * 1000
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        h.conns[0].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)
        )
        self.assertEqual(calls, [])  # rewritten in later reactor turns
        self.assertEqual(h.resource.rewriting.busy, 1)
        # A small whole body now waits its turn behind the big one.
        _, client2 = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        h.conns[-1].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
        )
        self.assertEqual(client2.value(), b"")
        h.settle()
        self.assertEqual(parse_response(client.value())[2], REWRITTEN * 1000)
        self.assertEqual(parse_response(client2.value())[2], REWRITTEN)
        self.assertEqual(len({id(c) for c in calls}), 2)

    def test_whole_body_timeout_is_reported(self) -> None:
        """A scan that timed out on a whole body says so in the trailer's
        Server-Timing (in the head's over HTTP/1.0), and is counted."""
        real = forward.Exchange._feed

        def timing_out(exchange, data, last):  # type: ignore[no-untyped-def]
            out = real(exchange, data, last)
            exchange.pipeline.transducer.timed_out = True
            return out

        self.patch(forward.Exchange, "_feed", timing_out)
        h = harness()
        said = b'rewrite-timeout;desc="scan timed out, rest passed unchanged"'
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        h.conns[0].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
        )
        raw = client.value()
        trailer = raw[raw.rindex(b"\r\n0\r\n") :]
        self.assertIn(said, trailer)
        _, client10 = h.send(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        h.conns[-1].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
        )
        [timing] = header(parse_response(client10.value())[1], b"server-timing")
        self.assertIn(said, timing)
        self.assertEqual(h.resource.metrics.counters[("prexy_rewrite_timeouts_total", ())], 2)


class EndWithDataTests(SynchronousTestCase):
    """Where the proxy knows a body is complete when it rewrites its last
    piece (the whole body came with its head, its length is fully read, or
    its end has already come), the transducer ends with that piece, as the
    replace-filter module ends a body whose last buffer carries the end:
    with ``replace_filter_max_buffered_size 0``, ``\\s+$`` at the end of the
    body is replaced (module tests 01-sanity.t and 04-capturing.t, "trim
    trailing spaces").  When the end comes on its own, after the last piece
    was rewritten, the module bails out, and so does Prexy."""

    RULES = b"replace_filter_max_buffered_size 0;\nreplace_filter '\\s+$' '' g;\n"
    PAGE = b"  hello, world  \nblah yeah\nhello  \n   baby!\n     \nabc\n"
    TRIMMED = b"  hello, world\nblah yeah\nhello\n   baby!\nabc"

    def _get(self, h: Harness, reads: list[bytes]) -> bytes:
        """The client's body when the upstream's answer comes in ``reads``,
        each handled (and its body rewritten) before the next."""
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        conn = h.conns[-1]
        for data in reads:
            conn.reply(data)
            h.settle()
        self.assertFalse(client.aborted)
        status, _, out = parse_response(client.value())
        self.assertEqual(status, 200)
        return out

    def test_known_length(self) -> None:
        """With a Content-Length, identity or gzip, the body with the head
        or after it, or (gzip) all but its header in a later read: the
        blanks at the end go."""
        import gzip

        h = harness(self.RULES)
        for coding, body in ((b"", self.PAGE), (b"Content-Encoding: gzip\r\n", gzip.compress(self.PAGE))):
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n%sContent-Length: %d\r\n\r\n" % (coding, len(body))
            for pieces in ([head + body], [head, body], [head, body[:10], body[10:]]):
                self.assertEqual(self._get(h, pieces), self.TRIMMED, (coding, len(pieces)))
        self.assertEqual(h.metrics.counters[("prexy_rewrite_bailouts_total", ())], 0)

    def test_chunked_end_with_the_last_chunk(self) -> None:
        """Chunked, the last chunk and the end in one read: the end is known
        when the last piece is rewritten."""
        h = harness(self.RULES)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n"
        first, last = self.PAGE[:20], self.PAGE[20:]
        reads = [head + b"\r\n", b"%x\r\n%s\r\n" % (len(first), first), b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last)]
        self.assertEqual(self._get(h, reads), self.TRIMMED)
        self.assertEqual(h.metrics.counters[("prexy_rewrite_bailouts_total", ())], 0)

    def test_chunked_end_on_its_own(self) -> None:
        """Chunked, the end in a later read than the last chunk: the module's
        bail-out (the trailing blanks are held beyond the limit)."""
        h = harness(self.RULES)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n"
        reads = [head + b"\r\n", b"%x\r\n%s\r\n" % (len(self.PAGE), self.PAGE), b"0\r\n\r\n"]
        self.assertEqual(self._get(h, reads), self.TRIMMED + b"\n")
        self.assertEqual(h.metrics.counters[("prexy_rewrite_bailouts_total", ())], 1)
