"""The cache's part in one request, without I/O: which way a request goes
(``route``), the coalescing flight that streams one upstream fetch to
every request that asked for the same object meanwhile (``Flight``), and
whether a fetch goes on once the client that made it went away
(``wanted``).

A flight's followers each read the body at their own pace: the flight
keeps the body's chunks (it keeps them anyway while the object may still
be stored), and a follower that cannot take more is paused at its offset
and resumed later, so one slow follower makes neither the others nor the
leader wait.  When the body outgrows what is kept, each follower may hold
at most ``FOLLOWER_BACKLOG`` bytes of its own; one that falls further
behind is reset rather than buffered without bound.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

import attrs

from prexy.cache.policy import Action

#: Bytes one follower may have pending once the flight no longer keeps
#: the body (it outgrew max_object_size).
FOLLOWER_BACKLOG = 1024 * 1024


class Route(enum.Enum):
    """Where the cache sends a request (not PURGE)."""

    #: Not cacheable (or an unsafe method that invalidated the URL): forward.
    BYPASS = "bypass"
    #: Known not storable for a while: forward, do not wait for others.
    HIT_FOR_MISS = "hit-for-miss"
    #: Fresh: answer from the store.
    HIT = "hit"
    #: Stale within grace: answer from the store, refresh in the background
    #: unless a refresh or fetch is already under way.
    GRACE = "grace"
    GRACE_REFRESH = "grace-refresh"
    #: A HEAD miss: forward, nothing to store.
    MISS_HEAD = "miss-head"
    #: A fetch of this key is streaming in this process: follow it.
    FOLLOW = "follow"
    #: A miss: claim the key and fetch (or wait for the worker that holds it).
    CLAIM = "claim"


@attrs.frozen
class Routed:
    route: Route
    #: The Cache-Status ``fwd`` of a forwarded request.
    fwd: str = "bypass"
    detail: str | None = None
    #: The stored object that answers (HIT, GRACE) or is to be revalidated.
    obj: Any = None


def route(
    action: Action, found: Any, now: float, method: bytes, reason: str | None, *,
    fetching: bool, refreshing: bool,
) -> Routed:
    """The way of a request the policy decided ``action`` on, given what the
    store ``found`` for it.  ``fetching``: a flight for its key is open in
    this process; ``refreshing``: a background refresh of it is running."""
    if action in (Action.INVALIDATE, Action.PASS) or found is None:
        return Routed(Route.BYPASS, "bypass", reason)
    obj = found.obj
    if obj is not None and obj.hit_for_miss:
        return Routed(Route.HIT_FOR_MISS, "miss", "hit-for-miss")
    if obj is not None and obj.fresh(now):
        return Routed(Route.HIT, obj=obj)
    fwd = "uri-miss" if not found.url_known else "vary-miss" if obj is None else "stale"
    if obj is not None and obj.in_grace(now):
        busy = refreshing or fetching
        return Routed(Route.GRACE if busy else Route.GRACE_REFRESH, fwd, obj=obj)
    if method == b"HEAD":
        return Routed(Route.MISS_HEAD, fwd, obj=obj)
    if fetching:
        return Routed(Route.FOLLOW, fwd, obj=obj)
    return Routed(Route.CLAIM, fwd, obj=obj)


class Wanted(enum.Enum):
    """Who still wants a fetch whose own client went away (``wanted``)."""

    #: Nobody: cancel the upstream request.
    NOBODY = "nobody"
    #: Requests of this process follow its flight.
    FOLLOWERS = "followers"
    #: Its answer is being stored (or, before the head, is to be).
    STORE = "store"


def wanted(*, followers: int, head: bool, claimed: bool, storing: bool) -> Wanted:
    """Whether an upstream fetch goes on without the client that made it.

    ``followers``: requests still following its flight; ``head``: the
    upstream's head arrived; ``claimed``: it is the fetch of a miss, holding
    the key's claim in the shared store; ``storing``: its body is being
    stored (the head was cacheable and the body is within max_object_size
    so far).

    Followers keep it going: one client hanging up must not cut the answer
    of the others.  So does the store, as in Varnish (the fetch of a
    cacheable object always completes, whatever its clients do) and nginx
    (``ngx_http_upstream_check_broken_connection`` keeps reading an upstream
    whose client closed while the response is ``cacheable``, before its head
    too): the next request is a hit, and the requests of other workers that
    wait on the claim are answered by this one fetch instead of each making
    its own.  Before the head, a claimed fetch goes on for that reason: URLs
    known not to be storable carry a hit-for-miss marker and never claim, so
    a claimed answer is usually stored.  Otherwise, and as soon as the head
    or the body's size says nothing will be stored, nobody wants it: the
    upstream request is cancelled rather than read for no one."""
    if followers > 0:
        return Wanted.FOLLOWERS
    # Before the head only the claim tells; from the head on, the store does.
    if (head and storing) or (not head and claimed):
        return Wanted.STORE
    return Wanted.NOBODY


class Follower(Protocol):
    """A request following a flight, as the flight sees it."""

    def send(self, data: bytes) -> None: ...

    def end(self) -> None: ...

    def reset(self) -> None: ...


class _Seat:
    """One follower's place in the flight."""

    __slots__ = ("follower", "offset", "paused", "pending", "done")

    def __init__(self, follower: Follower, offset: int) -> None:
        self.follower = follower
        #: Index of the next kept chunk this follower has not been sent.
        self.offset = offset
        self.paused = False
        #: Chunks for it alone, once the flight keeps none.
        self.pending: list[bytes] = []
        self.done = False


