"""The cluster's seams in the shell, in memory: a PURGE through the proxy is
applied at once and answered with the cluster's note when it fires (and
only then); the admin endpoint's /health, /metrics and /reload?cluster=1 with and without a cluster;
``POST /ban`` (the regex on the path and query, the host on its own, an
answer that says when nothing matched, the same ban published); a worker's relay answers on
the master's verdict or on its own timeout; the store target applies each
kind to the store."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from prexy.admin import AdminResource
from prexy.cache.bans import Ban
from prexy.cache.policy import CachePolicy, cache_key
from prexy.cache.store import ObjectMeta, Store
from prexy.cluster.messages import BanScope, Invalidation, Kind
from prexy.cluster.node import QUEUED_NOTE, StoreTarget, store_ban
from prexy.cluster.relay import WorkerRelay, from_json, to_json, verdict_key, verdict_of
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.metrics import Metrics
from prexy.proxy.caching import CacheLayer
from prexy.runtime import build_runtime
from tests.cases import tmp_dir, unlinked_store
from tests.proxy.support import Harness, parse_response


def cached_harness() -> Harness:
    site = SiteConfig("s", UpstreamURL.parse("http://o.test"), cache=CachePolicy(purge_from=("10.1.2.3",)))
    config = Config(listen=("tcp:0",), sites=(site,), default_site="s")
    h = Harness(config, build_runtime(config))
    store = unlinked_store("prexy-cluster-shell-", 16 << 20, h.clock.seconds)
    h.resource.cache = CacheLayer(h.clock, store, h.metrics)
    return h


def fill(h: Harness) -> None:
    h.send(b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n")
    h.conns[-1].reply(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok")
    h.settle()


class PurgeHookTests(SynchronousTestCase):
    def test_purge_waits_for_the_note(self) -> None:
        """Applied locally at once; answered with the note once it fires."""
        h = cached_harness()
        fill(h)
        announced: list[Invalidation] = []
        note: defer.Deferred[bytes] = defer.Deferred()

        def announce(inv: Invalidation) -> defer.Deferred[bytes]:
            announced.append(inv)
            return note

        h.resource.cache.announce = announce
        _, client = h.send(b"PURGE /p HTTP/1.1\r\nHost: x\r\n\r\n")
        h.settle()
        self.assertEqual(announced, [Invalidation.purge("s", b"x/p")])
        self.assertEqual(client.value(), b"", "no answer before the note")
        self.assertEqual(h.resource.cache.store.purge_url("s", b"x/p"), 0, "already gone locally")
        note.callback(b"cluster: applied by all 2 other node(s)\n")
        status, _, body = parse_response(client.value())
        self.assertEqual((status, body), (200, b"purged 1 object(s)\ncluster: applied by all 2 other node(s)\n"))

    def test_client_gone_before_the_note(self) -> None:
        """A client that hung up meanwhile gets nothing written, and nothing breaks."""
        h = cached_harness()
        note: defer.Deferred[bytes] = defer.Deferred()
        h.resource.cache.announce = lambda inv: note
        _, client = h.send(b"PURGE /p HTTP/1.1\r\nHost: x\r\n\r\n")
        client.loseConnection()
        note.callback(b"late\n")
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_no_cluster_unchanged(self) -> None:
        h = cached_harness()
        fill(h)
        _, client = h.send(b"PURGE /p HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(parse_response(client.value())[2], b"purged 1 object(s)\n")


class FakeCluster:
    def __init__(self) -> None:
        self.published: list[Invalidation] = []

    def publish(self, inv: Invalidation) -> defer.Deferred[bytes]:
        self.published.append(inv)
        return defer.succeed(b"cluster: applied by all 1 other node(s)\n")

    def health(self) -> str:
        return "cluster: live, node a"

    def gauges(self) -> dict[str, float]:
        return {"prexy_cluster_up": 1.0}


class Owner:
    def __init__(self, cluster: FakeCluster | None, store: Any = None) -> None:
        self.cluster = cluster
        self.announce = cluster.publish if cluster is not None else None
        self.metrics = Metrics()
        self.reloads = 0
        self.store = store
        self.reactor: Any = None
        self.config: Config | None = None

    def reload(self) -> bool:
        self.reloads += 1
        return True

    def cache_store(self) -> Any:
        return self.store


def render(owner: Owner, method: bytes, path: bytes, args: dict[bytes, list[bytes]] | None = None) -> DummyRequest:
    request = DummyRequest([])
    request.method = method
    request.path = path
    request.args = args or {}
    result = AdminResource(owner).render(request)
    if isinstance(result, bytes):
        request.write(result)
        request.finish()
    return request


class AdminTests(SynchronousTestCase):
    def test_health(self) -> None:
        """/health: ok, and the cluster's line when there is one."""
        self.assertEqual(b"".join(render(Owner(None), b"GET", b"/health").written), b"ok\n")
        self.assertEqual(b"".join(render(Owner(FakeCluster()), b"GET", b"/health").written),
                         b"ok\ncluster: live, node a\n")

    def test_metrics_gauges(self) -> None:
        text = b"".join(render(Owner(FakeCluster()), b"GET", b"/metrics").written)
        self.assertIn(b"prexy_cluster_up 1.0", text)

    def test_cluster_reload(self) -> None:
        """/reload?cluster=1 reloads here, then publishes the reload."""
        cluster = FakeCluster()
        owner = Owner(cluster)
        request = render(owner, b"POST", b"/reload", {b"cluster": [b"1"]})
        self.assertEqual(owner.reloads, 1)
        self.assertEqual(cluster.published, [Invalidation.reload()])
        self.assertEqual(b"".join(request.written), b"cluster: applied by all 1 other node(s)\nreloaded\n")

    def test_cluster_reload_without_cluster(self) -> None:
        """A node in no cluster reloads itself and says so with a 409."""
        owner = Owner(None)
        request = render(owner, b"POST", b"/reload", {b"cluster": [b"1"]})
        self.assertEqual((owner.reloads, request.responseCode), (1, 409))
        self.assertEqual(b"".join(request.written), b"this node is in no cluster: reloaded here only\nreloaded\n")


