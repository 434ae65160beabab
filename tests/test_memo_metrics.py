"""The memos' budget in a running service and in ``/metrics``: a worker's
store objects, compressed variants and hit answers draw on the one
``[cache] memo_size`` budget; ``prexy_memo_bytes{memo=...}`` and the
applicability memory's bytes are reported by each worker and summed by
the master, and a worker that ended no longer counts in them."""

from __future__ import annotations

import os
from typing import Any

import attrs
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Config, load_config
from prexy.metrics import Metrics
from prexy.runtime import build_runtime
from prexy.workers import MasterService, Validated, _WorkerProcess
from tests.test_reload import _config, _Pipe


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text, by name and labels."""
    out = {}
    for family in text_string_to_metric_families(text.decode("utf-8")):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def helps(text: bytes) -> dict[str, str]:
    return {f.name: f.documentation for f in text_string_to_metric_families(text.decode("utf-8"))}


class _Datagrams:
    """A datagram port that sends nothing (the workers' key events)."""

    def write(self, data: bytes, path: str) -> None:
        pass

    def stopListening(self) -> None:  # noqa: N802
        pass


class _Reactor(MemoryReactorClock):
    def listenUNIXDatagram(self, path: str, protocol: Any) -> _Datagrams:  # noqa: N802
        return _Datagrams()


class ServiceMemoTests(SynchronousTestCase):
    def write(self, memo_size: str, applicability: str) -> str:
        if not hasattr(self, "tmp"):
            self.tmp = self.mktemp()
            os.makedirs(self.tmp)
        path = os.path.join(self.tmp, "prexy.toml")
        with open(path, "w") as f:
            f.write(f'[server]\nlisten = ["tcp:0"]\napplicability_memory = "{applicability}"\n'
                    f'[cache]\nsize = "16M"\npath = "{self.tmp}/cache"\nmemo_size = "{memo_size}"\n'
                    '[sites.s]\nupstream = "http://o"\n')
        return path

    def service(self, memo_size: str = "2M", applicability: str = "1M") -> Any:
        from prexy.service import ProxyService

        config = load_config(self.write(memo_size, applicability))
        service = ProxyService(_Reactor(), config, build_runtime(config), check_rules=False)
        service.startService()
        self.addCleanup(service.stopService)
        return service

    def test_the_three_memos_share_the_budget(self) -> None:
        """The store's decoded objects, the compressed variants and the hit
        path's answers are parts of the resource's one budget, which is
        ``[cache] memo_size``; the applicability memory has its own."""
        service = self.service()
        memos = service.resource.memos
        cache = service.resource.cache
        hits = service.site.hits
        self.assertEqual(memos.budget, 2 * 1024 * 1024)
        self.assertIs(cache.store._decoded.memos, memos)
        self.assertIs(cache.variants.memos, memos)
        self.assertIs(hits.ready.memos, memos)
        self.assertEqual(
            sorted(p.name for p in memos.parts), ["answers", "objects", "variants"],
        )
        self.assertEqual(service.resource.applicability.max_bytes, 1024 * 1024)

    def test_a_reload_resizes_both(self) -> None:
        """A reload with other sizes applies them to the running budgets:
        what no longer fits goes at once, least recently used first."""
        service = self.service()
        objects = service.resource.memos.part("objects")
        for i in range(40):
            objects.put(b"%d" % i, object(), 40_000)
        self.assertEqual(len(objects), 40)
        self.write("1M", "64k")
        self.assertTrue(service.reload())
        self.assertEqual(service.resource.memos.budget, 1 << 20)
        self.assertEqual(service.resource.applicability.max_bytes, 64 << 10)
        self.assertLessEqual(service.resource.memos.used, 1 << 20)
        self.assertIsNone(objects.get(b"0"))
        self.assertIsNotNone(objects.get(b"39"))

    def test_metrics_report_each_memo(self) -> None:
        """``/metrics`` of a process says each memo's bytes, their bound,
        and the applicability memory's bytes and bound, with HELP text."""
        service = self.service()
        memos = service.resource.memos
        memos.part("objects").put(b"k", object(), 10_000)
        service.resource.cache.variants.put((b"k", b"gzip"), (b"n", object()), 3_000)
        text = service.collect_metrics()
        got = samples(text)
        used = memos.used_by()
        self.assertEqual(got[("prexy_memo_bytes", (("memo", "objects"),))], used["objects"])
        self.assertEqual(got[("prexy_memo_bytes", (("memo", "variants"),))], used["variants"])
        self.assertEqual(got[("prexy_memo_bytes", (("memo", "answers"),))], 0)
        self.assertGreater(used["objects"], 10_000)
        self.assertEqual(got[("prexy_memo_max_bytes", ())], 2 * 1024 * 1024)
        self.assertEqual(got[("prexy_applicability_bytes", ())], 0)
        self.assertEqual(got[("prexy_applicability_max_bytes", ())], 1024 * 1024)
        self.assertEqual(got[("prexy_process_memo_bytes", (("process", "self"),))], memos.used)
        documented = helps(text)
        for name in ("prexy_memo_bytes", "prexy_memo_max_bytes", "prexy_applicability_bytes"):
            self.assertNotEqual(documented[name], name)
            self.assertIn("process", documented[name])


class MasterSumTests(SynchronousTestCase):
    """The master sums what its workers report (``Metrics.snapshot``)."""

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        config = _config("a")
        self.master = MasterService(
            self.reactor, Validated(config, {}), ["--config", "x"], 2,  # type: ignore[arg-type]
            lambda argv: Validated(config, {}),  # type: ignore[arg-type]
        )
        self.patch(self.master, "_spawn", lambda generation, slot: None)
        self.master.generation = 1
        self.workers = []
        for slot in range(2):
            w = _WorkerProcess(self.master, 1, slot)
            w.transport = _Pipe(2**22 + slot)  # type: ignore[assignment]
            w.pid = 2**22 + slot
            w.ready = True
            m = Metrics()
            m.count_status(200)
            m.gauges["prexy_open_connections"] = 3.0
            m.gauges["prexy_applicability_bytes"] = 1000.0 * (slot + 1)
            m.level("prexy_memo_bytes", 100.0 * (slot + 1), memo="objects")
            m.level("prexy_memo_bytes", 10.0 * (slot + 1), memo="answers")
            w.metrics = m.snapshot()
            self.workers.append(w)
        self.master.workers = list(self.workers)

    def test_workers_levels_are_summed(self) -> None:
        got = samples(self.master.collect_metrics())
        self.assertEqual(got[("prexy_memo_bytes", (("memo", "objects"),))], 300)
        self.assertEqual(got[("prexy_memo_bytes", (("memo", "answers"),))], 30)
        self.assertEqual(got[("prexy_applicability_bytes", ())], 3000)
        self.assertEqual(got[("prexy_open_connections", ())], 6)

    def test_each_workers_memos_by_process(self) -> None:
        """Beside the sums, each worker's own memo bytes (its warm-up ends
        when they stop growing), labelled as its other process levels."""
        got = samples(self.master.collect_metrics())
        self.assertEqual(got[("prexy_process_memo_bytes", (("process", "worker-0"),))], 110)
        self.assertEqual(got[("prexy_process_memo_bytes", (("process", "worker-1"),))], 220)
        self.assertNotIn(("prexy_process_memo_bytes", (("process", "master"),)), got)

    def test_an_ended_worker_keeps_its_counts_not_its_levels(self) -> None:
        """A worker that ended (killed) no longer holds memory nor
        connections: its levels leave the sums, its counts stay."""
        self.master.stopping = True  # (no replacement in this test)
        self.master.worker_ended(self.workers[1], Failure(Exception("killed")))
        got = samples(self.master.collect_metrics())
        self.assertEqual(got[("prexy_memo_bytes", (("memo", "objects"),))], 100)
        self.assertEqual(got[("prexy_memo_bytes", (("memo", "answers"),))], 10)
        self.assertEqual(got[("prexy_applicability_bytes", ())], 1000)
        self.assertEqual(got[("prexy_open_connections", ())], 3)
        self.assertEqual(got[("prexy_requests_total", (("status", "200"),))], 2)


class ConfigTests(SynchronousTestCase):
    def load(self, text: str) -> Config:
        tmp = self.mktemp()
        os.makedirs(tmp)
        path = os.path.join(tmp, "prexy.toml")
        with open(path, "w") as f:
            f.write(text + '\n[sites.s]\nupstream = "http://o"\n')
        return load_config(path)

    def test_defaults_and_values(self) -> None:
        config = self.load('[cache]\nsize = "64M"')
        self.assertEqual((config.memo_size, config.applicability_memory), (48 << 20, 8 << 20))
        self.assertEqual(attrs.fields(Config).memo_size.default, 48 << 20)
        config = self.load('[server]\napplicability_memory = "512k"\n[cache]\nsize = "64M"\nmemo_size = "16M"')
        self.assertEqual((config.memo_size, config.applicability_memory), (16 << 20, 512 << 10))
        self.assertEqual(self.load('[cache]\nmemo_size = 0').memo_size, 0)

    def test_bad_values_name_file_line_and_reason(self) -> None:
        from prexy.config import ConfigError

        for text, key, line in (
            ('[cache]\nsize = "64M"\nmemo_size = "lots"', "cache.memo_size", 3),
            ('[cache]\nmemo_size = -1', "cache.memo_size", 2),
            ('[server]\napplicability_memory = true', "server.applicability_memory", 2),
        ):
            with self.assertRaises(ConfigError) as caught:
                self.load(text)
            message = str(caught.exception)
            self.assertIn(f"prexy.toml:{line}", message)
            self.assertIn(key, message)
            self.assertIn("size", message)
