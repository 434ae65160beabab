"""Benchmark of HTTP/1.1 response readers: prexy.http1 against one on httptools.

Standalone: ``python bench/bench_http1.py [--runs 15] [--budget 0.1] [--h11]``.

Two readers do the proxy's whole job on the same bytes, driven the way
``prexy/proxy/upstream.py`` drives its reader (a new reader per response,
``interim=True``, the pool's ``max_head``; the events iterated):

- ``http1``: :class:`prexy.http1.ResponseReader`, the hand-written reader
  the upstream connection uses;
- ``llhttp``: :class:`LlhttpReader` below, the same interface on
  ``httptools.HttpResponseParser`` (llhttp): the same events (Head with
  status, phrase, version, header pairs and lower-case names, the Connection
  names, length, framing and keep-alive; Interim; Data; End with trailers;
  ResponseError), the same head limits (``max_head`` across interim heads,
  however the head is cut into reads; ``MAX_HEADER_COUNT``), HEAD, 204,
  304, 1xx and 101 as http1 reads them, a close-delimited body, a NUL in
  the status line and a Transfer-Encoding other than chunked refused.  It
  is the candidate the measurement decides on, not a second reader for the
  package (see bench/README.md, "Issue 34: the upstream response reader").

``bare-httptools`` is a floor: the C parser with callbacks that only collect
what the proxy needs and build no events.  ``--h11`` adds h11 (about ten
times slower; out of the question).

The cases are what an origin sends (a typical nginx head of 12 fields):

- ``12B``: a 12-byte body, head and body in one read;
- ``20k``: a 20 KB Content-Length body, one read;
- ``20k/16K``: the same arriving in 16 KiB reads;
- ``chunked-20k``: 20 KB chunked in 4 chunks, one read;
- ``chunked-20k/16K``: the same in 16 KiB reads;
- ``304``: a 304 with the same head;
- ``keepalive``: ten responses on one connection (12 B, 20 KB and a 304
  alternating, each with its own reader), per response;
- ``chunked-1M/1k`` and ``chunked-1M/16k``: a 1 MB chunked body in 1 KiB or
  16 KiB chunks, 16 KiB reads (a site streaming a large page).

``--oracle`` runs http1's own tests (``tests/test_http1.py``) against the
candidate instead, and prints the tests where it differs and why.

Runs are interleaved (every reader once per case per round, ``--runs``
rounds) and each cell is the median over rounds of the CPU time
(``process_time``) per response, so other processes' load mostly stays out.
Before timing, both readers must give the same events on every case.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httptools

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prexy import http1  # noqa: E402
from prexy.http1 import (  # noqa: E402
    CHUNKED,
    CLOSE,
    LENGTH,
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
    NO_BODY_STATUSES,
    NONE,
    Data,
    End,
    Event,
    Head,
    Interim,
    ResponseError,
    ResponseIncomplete,
    UnsolicitedUpgrade,
)

# -- the candidate -------------------------------------------------------------------

_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                  b"transfer-encoding", b"upgrade", b"content-length"})
_VERSIONS = {"1.1": b"HTTP/1.1", "1.0": b"HTTP/1.0"}
_NO_TRAILERS: list[tuple[bytes, bytes]] = []
_HEAD, _BODY, _DONE, _ERROR = range(4)
_TOKENS: dict[bytes, frozenset[bytes]] = {}


def _connection_tokens(value: bytes) -> frozenset[bytes]:
    tokens = _TOKENS.get(value)
    if tokens is None:
        tokens = frozenset(t.strip().lower() for t in value.split(b","))
        if len(_TOKENS) < 64:
            _TOKENS[value] = tokens
    return tokens


class _Stop(Exception):
    """Raised from a callback to stop llhttp: bytes follow the end of the
    response."""


class _HeadDone(Exception):
    """Raised from a callback to stop llhttp: the head of a response to
    HEAD is complete."""


class LlhttpReader:
    """http1.ResponseReader's interface on httptools (see the module
    docstring for what it matches).  Where it differs (``--oracle``):
    llhttp refuses a repeated equal Content-Length, Transfer-Encoding beside
    Content-Length, obs-fold, LF-only chunk lines, whitespace after a chunk
    size, control characters other than HTAB in field values, a malformed
    field in a skipped 1xx head and versions other than 1.0/1.1 (all 502
    here, accepted by http1); a body comes as llhttp's copy, never the
    read itself; and httptools does not say where in a read a message
    ended, so after a response other than a 101 ``trailing_data`` says only
    that bytes came (the proxy only asks whether any did)."""

    __slots__ = (
        "method", "max_head", "upgrade", "interim", "_state", "_parser", "_out", "_headers", "_phrase",
        "_pieces", "_fed", "framing", "_keep_alive", "_final", "trailing_data", "received_any",
    )

    def __init__(
        self, method: bytes = b"GET", max_head: int = MAX_HEADER_BYTES, upgrade: bool = False, interim: bool = False,
    ) -> None:
        self.method = method
        self.max_head = max_head
        self.upgrade = upgrade
        self.interim = interim
        self._state = _HEAD
        # A cycle (the parser holds this reader's bound methods) until the
        # response ends; broken then, or the bodies it holds wait for the GC
        # (that cost 2x on a 20 KB body).
        self._parser: Any = httptools.HttpResponseParser(self)
        self._out: list[Event] = []
        self._headers: list[tuple[bytes, bytes]] = []
        self._phrase = b""
        self._pieces: list[bytes] = []
        #: Bytes fed while reading heads.
        self._fed = 0
        self.framing: str | None = None
        self._keep_alive = False
        self._final = False
        self.trailing_data = b""
        self.received_any = False

    # llhttp's callbacks

    def on_message_begin(self) -> None:
        if self._state == _DONE:
            raise _Stop

    def on_status(self, phrase: bytes) -> None:
        self._phrase = self._phrase + phrase if self._phrase else phrase

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value.rstrip()))  # llhttp leaves trailing whitespace

    def on_headers_complete(self) -> None:
        parser = self._parser
        code = parser.get_status_code()
        version = _VERSIONS[parser.get_http_version()]
        headers, phrase = self._headers, self._phrase
        self._headers, self._phrase = [], b""
        if code < 100:  # llhttp takes any three digits: "020", "099"
            raise ResponseError(f"bad status code {code}")
        if 0 in phrase:
            raise ResponseError("NUL in the status line")
        if len(headers) >= MAX_HEADER_COUNT:
            raise ResponseError("too many response headers")
        lnames = [name.lower() for name, _ in headers]
        close = version == b"HTTP/1.0"
        connection_names: frozenset[bytes] = frozenset()
        content_length = None
        chunked = False
        if b"connection" in lnames or b"content-length" in lnames or b"transfer-encoding" in lnames:
            for (_, value), lname in zip(headers, lnames, strict=True):
                if lname == b"connection":
                    tokens = _connection_tokens(value)
                    connection_names = connection_names | tokens if connection_names else tokens
                    if b"close" in tokens:
                        close = True
                    elif b"keep-alive" in tokens and version == b"HTTP/1.0":
                        close = False
                elif lname == b"content-length":
                    content_length = int(value)  # llhttp took only digits, and one value
                elif lname == b"transfer-encoding":
                    if value.split(b",")[-1].strip().lower() != b"chunked":
                        raise ResponseError(f"unsupported Transfer-Encoding {value[:40]!r}")
                    chunked = True
        length: int | None
        if code < 200:
            if code != 101:
                if self.interim and code != 100:
                    self._out.append(Interim(code, phrase, [
                        pair for pair, lname in zip(headers, lnames, strict=True)
                        if lname not in connection_names and lname not in _HOP]))
                return
            if not self.upgrade:
                raise UnsolicitedUpgrade("101 Switching Protocols to a request that did not ask to upgrade")
            framing, length, close = NONE, 0, True
        elif self.method == b"HEAD" or code in NO_BODY_STATUSES:
            framing, length = NONE, 0
            if self.method == b"HEAD" and code not in NO_BODY_STATUSES:
                length = content_length
        elif chunked:
            framing, length = CHUNKED, None
        elif content_length is not None:
            framing, length = (LENGTH if content_length else NONE), content_length
        else:
            framing, length, close = CLOSE, None, True
        self._final = True
        self.framing = framing
        self._keep_alive = not close
        self._out.append(Head(code, phrase, version, headers, lnames, connection_names, length, framing, not close))
        self._state = _BODY
        if self.method == b"HEAD" and code != 101:  # llhttp would wait for the Content-Length bytes
            self._end()
            raise _HeadDone

    def on_body(self, data: bytes) -> None:
        self._pieces.append(data)

    def on_message_complete(self) -> None:
        if self._final and self._state == _BODY:
            self._end()

    def _end(self) -> None:
        if len(self._headers) > MAX_HEADER_COUNT:
            raise ResponseError("too many trailer fields")
        self._flush()
        self._out.append(End(self._keep_alive, self._headers or _NO_TRAILERS))  # trailers, after the head
        self._state = _DONE

    def _flush(self) -> None:
        pieces = self._pieces
        if pieces:
            self._out.append(Data(pieces[0] if len(pieces) == 1 else b"".join(pieces)))
            self._pieces = []

    # the interface

    def receive_data(self, data: bytes) -> list[Event]:
        if not data:
            return []
        self.received_any = True
        state = self._state
        if state >= _DONE:
            if state == _DONE:
                self.trailing_data += data
            return []
        out = self._out = []
        try:
            if state == _HEAD and self._fed + len(data) >= self.max_head:
                # The head must end within max_head bytes: feed up to the
                # limit, then the rest only if the head ended.
                allowed = self.max_head - self._fed
                self._parser.feed_data(data[:allowed])
                if self._state == _HEAD:
                    raise ResponseError(f"response head over {self.max_head} bytes")
                data = data[allowed:]
                if data:
                    if self._state == _BODY:
                        self._parser.feed_data(data)
                    elif self._state == _DONE:
                        self.trailing_data = data
            else:
                self._fed += len(data)
                self._parser.feed_data(data)
        except ResponseError as error:
            self._fail(error)
        except httptools.HttpParserUpgrade as error:  # the 101 asked for: the new protocol follows
            self.trailing_data = data[error.args[0]:]
        except httptools.HttpParserError as error:  # llhttp's, and ours raised inside a callback
            cause = error.__context__
            if isinstance(cause, _HeadDone):
                if not data.endswith(b"\r\n\r\n"):  # a head ends with its read only so (llhttp wants CRLF)
                    self.trailing_data = b"?"
            elif isinstance(cause, _Stop) or self._state == _DONE:
                self.trailing_data = b"?"  # bytes after the end, somewhere in this read
            elif isinstance(cause, ResponseError):
                self._fail(cause)
            else:
                self._fail(ResponseError(str(error)))
        if self._state == _BODY:
            self._flush()
        elif self._state >= _DONE:
            self._parser = None
        self._out = []
        return out

    def _fail(self, error: ResponseError) -> None:
        self._flush()
        self._out.append(error)
        self._state = _ERROR

    def connection_closed(self) -> list[Event]:
        state = self._state
        self._parser = None
        if state == _BODY:
            if self.framing is CLOSE:
                self._state = _DONE
                return [End(False, _NO_TRAILERS)]
            self._state = _ERROR
            return [ResponseIncomplete("closed inside the body")]
        if state == _HEAD:
            self._state = _ERROR
            return [ResponseIncomplete("closed before the response head")]
        return []

    @property
    def done(self) -> bool:
        return self._state == _DONE


# -- the cases -----------------------------------------------------------------------

HEAD_TEMPLATE = (
    b"HTTP/1.1 %s\r\n"
    b"Server: nginx/1.22.1\r\n"
    b"Date: Mon, 01 Jan 2024 00:00:00 GMT\r\n"
    b"Content-Type: text/html; charset=utf-8\r\n"
    b"%s"
    b"Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n"
    b"Connection: keep-alive\r\n"
    b"Vary: Accept-Encoding\r\n"
    b'ETag: "65920000-4e20"\r\n'
    b"Cache-Control: max-age=3600\r\n"
    b"X-Frame-Options: SAMEORIGIN\r\n"
    b"X-Content-Type-Options: nosniff\r\n"
    b"Accept-Ranges: bytes\r\n"
    b"\r\n"
)


def length_response(body: bytes) -> bytes:
    return HEAD_TEMPLATE % (b"200 OK", b"Content-Length: %d\r\n" % len(body)) + body


def chunked_response(body: bytes, chunk_size: int) -> bytes:
    out = [HEAD_TEMPLATE % (b"200 OK", b"Transfer-Encoding: chunked\r\n")]
    for i in range(0, len(body), chunk_size):
        piece = body[i : i + chunk_size]
        out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
    out.append(b"0\r\n\r\n")
    return b"".join(out)


def reads(raw: bytes, size: int) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)]


PAGE = bytes(range(32, 127)) * 211  # 20,045 bytes
SMALL = length_response(b"hello world!")
NOT_MODIFIED = HEAD_TEMPLATE % (b"304 Not Modified", b"")

#: Case name -> responses, each a list of reads.
CASES: dict[str, list[list[bytes]]] = {
    "12B": [[SMALL]],
    "20k": [[length_response(PAGE)]],
    "20k/16K": [reads(length_response(PAGE), 16384)],
    "chunked-20k": [[chunked_response(PAGE, 5012)]],
    "chunked-20k/16K": [reads(chunked_response(PAGE, 5012), 16384)],
    "304": [[NOT_MODIFIED]],
    "keepalive": [[SMALL], reads(length_response(PAGE), 16384), [NOT_MODIFIED]] * 3 + [[SMALL]],
    "chunked-1M/1k": [reads(chunked_response(b"x" * (1 << 20), 1024), 16384)],
    "chunked-1M/16k": [reads(chunked_response(b"x" * (1 << 20), 16384), 16384)],
}


# -- the readers, as the proxy drives them ------------------------------------------------


def driver(reader_class: Any) -> Callable[[list[list[bytes]]], int]:
    """Reads each response with a new reader; returns the body bytes."""

    def run(responses: list[list[bytes]]) -> int:
        size = 0
        for pieces in responses:
            reader = reader_class(b"GET", MAX_HEADER_BYTES, False, True)
            for piece in pieces:
                for event in reader.receive_data(piece):
                    kind = type(event)
                    if kind is Data:
                        size += len(event.data)
                    elif kind is End:
                        break
                    elif kind is not Head:
                        raise AssertionError(event)
        return size

    return run


def events_of(reader_class: Any, responses: list[list[bytes]]) -> list[Any]:
    """All events of ``responses``, adjacent Data joined."""
    out: list[Any] = []
    for pieces in responses:
        reader = reader_class(b"GET", MAX_HEADER_BYTES, False, True)
        for piece in pieces:
            for event in reader.receive_data(piece):
                if type(event) is Data and out and type(out[-1]) is Data:
                    out[-1] = Data(out[-1].data + event.data)
                else:
                    out.append(event)
    return out


def make_bare_httptools() -> Callable[[list[list[bytes]]], int]:
    class Sink:
        __slots__ = ("headers", "phrase", "size", "done")

        def __init__(self) -> None:
            self.headers: list[tuple[bytes, bytes]] = []
            self.phrase = b""
            self.size = 0
            self.done = False

        def on_status(self, phrase: bytes) -> None:
            self.phrase = phrase

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers.append((name, value))

        def on_body(self, body: bytes) -> None:
            self.size += len(body)

        def on_message_complete(self) -> None:
            self.done = True

    def run(responses: list[list[bytes]]) -> int:
        size = 0
        for pieces in responses:
            sink = Sink()
            parser = httptools.HttpResponseParser(sink)
            for piece in pieces:
                parser.feed_data(piece)
            assert sink.done
            parser.get_status_code()
            parser.get_http_version()
            size += sink.size
        return size

    return run


def make_h11() -> Callable[[list[list[bytes]]], int]:
    import h11

    request = h11.Request(method="GET", target="/", headers=[("Host", "origin")])
    end = h11.EndOfMessage()

    def run(responses: list[list[bytes]]) -> int:
        size = 0
        for pieces in responses:
            conn = h11.Connection(h11.CLIENT)
            conn.send(request)
            conn.send(end)
            feed = iter(pieces)
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(next(feed))
                    continue
                kind = type(event)
                if kind is h11.Data:
                    size += len(event.data)
                elif kind is h11.EndOfMessage:
                    break
                elif kind is h11.Response:
                    [(n, v) for n, v in event.headers]
        return size

    return run


def measure(fn: Callable[[Any], int], responses: list[list[bytes]], budget: float) -> float:
    """CPU seconds per response, over about ``budget`` seconds."""
    expected = fn(responses)
    n = 1
    while True:
        start = time.process_time()
        for _ in range(n):
            fn(responses)
        spent = time.process_time() - start
        if spent >= budget / 4:
            break
        n *= 4
    n = max(1, int(n * budget / max(spent, 1e-9)))
    start = time.process_time()
    for _ in range(n):
        got = fn(responses)
    assert got == expected
    return (time.process_time() - start) / n / len(responses)


def oracle() -> int:
    """Runs tests/test_http1.py with LlhttpReader as the reader; prints
    each test that differs, with the first line of why; the count."""
    import importlib
    import io

    from twisted.trial import reporter, runner

    test_http1: Any = importlib.import_module("tests.test_http1")
    test_http1.ResponseReader = test_http1.http1.ResponseReader = LlhttpReader
    result = reporter.Reporter(io.StringIO())
    runner.TestLoader().loadModule(test_http1).run(result)
    for test, failure in sorted(result.failures + result.errors, key=lambda pair: pair[0].id()):
        why = str(getattr(failure, "value", failure)).strip().splitlines()[0][:160]
        print(f"{test.id().removeprefix('tests.test_http1.')}: {why}")
    differing = len(result.failures) + len(result.errors)
    print(f"{differing} of {result.testsRun} tests differ")
    return differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--budget", type=float, default=0.1, help="CPU seconds per cell per round")
    parser.add_argument("--h11", action="store_true", help="also h11 (slow)")
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--oracle", action="store_true", help="run tests/test_http1.py against the candidate")
    args = parser.parse_args()
    if args.oracle:
        oracle()
        return
    cases = {k: v for k, v in CASES.items() if not args.only or k in args.only.split(",")}
    readers: dict[str, Callable[[Any], int]] = {
        "http1": driver(http1.ResponseReader),
        "llhttp": driver(LlhttpReader),
        "bare-httptools": make_bare_httptools(),
    }
    if args.h11:
        readers["h11"] = make_h11()
    for case, responses in cases.items():
        assert events_of(http1.ResponseReader, responses) == events_of(LlhttpReader, responses), case
        assert len({fn(responses) for fn in readers.values()}) == 1, case
    results: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.runs):
        for case, responses in cases.items():
            for name, fn in readers.items():
                results.setdefault((case, name), []).append(measure(fn, responses, args.budget))
        print(f"round {round_ + 1}/{args.runs}", file=sys.stderr)
    names = list(readers)
    print(f"median µs of CPU per response, {args.runs} interleaved rounds\n")
    print("| case | " + " | ".join(names) + " | llhttp / http1 |")
    print("|---|" + "---:|" * (len(names) + 1))
    for case in cases:
        medians = {n: statistics.median(results[case, n]) * 1e6 for n in names}
        cells = [f"{medians[n]:.1f}" for n in names]
        print(f"| {case} | " + " | ".join(cells) + f" | {medians['llhttp'] / medians['http1']:.2f} |")


if __name__ == "__main__":
    main()