class SyncPool:
    """Runs the work at once (what deferToThreadPool needs of a pool)."""

    def callInThreadWithCallback(self, on_result: Any, f: Any, *args: Any, **kw: Any) -> None:
        on_result(True, f(*args, **kw))


class SyncReactor:
    def getThreadPool(self) -> SyncPool:
        return SyncPool()

    def callFromThread(self, f: Any, *args: Any) -> None:
        f(*args)


class BanAdminTests(SynchronousTestCase):
    """``POST /ban``: the regex on the path and query, the host on its own,
    an answer that says when nothing matched, the same ban published."""

    def owner(self, cluster: FakeCluster | None = None) -> Owner:
        store = Store.open(str(tmp_dir(self) / "cache"), 16 << 20, clock=lambda: 1000.0)
        self.addCleanup(store.close)
        for site, url in (("a", b"a.test/obj"), ("a", b"a.test/obj/2?x=1"), ("a", b"www.a.test/obj"),
                          ("a", b"a.test/other"), ("b", b"b.test/obj")):
            store.put(cache_key(site, b"GET", url, b"", "v"), ObjectMeta(200, (), 1000.0, 60.0, site=site, url=url), b"x")
        owner = Owner(cluster, store)
        owner.reactor = SyncReactor()
        owner.config = Config(listen=("tcp:0",), sites=(
            SiteConfig("a", UpstreamURL.parse("http://o.test")), SiteConfig("b", UpstreamURL.parse("http://o.test"))),
            default_site="a")
        return owner

    def ban(self, owner: Owner, **args: str) -> tuple[int, bytes]:
        request = render(owner, b"POST", b"/ban", {k.encode(): [v.encode()] for k, v in args.items()})
        return request.responseCode or 200, b"".join(request.written)

    def test_regex_on_path_and_query(self) -> None:
        """``regex=^/obj&site=a`` bans the /obj objects of site a, whatever
        their host; the next one matches nothing and says so (200)."""
        owner = self.owner()
        self.assertEqual(self.ban(owner, regex="^/obj", site="a"), (200, b"banned 3 object(s)\n"))
        self.assertEqual(self.ban(owner, regex="^/obj", site="a"), (
            200, b"banned 0 object(s): no stored object matched (site a, path and query ~ '^/obj'); "
                 b"the regex is searched in the path and query, the host is given with host= or host_regex=\n"))
        self.assertEqual(owner.store.stats()["count"], 2)

    def test_host_selects(self) -> None:
        owner = self.owner()
        self.assertEqual(self.ban(owner, regex="^/obj", host="WWW.a.test"), (200, b"banned 1 object(s)\n"))
        self.assertEqual(self.ban(owner, host_regex=r"^www\.", site="a"), (200, b"banned 0 object(s): no stored object "
                         b"matched (site a, host ~ '^www\\.'); the regex is searched in the path and query, the host "
                         b"is given with host= or host_regex=\n"))
        self.assertEqual(self.ban(owner, host="a.test", site="a"), (200, b"banned 3 object(s)\n"))
        self.assertEqual(self.ban(owner, regex="^/obj", host_regex=r"^b\.test$"), (200, b"banned 1 object(s)\n"))
        self.assertEqual(owner.store.stats()["count"], 0)

    def test_refused(self) -> None:
        """Nothing to match, a bad regex, a bad host, an unknown site: 400,
        nothing banned; GET: 405."""
        owner = self.owner()
        for args, says in (({}, b"a ban needs a regex"), ({"regex": "("}, b"bad regex"),
                           ({"host": "a b"}, b"bad host"), ({"host_regex": "["}, b"bad regex"), ({"regex": "^/", "site": "c"}, b"no site named 'c' (sites: a, b)")):
            code, body = self.ban(owner, **args)
            self.assertEqual(code, 400, args)
            self.assertIn(says, body)
        self.assertEqual(render(owner, b"GET", b"/ban").responseCode, 405)
        self.assertEqual(owner.store.stats()["count"], 5)

    def test_cluster_publishes_the_same_ban(self) -> None:
        """The ban goes to the fleet as regex and host, marked as matched on
        the path and query, and the answer carries the fleet's note."""
        cluster = FakeCluster()
        owner = self.owner(cluster)
        code, body = self.ban(owner, regex="^/obj", host="a.test", site="a")
        self.assertEqual((code, body), (200, b"banned 2 object(s)\ncluster: applied by all 1 other node(s)\n"))
        self.ban(owner, host_regex="^www[.]")
        self.assertEqual(cluster.published, [Invalidation.ban("a", "^/obj", "a.test"),
                                             Invalidation.ban(None, None, host_regex="^www[.]")])
        self.assertEqual(cluster.published[0].scope, BanScope.TARGET)
        self.assertEqual(store_ban(cluster.published[0]), Ban("a", target="^/obj", host="a.test"))
        self.assertEqual(store_ban(cluster.published[1]), Ban(None, host_regex="^www[.]"))


