"""Site reports shaped as ``GET /sites/NAME.json`` answers them, for the
tests of the admin pages (the unit tier's and the browser's).

``busy_report`` is a site after some traffic: a rules file whose rule 2
never matches and whose rule 3's pattern is markup, a latency histogram
with hits, misses and passes in different buckets, and a few errors.
``quiet_report`` is a site that has had no request at all.
"""

from __future__ import annotations

from typing import Any

#: The bounds of the latency histogram, seconds (log-spaced, as the
#: observe core gives them); each series has one count more (+Inf).
BOUNDS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]

#: When the busy report was made (2025-12-05 02:51:40 UTC).
GENERATED = 1764903100.5


def busy_report() -> dict[str, Any]:
    rules = "/etc/prexy/shop.rules"
    extra = "/etc/prexy/shared/cdn.rules"
    return {
        "site": "shop",
        "generated": GENERATED,
        "rule_sets": [rules, extra],
        "rules": [
            {"number": 1, "file": rules, "line": 3, "pattern": r"old\.example\.com", "flags": "g",
             "matches": 1_234_567, "responses": 40_210, "bytes_changed": 19_753_072,
             "last_fired": GENERATED - 0.4, "bailouts": 0, "timeouts": 0},
            {"number": 2, "file": rules, "line": 4, "pattern": "http://legacy.example/", "flags": "gi",
             "matches": 0, "responses": 0, "bytes_changed": 0,
             "last_fired": None, "bailouts": 0, "timeouts": 0},
            {"number": 3, "file": rules, "line": 7, "pattern": "<script>alert(1)</script>", "flags": "",
             "matches": 57, "responses": 12, "bytes_changed": 1_425,
             "last_fired": GENERATED - 3 * 3600 - 12, "bailouts": 2, "timeouts": 1},
            {"number": 4, "file": extra, "line": 1, "pattern": "cdn\\d+\\.old\\.example", "flags": "g",
             "matches": 3_020, "responses": 1_510, "bytes_changed": 48_320,
             "last_fired": GENERATED - 75, "bailouts": 0, "timeouts": 0},
            {"number": 5, "file": extra, "line": 2, "pattern": "\u202etxt.exe", "flags": "g",
             "matches": 4, "responses": 4, "bytes_changed": 32,
             "last_fired": GENERATED - 3 * 86400, "bailouts": 0, "timeouts": 0},
        ],
        "never_matched": [2, 5],
        "window": 1000,
        "requests": 48_211,
        "rewritten": 41_730,
        "bytes_out": 2_413_337_112,
        "bytes_in": 2_101_002_004,
        "upstream_seconds": 1_234.5,
        "rewrite_seconds": 61.25,
        "errors_by_class": {"4xx": 311, "5xx": 17, "upstream": 9},
        "cache": {"hit": 30_100, "miss": 12_900, "pass": 5_211, "hit_rate": 0.7},
        "latency": {
            "bounds": BOUNDS,
            "hit": [1_500, 4_000, 3_500, 12_000, 6_000, 2_500, 450, 100, 30, 10, 5, 3, 1, 1, 0, 0, 0],
            "miss": [0, 0, 0, 0, 50, 900, 3_500, 4_800, 2_400, 900, 250, 70, 20, 6, 3, 1, 0],
            "pass": [0, 0, 0, 0, 0, 200, 1_400, 2_100, 1_000, 400, 80, 20, 8, 2, 1, 0, 0],
        },
        "last_errors": [  # oldest first, as the observe core keeps them
            {"time": GENERATED - 300, "status": 503, "url": "/missing", "cache": "pass", "kind": "status"},
            {"time": GENERATED - 5, "status": 502, "url": "/cart?id=<b>1</b>&x=\"y\"",
             "cache": "miss", "kind": "upstream"},
        ],
    }


def quiet_report() -> dict[str, Any]:
    """A site with rules that has seen no request since start."""
    rules = "/etc/prexy/quiet.rules"
    return {
        "site": "quiet",
        "generated": GENERATED,
        "rule_sets": [rules],
        "rules": [
            {"number": 1, "file": rules, "line": 1, "pattern": "a", "flags": "g",
             "matches": 0, "responses": 0, "bytes_changed": 0,
             "last_fired": None, "bailouts": 0, "timeouts": 0},
        ],
        "never_matched": [1],
        "window": 1000,
        "requests": 0,
        "rewritten": 0,
        "bytes_out": 0,
        "bytes_in": 0,
        "upstream_seconds": 0.0,
        "rewrite_seconds": 0.0,
        "errors_by_class": {"4xx": 0, "5xx": 0, "upstream": 0},
        "cache": {"hit": 0, "miss": 0, "pass": 0, "hit_rate": None},
        "latency": {"bounds": BOUNDS, "hit": [0] * 17, "miss": [0] * 17, "pass": [0] * 17},
        "last_errors": [],
    }
