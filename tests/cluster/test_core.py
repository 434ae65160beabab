"""The node's decisions without I/O: phases move only as the table says,
read entries are applied once and in order (own, seen, malformed and old
reloads skipped), the queue keeps what Redis missed, an outage is reported
once, the backoff schedule doubles to its cap, and confirmations complete
exactly when every live node acknowledged."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.cluster.core import (
    Backoff,
    Confirmations,
    InvalidMove,
    NodeCore,
    Outcome,
    Phase,
    node_value,
    parse_nodes,
    parse_position,
)
from prexy.cluster.messages import Invalidation, Message, format_id

PURGE = Invalidation.purge("s", b"h/a")
BAN = Invalidation.ban(None, "^h/")


def entry(sid: tuple[int, int], inv: Invalidation, node: str = "other") -> tuple[bytes, list[bytes]]:
    return format_id(sid), Message(inv, node, 1.0).fields()


def live(core: NodeCore) -> NodeCore:
    core.move("connect")
    core.move("connected")
    core.caught_up(0.0)
    return core


class PhaseTests(SynchronousTestCase):
    def test_lifecycle(self) -> None:
        """idle -> connecting -> catching up -> live -> down -> connecting ... -> stopped."""
        core = NodeCore("a", None)
        self.assertIs(core.phase, Phase.IDLE)
        self.assertIs(core.move("connect"), Phase.CONNECTING)
        self.assertIs(core.move("connected"), Phase.CATCHING_UP)
        core.caught_up(1.0)
        self.assertIs(core.phase, Phase.LIVE)
        core.lost(2.0)
        self.assertIs(core.phase, Phase.DOWN)
        self.assertIs(core.move("connect"), Phase.CONNECTING)
        self.assertIs(core.move("stop"), Phase.STOPPED)

    def test_invalid_moves(self) -> None:
        """Events that cannot happen in a phase raise InvalidMove."""
        for phase, event in [(Phase.IDLE, "connected"), (Phase.IDLE, "caught_up"), (Phase.LIVE, "connect"),
                             (Phase.DOWN, "lost"), (Phase.STOPPED, "connect"), (Phase.CONNECTING, "caught_up")]:
            core = NodeCore("a", None)
            core.phase = phase
            with self.assertRaises(InvalidMove, msg=(phase, event)):
                core.move(event)

    def test_outage_reported_once(self) -> None:
        """Every failed attempt of one outage but the first is silent; the
        outage's length is reported when the node is live again."""
        core = live(NodeCore("a", None))
        self.assertTrue(core.lost(10.0))
        for t in (11.0, 12.0, 14.0):
            core.move("connect")
            self.assertFalse(core.lost(t))
        self.assertEqual(core.down_since, 10.0)
        core.move("connect")
        core.move("connected")
        self.assertEqual(core.caught_up(25.0), 15.0)
        self.assertIsNone(core.down_since)
        self.assertTrue(core.lost(30.0))  # a new outage is reported again

    def test_first_connection_not_an_outage(self) -> None:
        """Catching up at start reports no outage."""
        core = NodeCore("a", None)
        core.move("connect")
        core.move("connected")
        self.assertIsNone(core.caught_up(3.0))


