"""The plans of two benchmark scenarios, checked without running them:
the page-view mix's site and request list (``bench/mix_bench.py``), and
the scaling scenario's worker counts and core layout
(``bench/scaling_bench.py``).  A wrong plan would make their figures
measure something else without failing."""

from __future__ import annotations

import collections
import functools
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:  # the bench scripts import each other by top-level name
    sys.path.append(str(BENCH))

import mix_bench  # noqa: E402
import scaling_bench  # noqa: E402


@functools.cache
def _site() -> mix_bench.Site:
    """The default site, built once (about a second)."""
    return mix_bench.make_site()


class MixSiteTests(SynchronousTestCase):
    """The mix's 2,000 URLs and its request list."""

    def setUp(self) -> None:
        self.site = _site()

    def test_same_seed_same_site(self) -> None:
        """The list is a function of the seed: every run plays the same views."""
        again = mix_bench.make_site()
        self.assertIsNot(again, self.site)
        self.assertEqual(again.requests, self.site.requests)
        self.assertEqual(again.assets, self.site.assets)
        self.assertNotEqual(mix_bench.make_site(views=10, seed=1).requests, self.site.requests[:310])

    def test_urls(self) -> None:
        """200 pages and 1,800 assets, each asset's size inside the bounds."""
        self.assertEqual(len(self.site.pages), mix_bench.PAGES)
        self.assertEqual(len(self.site.urls), 2000)
        self.assertEqual(len(set(self.site.urls)), 2000)
        for size in self.site.assets.values():
            self.assertTrue(mix_bench.MIN_ASSET <= size <= mix_bench.MAX_ASSET, size)

    def test_views(self) -> None:
        """Each view is its page, then 30 distinct assets, so many of each kind."""
        requests = self.site.requests
        per = mix_bench.REQUESTS_PER_VIEW
        self.assertEqual(len(requests), mix_bench.VIEWS * per)
        want = {kind.ext: kind.per_view for kind in mix_bench.KINDS}
        for start in range(0, len(requests), per):
            view = [path for path, _ in requests[start:start + per]]
            self.assertTrue(view[0].startswith("/p/"), view[0])
            assets = view[1:]
            self.assertEqual(len(set(assets)), mix_bench.ASSETS_PER_VIEW)
            kinds = collections.Counter(path.rsplit(".", 1)[1] for path in assets)
            self.assertEqual(dict(kinds), want)

    def test_misses(self) -> None:
        """About 5% of the requests are marked to miss."""
        share = sum(miss for _, miss in self.site.requests) / len(self.site.requests)
        self.assertTrue(0.04 <= share <= 0.06, share)

    def test_popularity_is_skewed(self) -> None:
        """Zipf: the 200 most requested URLs (a tenth) take over half the
        requests, and the most requested one far more than the median."""
        counts = sorted(collections.Counter(p for p, _ in self.site.requests).values(), reverse=True)
        self.assertGreater(sum(counts[:200]) / len(self.site.requests), 0.5)
        self.assertGreater(counts[0], 50 * counts[len(counts) // 2])


class ScalingPlanTests(SynchronousTestCase):
    """Worker counts and which cores the servers, the origin and wrk get."""

    def test_worker_counts(self) -> None:
        """1, N/4, N/2, N-4, deduplicated; 1 and 2 on small machines."""
        self.assertEqual(scaling_bench.worker_counts(2), [1, 2])
        self.assertEqual(scaling_bench.worker_counts(4), [1, 2])
        self.assertEqual(scaling_bench.worker_counts(8), [1, 2, 4])
        self.assertEqual(scaling_bench.worker_counts(16), [1, 4, 8, 12])
        self.assertEqual(scaling_bench.worker_counts(64), [1, 16, 32, 60])

    def test_layout(self) -> None:
        """From 8 cores the origin and wrk get two cores each, the servers
        the rest; below that nothing is pinned."""
        self.assertEqual(scaling_bench.layout([0, 1]), (None, None, None))
        self.assertEqual(scaling_bench.layout(list(range(16))), ("0-11", "12-13", "14-15"))
        self.assertEqual(scaling_bench.layout([0, 1, 2, 3, 8, 9, 10, 11, 12]), ("0-3,8", "9-10", "11-12"))
