"""The observe benchmark's own arithmetic, checked without running it:
what its log reader counts in a stream cut anywhere
(``bench/log_reader.py``), and the per-round ratios
(``bench/observe_bench.py``).  A miscount would make the scenario report
records lost or CPU ratios that are not there."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:  # the bench scripts import each other by top-level name
    sys.path.append(str(BENCH))

import log_reader  # noqa: E402
import observe_bench  # noqa: E402
from harness import WrkResult  # noqa: E402

RECORD = json.dumps({"time": 1.0, "site": "shop", "url": "/a", "status": 200, "rules": [1, 3]},
                    separators=(",", ":")).encode()


class LogReaderCountsTests(SynchronousTestCase):
    def stream(self) -> bytes:
        return b"\n".join([RECORD, RECORD, b'{"dropped": 17}', RECORD, b'{"dropped": 3}']) + b"\n" + RECORD + b"\n"

    def test_whole(self) -> None:
        """Records and dropped lines told apart; a dropped line is not a record."""
        counts = log_reader.Counts()
        counts.feed(self.stream())
        self.assertEqual(counts.as_dict(), {"records": 4, "dropped": 20, "bytes": len(self.stream())})

    def test_cut_anywhere(self) -> None:
        """The same counts whatever the cuts between reads (a line split
        across two reads counts once, when its end comes)."""
        data = self.stream()
        for size in (1, 2, 3, 7, 16, 50):
            counts = log_reader.Counts()
            for at in range(0, len(data), size):
                counts.feed(data[at:at + size])
            self.assertEqual((counts.records, counts.dropped), (4, 20), size)

    def test_unfinished_line_not_counted(self) -> None:
        counts = log_reader.Counts()
        counts.feed(RECORD + b"\n" + RECORD[:10])
        self.assertEqual(counts.records, 1)


def _result(cpu: float) -> WrkResult:
    return WrkResult(rps=1.0, p50_ms=1.0, p90_ms=1.0, p99_ms=1.0, requests=1, errors=0, non2xx=0,
                     cpu_us_per_req=cpu)


class PairedRatioTests(SynchronousTestCase):
    def test_median_of_rounds(self) -> None:
        """Each round's a/b, then their median; rounds without a figure left out."""
        a = _result(0.0)
        a.runs = [{"cpu_us_per_req": x} for x in (110.0, 200.0, 99.0, None)]
        b = _result(0.0)
        b.runs = [{"cpu_us_per_req": x} for x in (100.0, 100.0, 100.0, 100.0)]
        self.assertAlmostEqual(observe_bench._paired(a, b), 1.1)

    def test_missing_side(self) -> None:
        self.assertIsNone(observe_bench._paired(None, _result(1.0)))
