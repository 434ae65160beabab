"""The shared LMDB store: round trips, streaming writers and their size
limit, Vary-aware lookup, purge and ban, LRU eviction within the byte bound,
expiry, persistence across reopen, and several processes reading and
writing one store at once."""

from __future__ import annotations

import marshal
import multiprocessing
import os
import struct
import tempfile
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.bans import Ban
from prexy.cache.policy import CachePolicy, cache_key, vary_key
from prexy.cache.store import FORMAT, ObjectMeta, Store, StoreError
from tests.cases import tmp_dir

NOW = 1_800_000_000.0
MiB = 1024 * 1024


class FakeClock:
    """A settable clock, like ``reactor.seconds``."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def key(url: bytes, vary: bytes = b"", version: str = "v1", site: str = "site") -> bytes:
    return cache_key(site, b"GET", url, vary, version)


def meta(url: bytes = b"/", ttl: float = 300.0, site: str = "site", **kw: Any) -> ObjectMeta:
    return ObjectMeta(200, [(b"Content-Type", b"text/html")], NOW, ttl, site=site, url=url, **kw)


def check_consistent(store: Store) -> None:
    """Every index agrees with the objects, and the byte and count totals add up."""
    env = store._env
    with env.begin() as txn:
        objs = {k: v for k, v in txn.cursor(db=store._obj)}
        idx = {k: v for k, v in txn.cursor(db=store._idx)}
        lru = [k for k, _ in txn.cursor(db=store._lru)]
        varies = [k for k, _ in txn.cursor(db=store._vary)]
    assert set(objs) == set(idx)
    assert sorted(k[8:] for k in lru) == sorted(idx)
    for k, v in idx.items():
        tick = struct.unpack_from("<Q", v, 0)[0]
        assert struct.pack(">Q", tick) + k in lru
    # A URL's Vary record lives exactly as long as one of its objects.
    assert sorted(varies) == sorted({k[:16] for k in objs})
    stats = store.stats()
    assert stats["count"] == len(objs)
    assert stats["bytes"] <= store.max_bytes
    for v in objs.values():
        (n,) = struct.unpack_from("<I", v, 0)
        marshal.loads(v[4 : 4 + n])


# -- basics -----------------------------------------------------------------------


def _child_put(path: str, urls: list[bytes], body: bytes) -> None:
    store = Store.open(path, 4 * MiB, clock=lambda: NOW)
    for url in urls:
        store.put(key(url), meta(url), body)
    store.close()


def _child_get(path: str, url: bytes, out: Any) -> None:
    store = Store.open(path, 4 * MiB, clock=lambda: NOW)
    obj = store.get(key(url))
    out.put(None if obj is None else obj.body)
    store.close()


def _child_churn(path: str, prefix: bytes, n: int) -> None:
    """Writes, overwrites, reads and purges in a small store (constant eviction)."""
    store = Store.open(path, 256 * 1024, clock=lambda: NOW)
    for i in range(n):
        url = b"/shared/%d" % (i % 40) if i % 2 else prefix + b"/%d" % i
        store.put(key(url), meta(url), prefix * (100 + i % 3000))
        obj = store.get(key(url))
        assert obj is None or obj.body[:1] in (b"a", b"b")
        if i % 97 == 0:
            store.purge_url("site", b"/shared/%d" % (i % 40))
    store.close()


def _child_grow(path: str) -> None:
    store = Store.open(path, 96 * MiB, clock=lambda: NOW)
    for i in range(80):
        store.put(key(b"/big/%d" % i), meta(b"/big/%d" % i), bytes([i]) * MiB)
    store.close()


def _child_claim(path: str, holder: bytes, out: Any) -> None:
    store = Store.open(path, 4 * MiB, clock=lambda: NOW)
    out.put(store.claim(key(b"/contended"), holder, 30.0))
    store.close()


class StoreTests(SynchronousTestCase):
    def open_store(self, path: str, clock: FakeClock) -> Store:
        """A 4 MiB store at ``path``, closed after the test."""
        store = Store.open(path, 4 * MiB, clock=clock)
        self.addCleanup(store.close)
        return store

    def test_decoded_objects_are_remembered_for_the_version_read(self) -> None:
        """A process remembers the objects it decoded, by the index entry
        it read them under (nothing tells it of writes): the same entry
        gives the same object, and any write to the key is seen at once:
        a new body under the same head and time, from this process or
        another one, a touch, a purge."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        k = key(b"/a")
        assert store.put(k, meta(b"/a"), b"first")
        first = store.get(k)
        assert first is not None and first.body == b"first"
        self.assertIs(store.get(k), first)  # decoded once
        assert store.put(k, meta(b"/a"), b"second")  # the same meta data, other bytes
        second = store.get(k)
        assert second is not None and second.body == b"second"
        self.assertIs(store.lookup("site", b"GET", b"/a", "v1", []).obj, second)
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=_child_put, args=(path, [b"/a"], b"child body"))
        p.start()
        p.join(60)
        self.assertEqual(p.exitcode, 0)
        third = store.get(k)
        assert third is not None and third.body == b"child body"
        clock.now += 10  # past touch_interval: this hit moves the key up the LRU, a new entry
        assert store.get(k) is third
        touched = store.get(k)
        assert touched is not None and touched is not third and touched.body == b"child body"
        assert store.purge_url("site", b"/a") == 1
        self.assertIsNone(store.get(k))
        self.assertIsNone(store.lookup("site", b"GET", b"/a", "v1", []).obj)

    def test_round_trip(self) -> None:
        """What is put comes back whole, with its accounted size."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        m = ObjectMeta(
            404, [(b"Content-Type", b"text/plain"), (b"X-A", b"1"), (b"X-A", b"2")], NOW - 3, 60.0,
            grace=10.0, keep=5.0, stale_if_error=100.0, site="s", url=b"host/x?y", vary=(b"accept-encoding",),
            phrase=b"Nope",
        )
        assert store.put(key(b"host/x?y"), m, b"body bytes")
        obj = store.get(key(b"host/x?y"))
        assert obj is not None
        assert (obj.status, obj.phrase, obj.body, obj.stored_at, obj.ttl) == (404, b"Nope", b"body bytes", NOW - 3, 60.0)
        assert obj.headers == ((b"Content-Type", b"text/plain"), (b"X-A", b"1"), (b"X-A", b"2"))
        assert (obj.grace, obj.keep, obj.stale_if_error, obj.site, obj.url) == (10.0, 5.0, 100.0, "s", b"host/x?y")
        assert obj.vary == (b"accept-encoding",) and not obj.hit_for_miss
        assert obj.size > len(b"body bytes")
        assert store.get(key(b"other")) is None
        assert store.stats()["count"] == 1
        check_consistent(store)

    def test_freshness_helpers(self) -> None:
        """fresh / in_grace / stale_usable_on_error / dead_at follow ttl, grace, stale-if-error and keep."""
        m = ObjectMeta(200, (), NOW, 10.0, grace=5.0, stale_if_error=30.0, keep=100.0)
        assert m.fresh(NOW + 9.9) and not m.fresh(NOW + 10)
        assert m.in_grace(NOW + 10) and m.in_grace(NOW + 14.9) and not m.in_grace(NOW + 15)
        assert m.stale_usable_on_error(NOW + 39) and not m.stale_usable_on_error(NOW + 40)
        assert m.dead_at() == NOW + 140
        assert m.age(NOW + 7.5) == 7.5 and m.age(NOW - 1) == 0
        assert m.remaining(NOW + 12) == -2

    def test_overwrite_and_delete(self) -> None:
        """A second put replaces the first; delete removes it; totals stay right."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        k = key(b"/a")
        store.put(k, meta(b"/a"), b"one")
        store.put(k, meta(b"/a"), b"two!")
        obj = store.get(k)
        assert obj is not None and obj.body == b"two!"
        assert store.stats()["count"] == 1
        check_consistent(store)
        assert store.delete(k)
        assert not store.delete(k)
        assert store.get(k) is None
        assert store.stats()["count"] == 0
        assert not store.lookup("site", b"GET", b"/a", "v1", []).url_known
        check_consistent(store)

    def test_writer_streams_and_commits(self) -> None:
        """A body written in chunks is invisible until commit, then whole."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        k = key(b"/s")
        w = store.writer(k, meta(b"/s"))
        for i in range(100):
            assert w.write(b"chunk%03d;" % i)
        assert w.length == 900
        assert store.get(k) is None
        assert w.commit()
        obj = store.get(k)
        assert obj is not None and obj.body == b"".join(b"chunk%03d;" % i for i in range(100))
        assert not w.write(b"late")

    def test_writer_abort(self) -> None:
        """An aborted writer stores nothing."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        w = store.writer(key(b"/x"), meta(b"/x"))
        w.write(b"partial")
        w.abort()
        assert not w.commit()
        assert store.get(key(b"/x")) is None

    def test_large_object_refused(self) -> None:
        """Past the limit write returns False, commit stores nothing; the caller streams on."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        w = store.writer(key(b"/big"), meta(b"/big"), limit=1000)
        assert w.write(b"x" * 600)
        assert not w.write(b"x" * 600)
        assert w.refused
        assert not w.write(b"x")
        assert not w.commit()
        assert store.get(key(b"/big")) is None
        # The store's own cap (max_bytes // 4) applies whatever the caller asks.
        w = store.writer(key(b"/big"), meta(b"/big"), limit=100 * MiB)
        assert not w.write(b"x" * (MiB + 1))
        assert not store.put(key(b"/big"), meta(b"/big"), b"x" * (MiB + 1))
        assert store.put(key(b"/ok"), meta(b"/ok"), b"x" * (MiB // 2))
        check_consistent(store)

    def test_hit_for_miss_marker(self) -> None:
        """A hit-for-miss marker is found like an object, flagged, without body or grace."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        k = key(b"/hfm")
        assert store.put_hit_for_miss(k, meta(b"/hfm", ttl=120.0, grace=10.0))
        obj = store.get(k)
        assert obj is not None and obj.hit_for_miss and obj.body == b"" and obj.grace == 0 and obj.ttl == 120

    def test_refresh_keeps_body(self) -> None:
        """After a 304, refresh gives the object new times and headers, same body."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        k = key(b"/r")
        store.put(k, meta(b"/r", ttl=10.0), b"payload")
        clock.now = NOW + 50
        assert store.refresh(k, ObjectMeta(200, [(b"ETag", b'"2"')], NOW + 50, 10.0, site="site", url=b"/r"))
        obj = store.get(k)
        assert obj is not None and obj.body == b"payload" and obj.stored_at == NOW + 50
        assert obj.headers == ((b"ETag", b'"2"'),)
        assert not store.refresh(key(b"/gone"), meta(b"/gone"))

    def test_dead_objects(self) -> None:
        """Stale objects are returned (grace, stale-if-error); dead ones are not, and expire() removes them."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        store.put(key(b"/a"), meta(b"/a", ttl=10.0, grace=5.0), b"a")
        store.put(key(b"/b"), meta(b"/b", ttl=100.0), b"b")
        clock.now = NOW + 12
        obj = store.get(key(b"/a"))
        assert obj is not None and not obj.fresh(clock.now) and obj.in_grace(clock.now)
        clock.now = NOW + 15
        assert store.get(key(b"/a")) is None
        assert store.expire() == 1
        assert store.stats()["count"] == 1
        check_consistent(store)

    def test_lookup_vary(self) -> None:
        """Lookup follows the URL's recorded Vary: same bucket hits, other bucket is a vary miss."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        gzip_client = [(b"Accept-Encoding", b"gzip, deflate")]
        plain_client: list[tuple[bytes, bytes]] = []
        first = store.lookup("site", b"GET", b"/v", "v1", gzip_client)
        assert first.obj is None and not first.url_known
        # Store the response (Vary: Accept-Encoding) under its variant key.
        k = cache_key("site", b"GET", b"/v", vary_key(b"Accept-Encoding", gzip_client), "v1")
        assert first.key != k  # Vary was unknown at lookup time
        store.put(k, meta(b"/v", vary=(b"accept-encoding",)), b"gzipped")
        hit = store.lookup("site", b"GET", b"/v", "v1", [(b"Accept-Encoding", b"gzip")])
        assert hit.obj is not None and hit.obj.body == b"gzipped" and hit.key == k
        assert hit.primary == k[:16]
        miss = store.lookup("site", b"GET", b"/v", "v1", plain_client)
        assert miss.obj is None and miss.url_known
        # Another rule-set version never sees the old rewrite.
        assert store.lookup("site", b"GET", b"/v", "v2", gzip_client).obj is None

    def test_lookup_vary_cookie_with_policy(self) -> None:
        """With the policy, a Vary: Cookie object is shared by visitors differing only in ignored cookies."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        policy = CachePolicy(ignore_cookies=("_ga*",))
        a = [(b"Cookie", b"_ga=1; lang=fr")]
        k = cache_key("site", b"GET", b"/c", vary_key(b"Cookie", a, policy), "v1")
        store.put(k, meta(b"/c", vary=(b"cookie",)), b"fr")
        found = store.lookup("site", b"GET", b"/c", "v1", [(b"Cookie", b"lang=fr; _ga=2")], policy=policy)
        assert found.obj is not None and found.obj.body == b"fr"

    def test_purge_url(self) -> None:
        """purge_url removes every variant and rule-set version of one URL, and nothing else."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        for vary in (b"", b"gzip", b"identity"):
            for version in ("v1", "v2"):
                store.put(key(b"/p", vary, version), meta(b"/p"), b"x")
        store.put(key(b"/p2"), meta(b"/p2"), b"y")
        store.put(key(b"/p", site="other"), meta(b"/p", site="other"), b"z")
        assert store.purge_url("site", b"/p") == 6
        assert store.get(key(b"/p2")) is not None
        assert store.get(key(b"/p", site="other")) is not None
        assert store.lookup("site", b"GET", b"/p", "v1", []).url_known is False
        assert store.purge_url("site", b"/p") == 0
        check_consistent(store)

    def test_ban(self) -> None:
        """ban removes the objects a Ban matches, of one site (or of all
        sites with None): its regex on the path and query of URLs stored
        with their host, its host on the host."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        for i in range(20):
            store.put(key(b"a.test/news/%d" % i), meta(b"a.test/news/%d" % i), b"n")
            store.put(key(b"a.test/blog/%d" % i), meta(b"a.test/blog/%d" % i), b"b")
        store.put(key(b"b.test/news/1"), meta(b"b.test/news/1"), b"b")
        store.put(key(b"a.test/news/1", site="other"), meta(b"a.test/news/1", site="other"), b"o")
        assert store.ban(Ban("site", target=r"^/news/1", host="A.test")) == 11  # 1 and 10..19
        assert store.get(key(b"a.test/news/2")) is not None
        assert store.get(key(b"b.test/news/1")) is not None
        assert store.get(key(b"a.test/news/1", site="other")) is not None
        assert store.ban(Ban(None, target="^/news/1")) == 2  # b.test's, and the other site's
        assert store.ban(Ban("site", target="^/nothing")) == 0
        assert store.ban(Ban("site", key_url="^a.test/news/")) == 9  # an older node's ban
        assert store.stats()["count"] == 20
        check_consistent(store)

    def test_eviction_keeps_bound_and_order(self) -> None:
        """Filling the store many times over never exceeds max_bytes; the least
        recently used go first, and a recently hit object survives."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = Store.open(path, 1 * MiB, clock=clock, touch_interval=1.0)
        body = b"x" * 3000
        store.put(key(b"/hot"), meta(b"/hot"), body)
        for i in range(2000):
            clock.now += 0.01
            assert store.put(key(b"/%d" % i), meta(b"/%d" % i), body)
            if i % 50 == 0:
                assert store.get(key(b"/hot")) is not None  # touched at most every 1 s
            assert store.stats()["bytes"] <= 1 * MiB
        stats = store.stats()
        assert 0.75 * MiB < stats["bytes"] <= 1 * MiB
        assert store.get(key(b"/hot")) is not None
        assert store.get(key(b"/0")) is None
        assert store.get(key(b"/1999")) is not None
        # What survives is the most recent suffix (LRU, not random).
        alive = [i for i in range(2000) if store.get(key(b"/%d" % i)) is not None]
        assert alive == list(range(alive[0], 2000))
        # The map really used stays near the bound (accounting is by pages).
        assert stats["map_used"] <= 2 * MiB
        check_consistent(store)
        store.close()

    def test_small_objects_bound(self) -> None:
        """Many small objects: the bound holds and the map stays near it."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = Store.open(path, 1 * MiB, clock=clock)
        for i in range(20000):
            store.put(key(b"/s%d" % i), meta(b"/s%d" % i), b"tiny body!!!")
        stats = store.stats()
        assert stats["bytes"] <= 1 * MiB and stats["count"] > 1000
        # Free pages come on top: measured ~1.25 x the bound plus about 1 MiB.
        assert stats["map_used"] <= 1.3 * MiB + 1.5 * MiB
        check_consistent(store)
        store.close()

    def test_survives_reopen(self) -> None:
        """Objects outlive the process that stored them (a worker restart or reload)."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = Store.open(path, 4 * MiB, clock=clock)
        store.put(key(b"/keep"), meta(b"/keep"), b"kept")
        store.close()
        store = Store.open(path, 4 * MiB, clock=clock)
        obj = store.get(key(b"/keep"))
        assert obj is not None and obj.body == b"kept"
        store.close()

    def test_reopen_smaller_evicts(self) -> None:
        """Reopening with a smaller bound evicts down to it."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = Store.open(path, 4 * MiB, clock=clock)
        for i in range(200):
            store.put(key(b"/%d" % i), meta(b"/%d" % i), b"x" * 10000)
        store.close()
        store = Store.open(path, 1 * MiB, clock=clock)
        assert store.stats()["bytes"] <= 1 * MiB
        check_consistent(store)
        store.close()

    def test_other_format_is_emptied(self) -> None:
        """A store written in another format is emptied on open, not misread."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = Store.open(path, 4 * MiB, clock=clock)
        store.put(key(b"/old"), meta(b"/old"), b"old")
        with store._env.begin(write=True) as txn:
            txn.put(b"format", b"prexy-cache/0", db=store._meta)
        store.close()
        store = Store.open(path, 4 * MiB, clock=clock)
        assert store.get(key(b"/old")) is None
        assert store.stats()["count"] == 0
        with store._env.begin() as txn:
            assert txn.get(b"format", db=store._meta) == FORMAT
        store.close()

    def test_cross_process_visibility(self) -> None:
        """An object stored by one process is a hit in another, both ways."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        # Never fork with an open LMDB environment: each child opens its own.
        ctx = multiprocessing.get_context("spawn")
        store = Store.open(path, 4 * MiB, clock=clock)
        p = ctx.Process(target=_child_put, args=(path, [b"/from-child"], b"child body"))
        p.start()
        p.join(30)
        assert p.exitcode == 0
        obj = store.get(key(b"/from-child"))
        assert obj is not None and obj.body == b"child body"
        store.put(key(b"/from-parent"), meta(b"/from-parent"), b"parent body")
        out = ctx.Queue()
        p = ctx.Process(target=_child_get, args=(path, b"/from-parent", out))
        p.start()
        assert out.get(timeout=30) == b"parent body"
        p.join(30)
        assert p.exitcode == 0
        # A purge in this process is seen by a new reader elsewhere.
        store.purge_url("site", b"/from-parent")
        p = ctx.Process(target=_child_get, args=(path, b"/from-parent", out))
        p.start()
        assert out.get(timeout=30) is None
        p.join(30)
        store.close()

    def test_concurrent_writers(self) -> None:
        """Two processes writing, overwriting, evicting and purging at once leave
        a consistent store within its bound."""
        path = str(tmp_dir(self) / "cache")
        # Never fork with an open LMDB environment: each child opens its own.
        ctx = multiprocessing.get_context("spawn")
        store = Store.open(path, 256 * 1024, clock=lambda: NOW)
        procs = [ctx.Process(target=_child_churn, args=(path, prefix, 1500)) for prefix in (b"a", b"b")]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        check_consistent(store)
        assert store.stats()["count"] > 0
        store.close()

    def test_env_var_free_paths(self) -> None:
        """Store.open creates the directory and rejects a non-positive bound."""
        tmp_path = tmp_dir(self)
        target = str(tmp_path / "a" / "b")
        Store.open(target, MiB).close()
        assert os.path.isdir(target)
        with self.assertRaises(ValueError):
            Store.open(target, 0)
        blocker = tmp_path / "file"
        blocker.write_bytes(b"not a directory")
        with self.assertRaisesRegex(StoreError, "cannot open the cache store"):
            Store.open(str(blocker / "sub"), MiB)

    def test_adopts_map_grown_by_another_process(self) -> None:
        """A worker started with a bigger cache (after a reload) grows the map;
        workers still running adopt the new size instead of failing."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        # Never fork with an open LMDB environment: each child opens its own.
        ctx = multiprocessing.get_context("spawn")
        store = Store.open(path, 1 * MiB, clock=clock)
        store.put(key(b"/small"), meta(b"/small"), b"s")
        p = ctx.Process(target=_child_grow, args=(path,))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        obj = store.get(key(b"/big/79"))
        assert obj is not None and obj.body == bytes([79]) * MiB
        store.close()

    def test_clear_and_header(self) -> None:
        """clear empties everything; header() finds a stored header by lower-case name."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        store.put(key(b"/a"), meta(b"/a", vary=(b"accept-encoding",)), b"a")
        obj = store.get(key(b"/a"))
        assert obj is not None and obj.header(b"content-type") == b"text/html" and obj.header(b"etag") is None
        store.clear()
        assert store.get(key(b"/a")) is None and store.stats()["count"] == 0
        check_consistent(store)

    @settings(max_examples=40, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["put", "delete", "purge", "get"]),
                st.integers(0, 5),
                st.sampled_from([b"", b"gzip", b"br"]),
                st.binary(max_size=3000),
            ),
            max_size=40,
        )
    )
    def test_store_matches_a_dict(self, ops: list[tuple[str, int, bytes, bytes]]) -> None:
        """Any sequence of puts, deletes, purges and gets behaves like a dict
        (no eviction at this size) and leaves the indexes consistent."""
        with tempfile.TemporaryDirectory(dir="/tmp/") as tmp:
            store = Store.open(tmp, 16 * MiB, clock=lambda: NOW)
            model: dict[bytes, bytes] = {}
            for op, n, vary, body in ops:
                url = b"/u%d" % n
                k = key(url, vary)
                if op == "put":
                    assert store.put(k, meta(url), body)
                    model[k] = body
                elif op == "delete":
                    assert store.delete(k) == (k in model)
                    model.pop(k, None)
                elif op == "purge":
                    gone = [x for x in model if x[:16] == k[:16]]
                    assert store.purge_url("site", url) == len(gone)
                    for x in gone:
                        del model[x]
                else:
                    obj = store.get(k)
                    assert (obj.body if obj else None) == model.get(k)
            check_consistent(store)
            assert store.stats()["count"] == len(model)
            store.close()

    def test_claim_lease(self) -> None:
        """One holder at a time; the holder may renew; leases run out or are released."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        store = self.open_store(path, clock)
        k = key(b"/lease")
        assert not store.claimed(k)
        assert store.claim(k, b"w1", 10.0)
        assert store.claimed(k)
        assert not store.claim(k, b"w2", 10.0)
        assert store.claim(k, b"w1", 10.0)  # renew
        store.release(k, b"w2")  # not the holder: ignored
        assert store.claimed(k)
        store.release(k, b"w1")
        assert not store.claimed(k)
        assert store.claim(k, b"w2", 5.0)
        clock.now += 5
        assert not store.claimed(k)
        assert store.claim(k, b"w3", 5.0)  # a lease that ran out is taken over
        clock.now += 10
        store.expire()
        with store._env.begin() as txn:
            assert txn.get(k, db=store._busy) is None

    def test_claim_across_processes(self) -> None:
        """Of several processes claiming one key at once, exactly one wins."""
        path = str(tmp_dir(self) / "cache")
        # Never fork with an open LMDB environment: each child opens its own.
        ctx = multiprocessing.get_context("spawn")
        store = Store.open(path, 4 * MiB, clock=lambda: NOW)
        out = ctx.Queue()
        procs = [ctx.Process(target=_child_claim, args=(path, b"p%d" % i, out)) for i in range(3)]
        for p in procs:
            p.start()
        results = [out.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(30)
        assert sorted(results) == [False, False, True]
        assert store.claimed(key(b"/contended"))
        assert not store.claim(key(b"/contended"), b"parent", 1.0)
        store.close()