class WorkerRelayTests(SynchronousTestCase):
    class Events:
        def __init__(self) -> None:
            self.waiters: dict[bytes, list[Any]] = {}

        def wait(self, key: bytes, callback: Any) -> Any:
            self.waiters.setdefault(key, []).append(callback)
            return lambda: self.waiters.get(key, []).remove(callback) if callback in self.waiters.get(key, []) else None

        def arrive(self, key: bytes) -> None:
            for callback in self.waiters.pop(key, []):
                callback()

    def test_verdicts(self) -> None:
        """The master's datagram picks the note; the other waits are forgotten."""
        for verdict in ("all", "some", "queued"):
            clock, events, sent = Clock(), self.Events(), []
            relay = WorkerRelay(clock, sent.append, events, 3.0)
            d = relay(Invalidation.purge("s", b"x/p"))
            self.assertEqual(sent, [{"cluster": {"kind": "purge", "site": "s", "subject": "x/p"}, "ticket": 1}])
            self.assertNoResult(d)
            events.arrive(verdict_key(1, verdict))
            self.assertEqual(verdict_of(self.successResultOf(d)), verdict)
            self.assertEqual([k for k, v in events.waiters.items() if v], [])
            self.assertEqual(clock.getDelayedCalls(), [])

    def test_timeout(self) -> None:
        clock, events = Clock(), self.Events()
        d = WorkerRelay(clock, lambda m: None, events, 3.0)(Invalidation.ban(None, "^x"))
        clock.advance(3.0)
        self.assertEqual(self.successResultOf(d), b"cluster: no word from the master in 3 s\n")

    def test_json(self) -> None:
        """What a worker sends over the pipe round-trips; anything else is a ValueError."""
        for inv in (Invalidation.purge("s", b"h/\xe9"), Invalidation.ban(None, "^x"), Invalidation.reload(),
                    Invalidation.ban("s", None, "a.test"), Invalidation.ban(None, "^/x", host_regex="^a")):
            self.assertEqual(from_json(to_json(inv)), inv)
        for bad in (None, [], {"kind": "nope"}, {"kind": "ban", "site": 3, "subject": "x"},
                    {"kind": "ban", "subject": 5}):
            with self.assertRaises(ValueError):
                from_json(bad)
        self.assertEqual(verdict_of(QUEUED_NOTE), "queued")
        self.assertEqual(verdict_of(b"cluster: applied by 1 of 2 other node(s); not confirmed: b\n"), "some")
        self.assertEqual(verdict_of(b"cluster: applied by all 2 other node(s)\n"), "all")


