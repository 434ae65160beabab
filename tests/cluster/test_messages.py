"""Log entries and channel payloads: every message survives encoding whole,
and anything malformed is refused with MessageError, never an other error."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.cluster.messages import (
    BanScope,
    Invalidation,
    Kind,
    Message,
    MessageError,
    ack,
    doorbell,
    format_id,
    parse_event,
    parse_id,
)

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
invalidations = st.one_of(
    st.builds(Invalidation.purge, names, st.binary(min_size=1, max_size=200)),
    st.builds(Invalidation.ban, st.none() | names, st.sampled_from(["^/a", "x.*y", "/shop/[0-9]+$", "."]),
              st.none() | st.sampled_from(["a.test", "shop.example:8080", "[::1]"])),
    st.builds(Invalidation.ban, st.none() | names, st.just(None), st.just("a.test")),
    st.builds(Invalidation.ban, st.none() | names, st.none() | st.just("^/a"), st.none() | st.just("a.test"),
              st.sampled_from([r"\.example$", "^www[.]", "é"])),
    st.builds(Invalidation, st.just(Kind.BAN), st.none() | names, st.sampled_from([b"^a.test/", b"x"]),
              st.just(None), st.just(BanScope.KEY_URL)),
    st.just(Invalidation.reload()),
)
messages = st.builds(Message, invalidations, names, st.floats(allow_nan=False, allow_infinity=False))


class IdTests(SynchronousTestCase):
    def test_round_trip(self) -> None:
        """Ids parse to (ms, seq), ordered as Redis orders them, and format back."""
        self.assertEqual(parse_id(b"1700000000000-3"), (1700000000000, 3))
        self.assertEqual(format_id((5, 0)), b"5-0")
        self.assertLess(parse_id(b"9-9"), parse_id(b"10-0"))

    def test_refused(self) -> None:
        for raw in (b"", b"1", b"1-", b"-1", b"a-1", b"1-2-3", b"1 -2", b"%d-0" % 2**64, b"1-0\n"):
            with self.assertRaises(MessageError, msg=raw):
                parse_id(raw)


class MessageTests(SynchronousTestCase):
    @given(messages)
    def test_round_trip(self, message: Message) -> None:
        """fields() -> from_fields() gives the same message back."""
        self.assertEqual(Message.from_fields(message.fields()), message)

    def test_fields(self) -> None:
        """The stream entry of a purge, a ban of every site and a reload."""
        m = Message(Invalidation.purge("shop", b"shop.example/a?b"), "n1", 12.5)
        self.assertEqual(
            m.fields(),
            [b"kind", b"purge", b"node", b"n1", b"at", b"12.5", b"site", b"shop", b"subject", b"shop.example/a?b"],
        )
        self.assertEqual(Message(Invalidation.ban(None, "^/x"), "n", 1.0).fields()[6:],
                         [b"subject", b"^/x", b"match", b"target"])
        self.assertEqual(Message(Invalidation.ban("s", None, "a.test"), "n", 1.0).fields()[6:],
                         [b"site", b"s", b"subject", b"", b"match", b"target", b"host", b"a.test"])
        self.assertEqual(Message(Invalidation.reload(), "n", 1.0).fields(), [b"kind", b"reload", b"node", b"n", b"at", b"1.0"])

    def test_unknown_fields_ignored(self) -> None:
        """A newer node's extra fields do not make an entry unreadable."""
        m = Message(Invalidation.ban("s", "^/x"), "n", 1.0)
        self.assertEqual(Message.from_fields([*m.fields(), b"future", b"x"]), m)

    def test_older_nodes_ban(self) -> None:
        """An entry of an older node (no ``match``) is a ban on the whole
        stored URL, and is read so."""
        old = [b"kind", b"ban", b"node", b"n", b"at", b"1.0", b"site", b"s", b"subject", b"^a.test/obj"]
        inv = Message.from_fields(old).invalidation
        self.assertEqual((inv.kind, inv.site, inv.regex, inv.host, inv.scope),
                         (Kind.BAN, "s", "^a.test/obj", None, BanScope.KEY_URL))
        self.assertEqual(inv.describe(), "ban s ^a.test/obj (on the whole URL)")

    def test_malformed(self) -> None:
        """Every broken entry is a MessageError."""
        good = Message(Invalidation.purge("s", b"/u"), "n", 1.0).fields()
        cases = [
            good[:-1],
            [*good, b"kind", b"purge"],
            [b"kind", b"purge", b"node", b"n", b"at", b"1", b"subject", b"/u"],  # no site
            [b"kind", b"explode", b"node", b"n", b"at", b"1"],
            [b"kind", b"ban", b"node", b"n", b"at", b"1"],
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"("],
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"\xff"],
            [b"kind", b"purge", b"node", b"n", b"at", b"nan", b"site", b"s", b"subject", b"/u"],
            [b"kind", b"purge", b"node", b"n", b"at", b"x", b"site", b"s", b"subject", b"/u"],
            [b"kind", b"purge", b"node", b"", b"at", b"1", b"site", b"s", b"subject", b"/u"],
            [b"kind", b"purge", b"node", b"\xff", b"at", b"1", b"site", b"s", b"subject", b"/u"],
            [b"kind", b"purge", b"node", b"n", b"at", b"1", b"site", b"s", b"subject", b""],
            [b"kind", b"reload", b"node", b"n", b"at", b"1", b"site", b"s"],
            [b"kind", b"reload", b"node", b"n", b"at", b"1", b"subject", b"x"],
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"", b"match", b"target"],  # nothing to match
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"x", b"match", b"regex"],
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"x", b"match", b"target", b"host", b"a b"],
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"x", b"match", b"target", b"host", b""],
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"x", b"host", b"a"],  # host on an old ban
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"", b"match", b"url"],
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"", b"match", b"target", b"host_regex", b"("],
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"", b"match", b"target", b"host_regex", b""],
            [b"kind", b"ban", b"node", b"n", b"at", b"1", b"subject", b"x", b"host_regex", b"a"],  # on an old ban
            [b"kind", 5, b"node", b"n"],
            "kind purge",
        ]
        for fields in cases:
            with self.assertRaises(MessageError, msg=repr(fields)):
                Message.from_fields(fields)  # type: ignore[arg-type]

    @given(st.lists(st.binary(max_size=12), max_size=12))
    def test_any_fields(self, fields: list[bytes]) -> None:
        """Arbitrary field lists: a message or MessageError, nothing else."""
        try:
            Message.from_fields(fields)
        except MessageError:
            pass

    def test_describe(self) -> None:
        self.assertEqual(Invalidation.ban(None, "^/a").describe(), "ban * ^/a")
        self.assertEqual(Invalidation.ban("s", "^/a", "a.test").describe(), "ban s ^/a host=a.test")
        self.assertEqual(Invalidation.ban("s", None, host_regex="^w").describe(), "ban s  host~^w")
        self.assertEqual(Invalidation.purge("s", b"h/p").describe(), "purge s h/p")
        self.assertEqual(Invalidation.reload().describe(), "reload")
        self.assertEqual(Invalidation.ban("s", "é").regex, "é")
        self.assertIs(Invalidation.reload().kind, Kind.RELOAD)


class EventTests(SynchronousTestCase):
    def test_round_trip(self) -> None:
        """Doorbells and acks parse back to what was sent."""
        self.assertEqual(parse_event(doorbell((7, 1))), ("entry", "", (7, 1)))
        self.assertEqual(parse_event(ack("edge-1", (9, 0))), ("ack", "edge-1", (9, 0)))

    def test_refused(self) -> None:
        for payload in (b"", b"entry", b"entry 1", b"entry 1-0 x", b"ack n", b"ack  1-0", b"ack n x", b"bell 1-0",
                        b"ack \xff 1-0"):
            with self.assertRaises(MessageError, msg=payload):
                parse_event(payload)

    @given(st.binary(max_size=40))
    def test_any_payload(self, payload: bytes) -> None:
        """Arbitrary channel payloads: an event or MessageError."""
        try:
            parse_event(payload)
        except MessageError:
            pass
