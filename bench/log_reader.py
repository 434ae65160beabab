"""A reader of Prexy's live request log, for the ``observe`` benchmark.

    python bench/log_reader.py ADMIN_URL [QUERY]

Attaches to ``GET ADMIN_URL/log?QUERY`` (unfiltered without a query),
prints ``ready`` once the stream's head has come (Prexy records for it
from then on), then reads everything as fast as it comes and throws it
away, counting the records and the ``{"dropped": N}`` lines.  On SIGTERM
(or when the stream ends) it prints one line ``READER {"records": N,
"dropped": N, "bytes": N}`` and exits.  Stdlib only.
"""

from __future__ import annotations

import http.client
import json
import signal
import sys
import urllib.parse


class _Stop(Exception):
    pass


def _stop(_signum: int, _frame: object) -> None:
    raise _Stop


class Counts:
    """What a reader has read of the stream: records, the records Prexy
    said it dropped (``{"dropped": N}`` lines, not records), bytes.
    ``feed`` takes the stream's bytes as they come, cut anywhere."""

    def __init__(self) -> None:
        self.records = 0
        self.dropped = 0
        self.bytes = 0
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        data = self._tail + chunk
        end = data.rfind(b"\n") + 1
        whole, self._tail = data[:end], data[end:]
        lines = whole.count(b"\n")
        if b'{"dropped"' in whole:
            for line in whole.splitlines():
                if line.startswith(b'{"dropped"'):
                    self.dropped += int(json.loads(line)["dropped"])
                    lines -= 1
        self.records += lines

    def as_dict(self) -> dict[str, int]:
        return {"records": self.records, "dropped": self.dropped, "bytes": self.bytes}


def main(argv: list[str]) -> int:
    url = urllib.parse.urlsplit(argv[1])
    query = argv[2] if len(argv) > 2 else ""
    signal.signal(signal.SIGTERM, _stop)
    counts = Counts()
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=3600)
    try:
        conn.request("GET", "/log" + (f"?{query}" if query else ""))
        response = conn.getresponse()
        if response.status != 200:
            print(f"GET /log: {response.status} {response.read()[:200]!r}", flush=True)
            return 1
        print("ready", flush=True)
        while True:
            chunk = response.read1(65536)
            if not chunk:
                break
            counts.feed(chunk)
    except _Stop:
        pass
    finally:
        conn.close()
        print("READER " + json.dumps(counts.as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
