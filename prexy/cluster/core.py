"""The decisions of one cluster node, with no I/O: a state machine.

:class:`NodeCore` holds what a node knows about the shared log of
invalidations: its phase (connecting, catching up, live, down), its
position (the last entry it applied), what it published while Redis was
away (a bounded queue) and whether an outage was already reported.  The
Twisted shell (``prexy.cluster.node``) feeds it events (connected, entries
read, lost) and does what it answers.  :class:`Backoff` is the reconnect
schedule; :class:`Confirmations` tracks which live nodes still have to
acknowledge an entry this node added.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import attrs

from prexy.cluster.messages import (
    Invalidation,
    Kind,
    Message,
    MessageError,
    StreamId,
    format_id,
    parse_id,
)

__all__ = [
    "Phase", "InvalidMove", "NodeCore", "Received", "Backoff", "Confirmations", "Outcome",
    "parse_position", "parse_nodes", "node_value",
]


class Phase(enum.Enum):
    #: Never connected yet (a node that just started).
    IDLE = "idle"
    #: Opening the connections, subscribing, asking for the gap.
    CONNECTING = "connecting"
    #: Connected; reading the entries added since its position.
    CATCHING_UP = "catching-up"
    #: Caught up: new entries are read as their doorbell rings.
    LIVE = "live"
    #: Lost Redis (or never reached it); retrying with backoff.
    DOWN = "down"
    STOPPED = "stopped"


class InvalidMove(Exception):
    """An event that cannot happen in the current phase (a bug in the shell)."""


_MOVES: dict[tuple[Phase, str], Phase] = {
    (Phase.IDLE, "connect"): Phase.CONNECTING,
    (Phase.DOWN, "connect"): Phase.CONNECTING,
    (Phase.CONNECTING, "connected"): Phase.CATCHING_UP,
    (Phase.CATCHING_UP, "caught_up"): Phase.LIVE,
    (Phase.CONNECTING, "lost"): Phase.DOWN,
    (Phase.CATCHING_UP, "lost"): Phase.DOWN,
    (Phase.LIVE, "lost"): Phase.DOWN,
    **{(p, "stop"): Phase.STOPPED for p in Phase},
}


@attrs.frozen
class Received:
    """What a batch of read entries means: the messages to apply, in order,
    the new position, and how many were skipped by reason (``seen``: at or
    before the position; ``own``: this node's; ``old-reload``: a reload
    read while catching up at start; ``malformed``)."""

    apply: tuple[Message, ...]
    position: StreamId | None
    skipped: Mapping[str, int]


class NodeCore:
    """One node's phase, position, queue and outage bookkeeping."""

    def __init__(self, node: str, position: StreamId | None, queue_limit: int = 10_000) -> None:
        self.node = node
        self.phase = Phase.IDLE
        self.position = position
        self.queue: deque[Invalidation] = deque()
        self.queue_limit = queue_limit
        #: Invalidations dropped from a full queue (oldest first).
        self.dropped = 0
        #: Whether this node has ever been live (reloads read before are old).
        self.was_live = False
        #: When the current outage began (None while live or before the first try).
        self.down_since: float | None = None
        self._reported = False

    def move(self, event: str) -> Phase:
        try:
            self.phase = _MOVES[(self.phase, event)]
        except KeyError:
            raise InvalidMove(f"{event!r} in phase {self.phase.value}") from None
        return self.phase

    # -- the log --------------------------------------------------------------

    def read_from(self) -> bytes:
        """The id to read after (XREAD's exclusive start)."""
        return format_id(self.position) if self.position is not None else b"0-0"

    def gap(self, max_deleted: StreamId | None) -> bool:
        """Whether entries this node never read were trimmed away (Redis'
        ``max-deleted-entry-id`` is past its position): it cannot know what
        they invalidated, so its whole store must go."""
        if max_deleted is None or max_deleted == (0, 0):
            return False
        return self.position is None or max_deleted > self.position

    def received(self, entries: Iterable[tuple[bytes, Sequence[bytes]]]) -> Received:
        """Decide on entries read from the log (in id order)."""
        apply: list[Message] = []
        skipped: dict[str, int] = {}
        position = self.position
        for raw_id, fields in entries:
            try:
                sid = parse_id(raw_id)
            except MessageError:
                skipped["malformed"] = skipped.get("malformed", 0) + 1
                continue
            if position is not None and sid <= position:
                skipped["seen"] = skipped.get("seen", 0) + 1
                continue
            position = sid
            try:
                message = Message.from_fields(list(fields))
            except MessageError:
                skipped["malformed"] = skipped.get("malformed", 0) + 1
                continue
            if message.node == self.node:
                reason = "own"
            elif message.invalidation.kind is Kind.RELOAD and not self.was_live:
                reason = "old-reload"
            else:
                apply.append(message)
                continue
            skipped[reason] = skipped.get(reason, 0) + 1
        return Received(tuple(apply), position, skipped)

    def applied(self, position: StreamId | None) -> None:
        """The messages up to ``position`` are applied (and it is saved)."""
        if position is not None and (self.position is None or position > self.position):
            self.position = position

    # -- local invalidations --------------------------------------------------

    def local(self, invalidation: Invalidation) -> bool:
        """An invalidation made here (already applied locally): True when it
        can be published now, False when it was queued for later."""
        if self.phase is Phase.LIVE:
            return True
        if invalidation.kind is Kind.RELOAD:
            return False  # a reload is not worth replaying later
        self.queue.append(invalidation)
        while len(self.queue) > self.queue_limit:
            self.queue.popleft()
            self.dropped += 1
        return False

    def unsent(self, invalidations: Iterable[Invalidation]) -> None:
        """Publications that failed (Redis went away): first in the queue again."""
        for inv in reversed(list(invalidations)):
            if inv.kind is not Kind.RELOAD:
                self.queue.appendleft(inv)
        while len(self.queue) > self.queue_limit:
            self.queue.pop()
            self.dropped += 1

    def drain(self) -> list[Invalidation]:
        """Everything queued, to publish now (the node just caught up)."""
        out = list(self.queue)
        self.queue.clear()
        return out

    # -- outages --------------------------------------------------------------

    def lost(self, now: float) -> bool:
        """Redis is unreachable (a failed attempt or a dropped connection):
        True only for the first failure of an outage, the one to log."""
        self.move("lost")
        if self.down_since is None:
            self.down_since = now
        if self._reported:
            return False
        self._reported = True
        return True

    def caught_up(self, now: float) -> float | None:
        """Caught up and live; the length of the outage that ended (None when
        there was none to report)."""
        self.move("caught_up")
        self.was_live = True
        since, self.down_since = self.down_since, None
        reported, self._reported = self._reported, False
        return now - since if since is not None and reported else None