class Flight:
    """One upstream fetch for a key and its followers.

    ``start()`` when the head is known (followers attached before get their
    head then), ``data(chunk, keep)`` for each body chunk, then ``done()``
    or ``failed()``.  ``pause(f)`` / ``resume(f)`` come from a follower's
    connection."""

    def __init__(self) -> None:
        self.seats: dict[int, _Seat] = {}
        self.chunks: list[bytes] = []
        self.kept = True
        self.streaming = False
        self.ended = False
        self.open = True  # new followers may still attach

    def followers(self) -> list[Follower]:
        return [seat.follower for seat in self.seats.values() if not seat.done]

    def attach(self, follower: Follower) -> bool:
        """Add a follower; False when the flight can take no more (the body
        is no longer kept, or it ended)."""
        if not self.open:
            return False
        self.seats[id(follower)] = _Seat(follower, 0)
        if self.streaming:
            self._flush(self.seats[id(follower)])
        return True

    def detach(self, follower: Follower) -> None:
        """A follower went away."""
        seat = self.seats.pop(id(follower), None)
        if seat is not None:
            seat.done = True

    def start(self) -> None:
        """The head went to every follower: the body may flow."""
        self.streaming = True
        for seat in list(self.seats.values()):
            self._flush(seat)

    def data(self, chunk: bytes, keep: bool) -> None:
        if not chunk:
            return
        if keep and self.kept:
            self.chunks.append(chunk)
            for seat in list(self.seats.values()):
                self._flush(seat)
            return
        if self.kept:
            # From now on nothing is kept: each follower gets what it has not
            # had yet as its own pending bytes.
            self.kept = False
            self.open = False
            for seat in self.seats.values():
                seat.pending = self.chunks[seat.offset :]
            self.chunks = []
        for seat in list(self.seats.values()):
            seat.pending.append(chunk)
            self._flush(seat)

    def _flush(self, seat: _Seat) -> None:
        """Send a follower what it may have now."""
        if seat.done or not self.streaming:
            return
        follower = seat.follower
        if self.kept:
            chunks = self.chunks
            while not seat.paused and seat.offset < len(chunks) and not seat.done:
                seat.offset += 1
                follower.send(chunks[seat.offset - 1])
        else:
            while seat.pending and not seat.paused and not seat.done:
                follower.send(seat.pending.pop(0))
            if seat.pending and sum(map(len, seat.pending)) > FOLLOWER_BACKLOG:
                self.seats.pop(id(follower), None)
                seat.done = True
                follower.reset()
                return
        if self.ended and not seat.paused and not seat.done and self._caught_up(seat):
            seat.done = True
            self.seats.pop(id(follower), None)
            follower.end()
            if not self.seats:
                self.chunks = []  # nobody reads them any more

    def _caught_up(self, seat: _Seat) -> bool:
        return seat.offset >= len(self.chunks) if self.kept else not seat.pending

    def pause(self, follower: Follower) -> None:
        seat = self.seats.get(id(follower))
        if seat is not None:
            seat.paused = True

    def resume(self, follower: Follower) -> None:
        seat = self.seats.get(id(follower))
        if seat is not None:
            seat.paused = False
            self._flush(seat)

    def done(self) -> None:
        """The body is complete: followers end once they have all of it."""
        self.ended = True
        self.open = False
        for seat in list(self.seats.values()):
            self._flush(seat)
        if not self.seats:
            self.chunks = []

    def failed(self) -> list[Follower]:
        """The fetch broke: the followers still waiting (the caller answers
        them: the stale copy, an error, or a reset once streaming)."""
        self.open = False
        self.ended = True
        left = self.followers()
        for seat in self.seats.values():
            seat.done = True
        self.seats.clear()
        self.chunks = []
        return left

    def take_all(self) -> list[Follower]:
        """Every follower, out of the flight (the answer may not be shared:
        each fetches for itself)."""
        return self.failed()

    @property
    def idle(self) -> bool:
        """Ended, and every follower has had everything."""
        return self.ended and not self.seats
