"""The soak harness's own expectations (``bench/soak.py``), checked without
running it: what it expects each rewritten page to be is what Prexy's
transducer makes of it under each generation's rules (fed whole and in
small pieces), and the configuration it writes for a node (with the keys
``--set`` adds or replaces) is one Prexy accepts.  A wrong expectation
would report wrong bytes that Prexy never sent, or miss the ones it did."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from prexy.config import parse_config
from prexy.substitution.rules import parse_rules
from prexy.substitution.transducer import Transducer

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:  # the bench scripts import each other by top-level name
    sys.path.append(str(BENCH))

import soak  # noqa: E402

PAGES = ("/p/2", "/p/37", "/np/3", "/gz/7", "/gz/49", "/probe")


class ExpectedRewriteTests(SynchronousTestCase):
    def test_pages_carry_every_rule(self) -> None:
        """Each page has something for every rule to do (else a reload
        would change nothing the check could see)."""
        for path in PAGES[:-1]:
            body = soak.resource(path)[2]
            for mark in (b"origin-shop.com", b"SOAKGEN", b"UA-31415926-2"):
                self.assertIn(mark, body, path)
        self.assertIn(b"Widget", soak.resource("/p/37")[2])

    def test_transducer_agrees(self) -> None:
        """Prexy's transducer, under generations 0 to 3 (odd ones have one
        rule more), makes of each page exactly what the harness expects,
        whole and fed 1000 bytes at a time; the generation is in the page."""
        for gen in range(4):
            rules = parse_rules(soak.rules_text(gen), f"gen{gen}.rules")
            for path in PAGES:
                body = soak.resource(path)[2]
                want = soak.rewritten(path, gen)
                self.assertEqual(Transducer(rules).finish(body), want, (gen, path))
                t = Transducer(rules)
                out = b"".join(t.feed(body[i:i + 1000]) for i in range(0, len(body), 1000)) + t.finish()
                self.assertEqual(out, want, (gen, path))
                self.assertEqual({int(m) for m in soak.GEN_RE.findall(want)}, {gen}, path)
            self.assertEqual(soak.rewritten("/p/37", gen).count(b"Gadget") > 0, gen % 2 == 1)

    def test_large_page(self) -> None:
        """The 1 MB page too, in 64 KiB pieces."""
        rules = parse_rules(soak.rules_text(1), "gen1.rules")
        body = soak.resource("/p/0")[2]
        self.assertGreater(len(body), 1_000_000)
        t = Transducer(rules)
        out = b"".join(t.feed_slices(body)) + t.finish()
        self.assertEqual(out, soak.rewritten("/p/0", 1))

    def test_binary_untouched(self) -> None:
        """Binary bodies are not of the rules' type: expected as they are."""
        self.assertEqual(soak.rewritten("/bin/3", 5), soak.resource("/bin/3")[2])
        self.assertFalse(parse_rules(soak.rules_text(0), "r.rules").applies_to("image/png"))


class NodeConfigTests(SynchronousTestCase):
    def test_accepted_with_set_keys(self) -> None:
        """The node's configuration loads; ``--set`` replaces a key of a
        table and adds new tables."""
        directory = Path(self.mktemp())
        directory.mkdir()
        (directory / "site.rules").write_text(soak.rules_text(0))
        settings = soak.Settings(dir=str(directory), sets=['cache.size="48M"', "http2.max_concurrent_streams=64"])
        run = soak.Soak(settings)
        node = soak.Node("a", directory, 20001, 20002, 20003)
        text = run.config_text(node, 20004, 20005)
        self.assertEqual(text.count("size = "), 1)
        config = parse_config(text, str(directory / "prexy.toml"))
        self.assertEqual(config.cache_size, 48 * 1024 * 1024)
        self.assertEqual([s.name for s in config.sites], [soak.SITE])
        self.assertEqual(config.workers, 2)


class PercentileTests(SynchronousTestCase):
    def test_nearest_rank(self) -> None:
        values = [float(v) for v in range(1, 101)]
        self.assertEqual(soak.percentile(values, 99), 99.0)
        self.assertEqual(soak.percentile(values, 50), 50.0)
        self.assertEqual(soak.percentile([], 99), 0.0)


class MemoryJudgingTests(SynchronousTestCase):
    """A process's memory is judged from its warm-up on: for a worker,
    once its memos stopped filling, since until then they grow by design."""

    def soak(self) -> soak.Soak:
        directory = Path(self.mktemp())
        directory.mkdir()
        return soak.Soak(soak.Settings(dir=str(directory), warmup=60, replacement_warmup=30, window=30))

    def add(self, run: soak.Soak, name: str, first: float, last: float, anon: Callable[[float], float],
            memo: Callable[[float], float] | None) -> None:
        run.proc_info[name] = {"node": "a", "role": "worker", "pid": 1, "first": first, "last": last,
                               "initial": first == 0}
        ts = [first + 5 * k for k in range(int((last - first) / 5) + 1)]
        run.samples[name] = [(t, int(anon(t) + 100), int(anon(t)), 0, 20, int(anon(t) + 100)) for t in ts]
        if memo is not None:
            run.memo_samples[name] = [(t, memo(t)) for t in ts]

    def test_warm_when_memos_stop_filling(self) -> None:
        run = self.soak()
        # Memos fill for 200 s, then hold: the worker is warm at 180 s
        # (90% of the most they held), not at its 30-s warm-up.
        self.add(run, "a worker 2", 100, 700, lambda t: 1000, lambda t: min(t - 100, 200) * 1000.0)
        self.assertEqual(run.warm_from("a worker 2", run.proc_info["a worker 2"]), 280)

    def test_growth_while_filling_is_not_judged_growth_after_is(self) -> None:
        run = self.soak()
        # Grows with its memos until 200 s, flat after: held.
        self.add(run, "a worker 2", 0, 600, lambda t: 40_000 + 200 * min(t, 200),
                 lambda t: 200.0 * min(t, 200) * 1024)
        # Same, but still growing by 20% after its memos are full: a leak.
        self.add(run, "a worker 3", 0, 600, lambda t: 40_000 + 200 * min(t, 200) + max(0, t - 200) * 40,
                 lambda t: 200.0 * min(t, 200) * 1024)
        # Killed while its memos fill: not judged.
        self.add(run, "a worker 4", 300, 480, lambda t: 40_000 + 200 * (t - 300),
                 lambda t: 200.0 * (t - 300) * 1024)
        rows = {r["process"]: r for r in run.memory_rows()[0]}
        self.assertTrue(rows["a worker 2"]["judged"])
        self.assertTrue(rows["a worker 2"]["anon_held"])
        self.assertFalse(rows["a worker 3"]["anon_held"])
        self.assertFalse(rows["a worker 4"]["judged"])
        self.assertGreater(rows["a worker 4"]["warm_s"], 150)

    def test_without_memo_samples_the_fixed_warm_up(self) -> None:
        run = self.soak()
        self.add(run, "a master 1", 0, 600, lambda t: 40_000, None)
        self.assertEqual(run.warm_from("a master 1", run.proc_info["a master 1"]), 60)

    def test_process_memo_from_metrics(self) -> None:
        text = ('# HELP prexy_process_memo_bytes x\n# TYPE prexy_process_memo_bytes gauge\n'
                'prexy_process_memo_bytes{process="worker-0"} 1.5e+07\n'
                'prexy_process_memo_bytes{process="worker-1"} 2048.0\n'
                'prexy_memo_bytes{memo="objects"} 9.0\n')
        self.assertEqual(soak.process_memo(text), {"worker-0": 1.5e7, "worker-1": 2048.0})