class StoreTargetTests(SynchronousTestCase):
    def test_apply_each_kind(self) -> None:
        """purge_url, ban and clear reach the store (through the thread pool
        given as the reactor's); reload calls the owner's reload."""
        calls: list[Any] = []

        class FakeStore:
            def purge_url(self, site: str, url: bytes) -> int:
                calls.append(("purge", site, url))
                return 1

            def ban(self, ban: Ban) -> int:
                calls.append(("ban", ban))
                return 2

            def clear(self) -> None:
                calls.append(("clear",))

        class Pool:
            """Runs the work at once (what deferToThreadPool needs of a pool)."""

            def callInThreadWithCallback(self, on_result: Any, f: Any, *args: Any, **kw: Any) -> None:
                on_result(True, f(*args, **kw))

        class Reactor:
            def getThreadPool(self) -> Pool:
                return Pool()

            def callFromThread(self, f: Any, *args: Any) -> None:
                f(*args)

        reloads: list[bool] = []
        target = StoreTarget(Reactor(), FakeStore, lambda: reloads.append(True))
        self.assertEqual(self.successResultOf(target.apply(Invalidation.purge("s", b"x/p"))), 1)
        self.assertEqual(self.successResultOf(target.apply(Invalidation.ban(None, "^x"))), 2)
        self.assertEqual(self.successResultOf(target.apply(Invalidation.ban("s", None, "a.test"))), 2)
        older = Invalidation(Kind.BAN, "s", b"^a.test/x", scope=BanScope.KEY_URL)
        self.assertEqual(self.successResultOf(target.apply(older)), 2)
        # A ban no store can make (a bad host from a foreign writer) is skipped.
        self.assertEqual(self.successResultOf(target.apply(Invalidation.ban("s", "^/x", "a b"))), 0)
        self.successResultOf(target.flush())
        self.successResultOf(target.apply(Invalidation.reload()))
        self.assertEqual(calls, [
            ("purge", "s", b"x/p"), ("ban", Ban(None, target="^x")), ("ban", Ban("s", host="a.test")),
            ("ban", Ban("s", key_url="^a.test/x")), ("clear",),
        ])
        self.assertEqual(reloads, [True])
        nothing = StoreTarget(Reactor(), lambda: None, lambda: None)
        self.assertEqual(self.successResultOf(nothing.apply(Invalidation.purge("s", b"x"))), 0)
        self.assertIs(Invalidation.reload().kind, Kind.RELOAD)
