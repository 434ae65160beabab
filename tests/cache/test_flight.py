"""The cache's routing of a request and the coalescing flight, without I/O:
every follower gets the whole body at its own pace; a slow one holds up
neither the others nor the fetch."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache import Action, flow
from prexy.cache.flow import Flight, Route, route

NOW = 1_000.0


@attrs.define
class Obj:
    fresh_until: float
    grace_until: float
    hit_for_miss: bool = False

    def fresh(self, now: float) -> bool:
        return now < self.fresh_until

    def in_grace(self, now: float) -> bool:
        return now < self.grace_until


@attrs.define
class Found:
    obj: Any
    url_known: bool = True
    key: bytes = b"k"


class RouteTests(SynchronousTestCase):
    def way(self, found: Any, method: bytes = b"GET", action: Action = Action.LOOKUP, **kw: bool) -> flow.Routed:
        args = {"fetching": False, "refreshing": False}
        args.update(kw)
        return route(action, found, NOW, method, "why", **args)

    def test_routes(self) -> None:
        fresh = Obj(NOW + 1, NOW + 2)
        grace = Obj(NOW - 1, NOW + 2)
        stale = Obj(NOW - 2, NOW - 1)
        self.assertEqual(self.way(None), flow.Routed(Route.BYPASS, "bypass", "why"))
        self.assertIs(self.way(Found(fresh), action=Action.PASS).route, Route.BYPASS)
        self.assertIs(self.way(Found(fresh), action=Action.INVALIDATE).route, Route.BYPASS)
        self.assertEqual(self.way(Found(Obj(0, 0, True))), flow.Routed(Route.HIT_FOR_MISS, "miss", "hit-for-miss"))
        self.assertEqual(self.way(Found(fresh)), flow.Routed(Route.HIT, obj=fresh))
        self.assertEqual(self.way(Found(grace)).route, Route.GRACE_REFRESH)
        self.assertEqual(self.way(Found(grace), refreshing=True).route, Route.GRACE)
        self.assertEqual(self.way(Found(grace), fetching=True).route, Route.GRACE)
        self.assertEqual(self.way(Found(stale)), flow.Routed(Route.CLAIM, "stale", obj=stale))
        self.assertEqual(self.way(Found(None, url_known=False)).fwd, "uri-miss")
        self.assertEqual(self.way(Found(None)).fwd, "vary-miss")
        self.assertIs(self.way(Found(None), method=b"HEAD").route, Route.MISS_HEAD)
        self.assertIs(self.way(Found(None), fetching=True).route, Route.FOLLOW)
        self.assertIs(self.way(Found(fresh), method=b"HEAD").route, Route.HIT)


class Reader:
    """A follower that records what it got."""

    def __init__(self, flight: Flight | None = None, pause_after: int | None = None) -> None:
        self.got: list[bytes] = []
        self.ended = False
        self.was_reset = False
        self.flight = flight
        self.pause_after = pause_after

    def send(self, data: bytes) -> None:
        assert not self.ended and not self.was_reset
        self.got.append(data)
        if self.pause_after is not None and len(self.got) >= self.pause_after and self.flight is not None:
            self.flight.pause(self)

    def end(self) -> None:
        self.ended = True

    def reset(self) -> None:
        self.was_reset = True

    @property
    def body(self) -> bytes:
        return b"".join(self.got)


class FlightTests(SynchronousTestCase):
    def test_followers_get_everything_and_end(self) -> None:
        f = Flight()
        early = Reader()
        f.attach(early)
        f.data(b"x", True)  # before the head: nothing is sent yet
        self.assertEqual(early.got, [])
        f.start()
        self.assertEqual(early.body, b"x")
        f.data(b"yz", True)
        late = Reader()
        self.assertTrue(f.attach(late))
        self.assertEqual(late.body, b"xyz")
        f.done()
        self.assertTrue(early.ended and late.ended)
        self.assertTrue(f.idle)
        self.assertEqual(f.chunks, [])
        self.assertFalse(f.attach(Reader()))

    def test_slow_follower_holds_up_nobody(self) -> None:
        """A paused follower stops at its offset; the others and the fetch
        go on; on resume it gets the rest and then its end."""
        f = Flight()
        f.start()
        slow = Reader(f, pause_after=1)
        fast = Reader()
        f.attach(slow)
        f.attach(fast)
        for piece in (b"a", b"b", b"c"):
            f.data(piece, True)
        f.done()
        self.assertEqual((fast.body, fast.ended), (b"abc", True))
        self.assertEqual((slow.body, slow.ended), (b"a", False))
        self.assertFalse(f.idle)
        slow.pause_after = None
        f.resume(slow)
        self.assertEqual((slow.body, slow.ended), (b"abc", True))
        self.assertTrue(f.idle)

    def test_detached_follower_gets_nothing_more(self) -> None:
        f = Flight()
        f.start()
        gone = Reader()
        f.attach(gone)
        f.data(b"a", True)
        f.detach(gone)
        f.data(b"b", True)
        f.done()
        self.assertEqual((gone.body, gone.ended), (b"a", False))

    def test_unkept_body_bounds_a_slow_follower(self) -> None:
        """Once the body is no longer kept (too large to store), no one new
        may attach, a follower keeps its own pending bytes, and one that
        falls FOLLOWER_BACKLOG behind is reset; the others get it all."""
        self.patch(flow, "FOLLOWER_BACKLOG", 10)
        f = Flight()
        f.start()
        slow = Reader(f, pause_after=1)
        fast = Reader()
        f.attach(slow)
        f.attach(fast)
        f.data(b"kept", True)
        f.data(b"12345", False)
        self.assertFalse(f.open)
        self.assertFalse(f.attach(Reader()))
        self.assertFalse(slow.was_reset)
        f.data(b"6789ab", False)  # 11 pending for the slow one
        self.assertTrue(slow.was_reset)
        f.data(b"cd", False)
        f.done()
        self.assertEqual((fast.body, fast.ended), (b"kept123456789abcd", True))
        self.assertTrue(f.idle)

    def test_failed_and_take_all(self) -> None:
        f = Flight()
        a, b = Reader(), Reader()
        f.attach(a)
        f.attach(b)
        self.assertEqual(f.failed(), [a, b])
        self.assertTrue(f.idle)
        self.assertFalse(f.attach(Reader()))
        g = Flight()
        g.attach(a)
        self.assertEqual(g.take_all(), [a])

    @settings(deadline=None, max_examples=300)
    @given(
        st.lists(st.binary(min_size=1, max_size=8), min_size=1, max_size=12),
        st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["pause", "resume", "data", "attach"])), max_size=40),
        st.integers(0, 11),
    )
    def test_any_interleaving(self, chunks: list[bytes], events: list[tuple[int, str]], unkept_from: int) -> None:
        """Whatever the order of pauses, resumes, attaches and chunks, every
        follower that was not reset ends with exactly the body, once it is
        resumed after the end; a follower attached late gets it from the
        start."""
        self.patch(flow, "FOLLOWER_BACKLOG", 10**9)
        f = Flight()
        f.start()
        readers = [Reader()]
        f.attach(readers[0])
        queue = list(chunks)
        sent = 0
        for who, what in events:
            if what == "attach":
                r = Reader()
                if f.attach(r):
                    readers.append(r)
                continue
            if what == "data":
                if queue:
                    f.data(queue.pop(0), sent < unkept_from)
                    sent += 1
                continue
            r = readers[who % len(readers)]
            (f.pause if what == "pause" else f.resume)(r)
        while queue:
            f.data(queue.pop(0), sent < unkept_from)
            sent += 1
        f.done()
        for r in readers:
            f.resume(r)
            self.assertFalse(r.was_reset)
            self.assertTrue(r.ended)
            self.assertEqual(r.body, b"".join(chunks))
        self.assertTrue(f.idle)
