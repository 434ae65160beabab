"""The upstream latency histogram's buckets."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.metrics import LATENCY_BUCKETS, Metrics


class MetricsTests(SynchronousTestCase):
    def test_latency_goes_to_the_first_bound_not_below_it(self) -> None:
        """A time equal to a bound counts in that bound's bucket, one just above
        in the next; past every bound it counts in the +Inf bucket."""
        m = Metrics()
        m.observe_upstream(0.0)
        m.observe_upstream(LATENCY_BUCKETS[0])
        m.observe_upstream(LATENCY_BUCKETS[0] * 1.0001)
        m.observe_upstream(LATENCY_BUCKETS[-1])
        m.observe_upstream(LATENCY_BUCKETS[-1] + 1)
        expected = [0] * (len(LATENCY_BUCKETS) + 1)
        expected[0] = 2
        expected[1] = 1
        expected[len(LATENCY_BUCKETS) - 1] = 1
        expected[len(LATENCY_BUCKETS)] = 1
        assert m.latency_buckets == expected
        assert m.latency_count == 5
