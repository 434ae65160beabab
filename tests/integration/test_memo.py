"""The workers' memo budget through ``twistd prexy --workers 2``: each
worker reports what its memos hold, the master's ``/metrics`` sums them
by memo, within the budget ``[cache] memo_size`` gives each worker."""

from __future__ import annotations

import os
from typing import Any

import pytest
import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import defer, reactor, task

from .conftest import Cleanups
from .origin import listen_origin
from .test_service import RawClient, connect
from .twistd_support import Twistd, free_port, scratch_dir


class TestMemoBudget:
    @pytest.fixture(autouse=True)
    def served(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup
        self.origin, upstream = listen_origin(cleanup)
        self.dir = scratch_dir("prexy-memo-")
        self.port, self.admin = free_port(), free_port()
        self.config = os.path.join(self.dir, "prexy.toml")
        with open(self.config, "w") as f:
            f.write(f"""[server]
listen = ["tcp:{self.port}:interface=127.0.0.1"]
admin = "tcp:{self.admin}:interface=127.0.0.1"
access_log = "off"
applicability_memory = "1M"
[cache]
size = "16M"
path = "{self.dir}/store"
memo_size = "4M"
[sites.s]
upstream = "{upstream}"
""")

    @defer.inlineCallbacks
    def get(self, path: bytes, extra: bytes = b"") -> Any:
        client = RawClient(b"GET " + path + b" HTTP/1.1\r\nHost: s\r\nConnection: close\r\n" + extra + b"\r\n")
        yield connect(self.port, client)
        return bytes(client.data)

    @defer.inlineCallbacks
    def metrics(self) -> Any:
        client = RawClient(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        yield connect(self.admin, client)
        body = bytes(client.data).decode().partition("\r\n\r\n")[2]
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body) for s in f.samples
        }

    @pytest_twisted.inlineCallbacks
    def test_memo_bytes_summed_within_the_budget(self) -> Any:
        child = Twistd("--config", self.config, "--workers", "2")
        self.cleanup(child.stop)
        yield child.ready()
        # Hits (a miss first) on a few pages, whole and ranged: what the
        # workers keep of them is in their memos.
        for i in range(6):
            for extra in (b"", b"", b"Range: bytes=0-3\r\n"):
                answer = yield self.get(b"/c/p%d" % i, extra)
                assert answer.startswith((b"HTTP/1.1 200", b"HTTP/1.1 206")), answer[:100]
        from prexy.worker import METRICS_INTERVAL

        give_up = reactor.seconds() + 15
        while True:
            got = yield self.metrics()
            objects = got.get(("prexy_memo_bytes", (("memo", "objects"),)), 0)
            if objects > 0 and got.get(("prexy_memo_max_bytes", ())) == 2 * 4 * 1024 * 1024:
                break
            assert reactor.seconds() < give_up, got
            yield task.deferLater(reactor, METRICS_INTERVAL / 4, lambda: None)
        used = sum(v for (name, _), v in got.items() if name == "prexy_memo_bytes")
        assert 0 < used <= 2 * 4 * 1024 * 1024
        assert got[("prexy_applicability_max_bytes", ())] == 2 * 1024 * 1024
        assert ("prexy_applicability_bytes", ()) in got