class ReceiveTests(SynchronousTestCase):
    def test_applies_foreign_in_order(self) -> None:
        core = live(NodeCore("a", None))
        got = core.received([entry((1, 0), PURGE), entry((2, 0), BAN, "b")])
        self.assertEqual([m.invalidation for m in got.apply], [PURGE, BAN])
        self.assertEqual(got.position, (2, 0))
        self.assertEqual(core.position, None, "the position moves once applied")
        core.applied(got.position)
        self.assertEqual(core.read_from(), b"2-0")

    def test_skips(self) -> None:
        """Own entries, entries at or before the position, malformed ones: skipped, counted, passed."""
        core = live(NodeCore("a", (5, 0)))
        got = core.received([
            entry((4, 0), PURGE), entry((5, 0), PURGE), entry((6, 0), PURGE, "a"),
            (b"7-0", [b"kind", b"nonsense"]), (b"bad-id", []), entry((8, 0), BAN),
        ])
        self.assertEqual([m.invalidation for m in got.apply], [BAN])
        self.assertEqual(dict(got.skipped), {"seen": 2, "own": 1, "malformed": 2})
        self.assertEqual(got.position, (8, 0))

    def test_reload_only_when_live_once(self) -> None:
        """A reload read while catching up at start is old news; after the
        node was live once (a reconnect), a missed reload is applied."""
        core = NodeCore("a", None)
        core.move("connect")
        core.move("connected")
        got = core.received([entry((1, 0), Invalidation.reload())])
        self.assertEqual((got.apply, dict(got.skipped)), ((), {"old-reload": 1}))
        core.caught_up(0.0)
        core.lost(1.0)
        core.move("connect")
        core.move("connected")
        got = core.received([entry((2, 0), Invalidation.reload())])
        self.assertEqual(len(got.apply), 1)

    def test_applied_never_goes_back(self) -> None:
        core = NodeCore("a", (9, 0))
        core.applied((3, 0))
        core.applied(None)
        self.assertEqual(core.position, (9, 0))

    @given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 2), st.booleans()), max_size=30))
    def test_each_entry_once(self, raw: list[tuple[int, int, bool]]) -> None:
        """However batches overlap (a re-read after a reconnect), each
        foreign entry is applied once, in id order."""
        ids = sorted({(ms, seq) for ms, seq, _ in raw})
        own = {(ms, seq) for ms, seq, mine in raw if mine}
        log = [entry(i, Invalidation.purge("s", b"%d-%d" % i), "a" if i in own else "b") for i in ids]
        core = live(NodeCore("a", None))
        applied: list[bytes] = []
        for start in range(0, len(log), 3):
            got = core.received(log[max(0, start - 2) : start + 3])  # overlapping batches
            applied += [m.invalidation.subject for m in got.apply]
            core.applied(got.position)
        self.assertEqual(applied, [b"%d-%d" % i for i in ids if i not in own])


class GapTests(SynchronousTestCase):
    def test_gap(self) -> None:
        """The store must go when Redis deleted entries past the position."""
        self.assertFalse(NodeCore("a", (5, 0)).gap(None))
        self.assertFalse(NodeCore("a", (5, 0)).gap((0, 0)))
        self.assertFalse(NodeCore("a", (5, 0)).gap((5, 0)))
        self.assertTrue(NodeCore("a", (5, 0)).gap((5, 1)))
        self.assertTrue(NodeCore("a", None).gap((1, 0)), "no position: it cannot know what it missed")
        self.assertFalse(NodeCore("a", None).gap(None))


class QueueTests(SynchronousTestCase):
    def test_queue_while_down(self) -> None:
        """Not live: local invalidations are queued (reloads are not) and
        drained in order once live."""
        core = NodeCore("a", None, queue_limit=3)
        self.assertFalse(core.local(PURGE))
        self.assertFalse(core.local(Invalidation.reload()))
        self.assertFalse(core.local(BAN))
        self.assertEqual(list(core.queue), [PURGE, BAN])
        live(core)
        self.assertTrue(core.local(PURGE))
        self.assertEqual(core.drain(), [PURGE, BAN])
        self.assertEqual(core.drain(), [])

    def test_bounded(self) -> None:
        """A full queue drops its oldest entries and counts them."""
        core = NodeCore("a", None, queue_limit=2)
        invs = [Invalidation.purge("s", b"%d" % i) for i in range(5)]
        for inv in invs:
            core.local(inv)
        self.assertEqual((list(core.queue), core.dropped), (invs[3:], 3))

    def test_unsent_goes_first(self) -> None:
        """A publication that failed is queued ahead of later ones, in its order."""
        core = NodeCore("a", None, queue_limit=3)
        core.local(BAN)
        core.unsent([PURGE, Invalidation.purge("s", b"2"), Invalidation.reload()])
        self.assertEqual(list(core.queue), [PURGE, Invalidation.purge("s", b"2"), BAN])
        core.unsent([Invalidation.purge("s", b"3")])
        self.assertEqual(list(core.queue)[0], Invalidation.purge("s", b"3"))
        self.assertEqual((len(core.queue), core.dropped), (3, 1))


