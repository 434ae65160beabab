"""Benchmark of HTTP/1.1 response readers: prexy.http1 against httptools and h11.

Standalone: ``python bench/bench_http1.py [--runs 15] [--budget 0.2]``.
Each reader turns the same bytes into what the proxy needs from a response
(status, phrase, version, header pairs with lower-cased names, body pieces,
end of message):

- ``20k``: a 20 KB Content-Length response arriving in one read,
- ``small``: a 12-byte response in one read,
- ``chunked-1k``: a 1 MB chunked response (1 KiB chunks) in 16 KiB reads,
- ``chunked-16k``: the same with 16 KiB chunks.

Runs are interleaved (every reader once per round, ``--runs`` rounds) and
each cell is the median over rounds of the CPU time (``process_time``) per
response, so other processes' load mostly stays out.  h11 is a client
connection and must send a request before it reads a response; its figure
includes sending a prebuilt one (its cheapest part).  httptools and h11
are optional: a missing one is reported and skipped.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prexy import http1  # noqa: E402

HEADERS = (
    b"Server: nginx/1.22.1\r\n"
    b"Date: Mon, 01 Jan 2024 00:00:00 GMT\r\n"
    b"Content-Type: text/html\r\n"
    b"%s"
    b"Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n"
    b"Connection: keep-alive\r\n"
    b'ETag: "65920000-4e20"\r\n'
    b"Accept-Ranges: bytes\r\n"
)


def length_response(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + HEADERS % (b"Content-Length: %d\r\n" % len(body)) + b"\r\n" + body


def chunked_response(total: int, chunk_size: int) -> bytes:
    out = [b"HTTP/1.1 200 OK\r\n" + HEADERS % b"Transfer-Encoding: chunked\r\n" + b"\r\n"]
    piece = b"x" * chunk_size
    for _ in range(total // chunk_size):
        out.append(b"%x\r\n%s\r\n" % (chunk_size, piece))
    out.append(b"0\r\n\r\n")
    return b"".join(out)


def reads(raw: bytes, size: int) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)]


CASES: dict[str, list[bytes]] = {
    "20k": [length_response(b"a" * 20_000)],
    "small": [length_response(b"hello world!")],
    "chunked-1k": reads(chunked_response(1 << 20, 1024), 16384),
    "chunked-16k": reads(chunked_response(1 << 20, 16384), 16384),
}


def prexy_reader(pieces: list[bytes]) -> int:
    reader = http1.ResponseReader(b"GET")
    size = 0
    for piece in pieces:
        for event in reader.receive_data(piece):
            if type(event) is http1.Data:
                size += len(event.data)
            elif type(event) is http1.End:
                return size
            elif type(event) is http1.Head:
                assert event.code == 200
            else:
                raise AssertionError(event)
    raise AssertionError("no end")


def make_httptools() -> Callable[[list[bytes]], int] | None:
    try:
        import httptools
    except ImportError:
        return None

    class Sink:
        __slots__ = ("headers", "lnames", "phrase", "body", "size", "done")

        def __init__(self) -> None:
            self.headers: list[tuple[bytes, bytes]] = []
            self.lnames: list[bytes] = []
            self.phrase = b""
            self.size = 0
            self.done = False

        def on_status(self, phrase: bytes) -> None:
            self.phrase = phrase

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers.append((name, value))
            self.lnames.append(name.lower())

        def on_headers_complete(self) -> None:
            pass

        def on_body(self, body: bytes) -> None:
            self.size += len(body)

        def on_message_complete(self) -> None:
            self.done = True

    def run(pieces: list[bytes]) -> int:
        sink = Sink()
        parser = httptools.HttpResponseParser(sink)
        for piece in pieces:
            parser.feed_data(piece)
        assert sink.done and parser.get_status_code() == 200
        parser.get_http_version()
        parser.should_keep_alive()
        return sink.size

    return run


def make_h11() -> Callable[[list[bytes]], int] | None:
    try:
        import h11
    except ImportError:
        return None
    request = h11.Request(method="GET", target="/", headers=[("Host", "origin")])
    end = h11.EndOfMessage()

    def run(pieces: list[bytes]) -> int:
        conn = h11.Connection(h11.CLIENT)
        conn.send(request)
        conn.send(end)
        size = 0
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
                return size
            elif kind is h11.Response:
                assert event.status_code == 200
                [(n, v) for n, v in event.headers]

    return run


def measure(fn: Callable[[list[bytes]], int], pieces: list[bytes], budget: float) -> float:
    """CPU seconds per call, over about ``budget`` seconds."""
    expected = fn(pieces)
    n = 1
    while True:
        start = time.process_time()
        for _ in range(n):
            fn(pieces)
        spent = time.process_time() - start
        if spent >= budget / 4:
            break
        n *= 4
    n = max(1, int(n * budget / max(spent, 1e-9)))
    start = time.process_time()
    for _ in range(n):
        got = fn(pieces)
    assert got == expected
    return (time.process_time() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--budget", type=float, default=0.2, help="CPU seconds per cell per round")
    args = parser.parse_args()
    readers: dict[str, Callable[[list[bytes]], int]] = {"prexy.http1": prexy_reader}
    for name, make in (("httptools", make_httptools), ("h11", make_h11)):
        fn = make()
        if fn is None:
            print(f"{name}: not installed, skipped", file=sys.stderr)
        else:
            readers[name] = fn
    sizes = {case: {name: fn(pieces) for name, fn in readers.items()} for case, pieces in CASES.items()}
    for case, got in sizes.items():
        assert len(set(got.values())) == 1, (case, got)
    results: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.runs):
        for case, pieces in CASES.items():
            for name, fn in readers.items():
                results.setdefault((case, name), []).append(measure(fn, pieces, args.budget))
        print(f"round {round_ + 1}/{args.runs}", file=sys.stderr)
    names = list(readers)
    print(f"median us per response, {args.runs} interleaved rounds (CPU time)\n")
    print("| case | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for case in CASES:
        cells = [f"{statistics.median(results[case, n]) * 1e6:.1f}" for n in names]
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