class Backoff:
    """Delays between reconnection attempts: ``first``, doubling, at most
    ``cap``; ``reset()`` once a connection is live again."""

    def __init__(self, first: float = 0.25, factor: float = 2.0, cap: float = 10.0) -> None:
        if first <= 0 or factor < 1 or cap < first:
            raise ValueError("need 0 < first <= cap and factor >= 1")
        self.first = first
        self.factor = factor
        self.cap = cap
        self.attempts = 0

    def next(self) -> float:
        delay = min(self.cap, self.first * self.factor**self.attempts)
        if delay < self.cap:
            self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0


@attrs.frozen
class Outcome:
    """How an entry this node added was confirmed: by how many of the live
    nodes, and which did not answer in time."""

    live: int
    missing: tuple[str, ...]

    def note(self) -> bytes:
        """The line added to a PURGE or ban answer."""
        if not self.missing:
            return b"cluster: applied by all %d other node(s)\n" % self.live
        return b"cluster: applied by %d of %d other node(s); not confirmed: %s\n" % (
            self.live - len(self.missing), self.live, ", ".join(self.missing).encode("utf-8"),
        )


class Confirmations:
    """Entries added by this node that wait for the other live nodes' acks."""

    def __init__(self, node: str) -> None:
        self.node = node
        #: The highest position each node acknowledged (from the channel).
        self.acked: dict[str, StreamId] = {}
        self._pending: dict[int, tuple[StreamId, set[str], int]] = {}
        self._tickets = 0

    def ack(self, node: str, position: StreamId) -> list[tuple[int, Outcome]]:
        """A node's acknowledgement; the tickets it completes."""
        if position > self.acked.get(node, (0, 0)):
            self.acked[node] = position
        done = []
        for ticket, (entry, waiting, live) in list(self._pending.items()):
            if node in waiting and position >= entry:
                waiting.discard(node)
                if not waiting:
                    del self._pending[ticket]
                    done.append((ticket, Outcome(live, ())))
        return done

    def expect(
        self, entry: StreamId, nodes: Mapping[str, tuple[StreamId, float]], now: float, live_for: float,
    ) -> tuple[int, Outcome | None]:
        """Wait for ``entry`` from the nodes seen within ``live_for`` seconds
        (``nodes``: name -> (position, last seen)), but this one.  Returns a
        ticket and, when nobody has to be waited for, the outcome at once."""
        self._tickets += 1
        ticket = self._tickets
        live = {n for n, (_, seen) in nodes.items() if n != self.node and now - seen <= live_for}
        waiting = {n for n in live if max(nodes[n][0], self.acked.get(n, (0, 0))) < entry}
        if not waiting:
            return ticket, Outcome(len(live), ())
        self._pending[ticket] = (entry, waiting, len(live))
        return ticket, None

    def give_up(self, ticket: int) -> Outcome | None:
        """The wait ran out: the outcome with the nodes still missing (None
        when the ticket was completed already)."""
        pending = self._pending.pop(ticket, None)
        if pending is None:
            return None
        _, waiting, live = pending
        return Outcome(live, tuple(sorted(waiting)))

    def forget_all(self) -> list[tuple[int, Outcome]]:
        """The connection went: every wait ends unconfirmed."""
        out = [(t, Outcome(live, tuple(sorted(w)))) for t, (_, w, live) in self._pending.items()]
        self._pending.clear()
        return out


def node_value(position: StreamId | None, now: float) -> bytes:
    """A node's entry in the ``KEY:nodes`` hash: its position and time."""
    return (format_id(position) if position is not None else b"0-0") + b" " + repr(now).encode("ascii")


def parse_nodes(flat: Sequence[bytes]) -> dict[str, tuple[StreamId, float]]:
    """``HGETALL KEY:nodes`` -> name -> (position, last seen); bad rows are left out."""
    out: dict[str, tuple[StreamId, float]] = {}
    for i in range(0, len(flat) - 1, 2):
        try:
            name = flat[i].decode("utf-8")
            pos, seen = flat[i + 1].split(b" ")
            out[name] = (parse_id(pos), float(seen))
        except (ValueError, AttributeError):
            continue
    return out


def parse_position(text: bytes) -> StreamId | None:
    """The saved position file's content; None when empty or unreadable."""
    try:
        return parse_id(text.strip())
    except MessageError:
        return None