class BackoffTests(SynchronousTestCase):
    def test_schedule(self) -> None:
        """first, doubling, capped; reset starts over."""
        b = Backoff(0.25, 2.0, 3.0)
        self.assertEqual([b.next() for _ in range(6)], [0.25, 0.5, 1.0, 2.0, 3.0, 3.0])
        b.reset()
        self.assertEqual(b.next(), 0.25)

    def test_refused(self) -> None:
        for args in ((0.0, 2.0, 1.0), (1.0, 0.5, 2.0), (2.0, 2.0, 1.0)):
            with self.assertRaises(ValueError):
                Backoff(*args)


class ConfirmationTests(SynchronousTestCase):
    NODES = {"a": ((1, 0), 100.0), "b": ((1, 0), 99.0), "c": ((9, 0), 100.0), "dead": ((0, 0), 50.0)}

    def test_waits_for_live_nodes_behind(self) -> None:
        """Only live nodes (seen within live_for), not itself, not those already past the entry."""
        conf = Confirmations("a")
        ticket, outcome = conf.expect((5, 0), self.NODES, now=100.0, live_for=7.0)
        self.assertIsNone(outcome)
        self.assertEqual(conf.ack("c", (5, 0)), [])
        self.assertEqual(conf.ack("b", (4, 0)), [])
        self.assertEqual(conf.ack("b", (5, 0)), [(ticket, Outcome(2, ()))])
        self.assertIsNone(conf.give_up(ticket))

    def test_nobody_to_wait_for(self) -> None:
        conf = Confirmations("a")
        _, outcome = conf.expect((5, 0), {"a": ((0, 0), 100.0)}, 100.0, 7.0)
        self.assertEqual(outcome, Outcome(0, ()))

    def test_ack_before_expect(self) -> None:
        """An ack that arrived before the node table was read still counts."""
        conf = Confirmations("a")
        conf.ack("b", (6, 0))
        _, outcome = conf.expect((5, 0), {"b": ((1, 0), 100.0)}, 100.0, 7.0)
        self.assertEqual(outcome, Outcome(1, ()))

    def test_give_up_and_forget(self) -> None:
        conf = Confirmations("a")
        t1, _ = conf.expect((5, 0), self.NODES, 100.0, 7.0)
        t2, _ = conf.expect((6, 0), self.NODES, 100.0, 7.0)
        self.assertEqual(conf.give_up(t1), Outcome(2, ("b",)))
        self.assertEqual(conf.forget_all(), [(t2, Outcome(2, ("b",)))])
        self.assertEqual(conf.forget_all(), [])

    def test_notes(self) -> None:
        self.assertEqual(Outcome(2, ()).note(), b"cluster: applied by all 2 other node(s)\n")
        self.assertEqual(Outcome(3, ("c",)).note(), b"cluster: applied by 2 of 3 other node(s); not confirmed: c\n")


class ValuesTests(SynchronousTestCase):
    def test_nodes_table(self) -> None:
        """HGETALL rows parse; broken ones are left out."""
        flat = [b"a", node_value((3, 1), 12.5), b"b", b"junk", b"c", node_value(None, 1.0), b"d"]
        self.assertEqual(parse_nodes(flat), {"a": ((3, 1), 12.5), "c": ((0, 0), 1.0)})

    def test_position_file_text(self) -> None:
        self.assertEqual(parse_position(b"17-2\n"), (17, 2))
        self.assertIsNone(parse_position(b""))
        self.assertIsNone(parse_position(b"garbage"))
