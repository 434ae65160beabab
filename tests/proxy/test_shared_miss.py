"""Through the proxy, in memory: on a shared miss, the client that made the
fetch hanging up cuts nobody else's answer.  The fetch
goes on while a follower waits or the answer is being stored, and is
cancelled once nobody is left and nothing is stored."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.cache import CachePolicy
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.proxy.caching import CacheLayer
from prexy.substitution import parse_rules
from tests.cases import unlinked_store

from .support import ClosingTransport, Harness, OriginConn, header, parse_response, site_runtime

GET = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n"
BODY = bytes(range(256)) * 256  # 64 KiB
HEAD = b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: %d\r\n\r\n" % len(BODY)
CHUNKED = b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nTransfer-Encoding: chunked\r\n\r\n"
REWRITE = b"replace_filter 'origin' 'clone' g;\n"
PAGE = b"<p>www.origin.example</p>\n" * 2500
#: A request the cache passes (a private one).
PASSING = b"GET /big HTTP/1.1\r\nHost: x\r\nCookie: s=1\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def hang_up(client: ClosingTransport) -> None:
    """The client resets its connection, told the way a TCP transport tells
    it: the channel's producer is stopped first (which stops the producer
    the response registered), then the channel hears connectionLost."""
    client.producer.stopProducing()
    client.abortConnection()


def harness(policy: CachePolicy, rules: bytes | None = None) -> Harness:
    """A cached site (and rewriting, with ``rules``) on in-memory origins."""
    config = Config(
        listen=("tcp:0",),
        sites=(SiteConfig("s", UpstreamURL.parse("http://origin.test"), cache=policy),),
        default_site="s",
    )
    runtime = site_runtime(config, s={"rules": parse_rules(rules, "test.rules")}) if rules else None
    h = Harness(config, runtime)
    store = unlinked_store("prexy-shared-", 64 << 20, h.clock.seconds)
    h.resource.cache = CacheLayer(h.clock, store, h.metrics)
    return h


class SharedMissTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = harness(CachePolicy())

    def origin(self) -> OriginConn:
        self.assertEqual(len(self.h.conns), 1)  # one fetch for every request
        return self.h.conns[0]

    def assert_whole(self, client: ClosingTransport) -> list[tuple[bytes, bytes]]:
        """The client got the whole body, cleanly ended; its headers."""
        status, headers, body = parse_response(client.value())
        self.assertEqual((status, len(body), body == BODY), (200, len(BODY), True))
        self.assertFalse(client.aborted)
        return headers

    def assert_hit(self) -> None:
        """The next request is answered from the store, without a fetch."""
        conns = len(self.h.conns)
        _, later = self.h.send(GET)
        headers = self.assert_whole(later)
        self.assertIn(b"hit", header(headers, b"cache-status")[0])
        self.assertEqual(len(self.h.conns), conns)

    # -- the fetch goes on -----------------------------------------------------------

    def test_leader_hangs_up_mid_body(self) -> None:
        """The report: A asks for a cacheable 64 KiB answer, B for the same
        URL just after; A hangs up after 16 KiB.  B still gets all 64 KiB,
        the upstream connection is read to the end (and pooled), and the
        next request is a hit."""
        _, a = self.h.send(GET)
        _, b = self.h.send(GET)
        conn = self.origin()
        conn.reply(HEAD + BODY[: 16 * 1024])
        hang_up(a)
        self.assertTrue(a.aborted)
        self.assertFalse(conn.transport.disconnecting)
        conn.reply(BODY[16 * 1024 :])
        self.assertIn(b"collapsed", header(self.assert_whole(b), b"cache-status")[0])
        self.assertEqual(self.h.pool.idle_connections(), 1)
        self.assertEqual(len(self.flushLoggedErrors()), 0)
        self.assert_hit()

    def test_told_by_connection_lost_alone(self) -> None:
        """The same when the channel hears connectionLost without its
        producer being stopped first (another transport's order)."""
        _, a = self.h.send(GET)
        _, b = self.h.send(GET)
        conn = self.origin()
        conn.reply(HEAD + BODY[: 16 * 1024])
        a.abortConnection()
        conn.reply(BODY[16 * 1024 :])
        self.assert_whole(b)
        self.assert_hit()

    def test_leader_alone_hangs_up_mid_body_of_a_stored_answer(self) -> None:
        """With nobody following, a cacheable answer is still fetched to the
        end and stored: the next request is a hit."""
        _, a = self.h.send(GET)
        conn = self.origin()
        conn.reply(HEAD + BODY[:1000])
        hang_up(a)
        self.assertFalse(conn.transport.disconnecting)
        conn.reply(BODY[1000:])
        self.assert_hit()

    def test_follower_joining_after_the_leader_left_gets_it_all(self) -> None:
        """A request for the key after the leader hung up follows the fetch
        that went on, and gets the body from its first byte."""
        _, a = self.h.send(GET)
        _, b = self.h.send(GET)
        conn = self.origin()
        conn.reply(HEAD + BODY[:20_000])
        hang_up(a)
        _, c = self.h.send(GET)
        self.origin()  # no second fetch
        conn.reply(BODY[20_000:])
        self.assert_whole(b)
        self.assert_whole(c)
        self.assert_hit()

    def test_leader_hangs_up_before_the_head(self) -> None:
        """Gone before the upstream answered: the request is not cancelled;
        the follower gets the answer, and it is stored."""
        _, a = self.h.send(GET)
        _, b = self.h.send(GET)
        conn = self.origin()
        hang_up(a)
        self.assertFalse(conn.transport.disconnecting)
        conn.reply(HEAD + BODY)
        self.assert_whole(b)
        self.assert_hit()

    def test_paused_leader_does_not_hold_up_the_fetch(self) -> None:
        """The leader's full socket paused the upstream; once it hangs up,
        the pause is released and the follower gets the rest."""
        _, a = self.h.send(GET)
        _, b = self.h.send(GET)
        conn = self.origin()
        conn.reply(HEAD + BODY[:1000])
        a.producer.pauseProducing()
        self.assertTrue(conn.paused)
        hang_up(a)
        self.assertFalse(conn.paused)
        conn.reply(BODY[1000:])
        self.assert_whole(b)

    def test_rewritten_answer_goes_on_too(self) -> None:
        """The same when the body is rewritten (cooperatively, a slice per
        turn): the follower gets all of it rewritten, and it is stored."""
        self.h = harness(CachePolicy(), REWRITE)
        _, a = self.h.send(GET)
        _, b = self.h.send(GET)
        conn = self.origin()
        conn.reply(CHUNKED.replace(b"\r\n\r\n", b"\r\nContent-Type: text/html\r\n\r\n") + chunk(PAGE[:9000]))
        self.h.settle()
        hang_up(a)
        for i in range(9000, len(PAGE), 9000):
            conn.reply(chunk(PAGE[i : i + 9000]))
            self.h.settle()
        conn.reply(b"0\r\n\r\n")
        self.h.settle()
        status, _, body = parse_response(b.value())
        self.assertEqual((status, body), (200, PAGE.replace(b"origin", b"clone")))
        self.assertFalse(b.aborted)
        _, later = self.h.send(GET)
        self.assertEqual(parse_response(later.value())[2], PAGE.replace(b"origin", b"clone"))
        self.assertEqual(len(self.h.conns), 1)

    # -- the fetch is cancelled ------------------------------------------------------

    def test_uncacheable_leader_alone_cancels(self) -> None:
        """An answer that is not stored, with nobody following: the
        upstream is dropped when its client goes, as for any request."""
        _, a = self.h.send(GET)
        conn = self.origin()
        conn.reply(b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 100\r\n\r\nxx")
        hang_up(a)
        self.assertTrue(conn.transport.disconnecting)
        self.assertEqual(self.h.pool.idle_connections(), 0)
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_uncacheable_head_after_the_leader_left_cancels(self) -> None:
        """Gone before the head; the head says the answer is not stored and
        nobody follows: the body is not read for no one."""
        _, a = self.h.send(GET)
        conn = self.origin()
        hang_up(a)
        self.assertFalse(conn.transport.disconnecting)
        conn.reply(b"HTTP/1.1 200 OK\r\nCache-Control: private\r\nContent-Length: 100\r\n\r\nxx")
        self.assertTrue(conn.transport.disconnecting)
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_last_follower_leaving_cancels_a_body_too_large_to_store(self) -> None:
        """A chunked body outgrows max_object_size while the leader is gone:
        the fetch goes on while its follower reads, and is cancelled when
        that last follower leaves."""
        self.h = harness(CachePolicy(max_object_size=16 * 1024))
        _, a = self.h.send(GET)
        _, b = self.h.send(GET)
        conn = self.origin()
        conn.reply(CHUNKED + chunk(BODY[:4096]))
        hang_up(a)
        conn.reply(chunk(BODY[4096:32_768]))  # past the limit: no longer stored
        self.assertFalse(conn.transport.disconnecting)
        self.assertEqual(parse_response(b.value())[2], BODY[:32_768])
        hang_up(b)
        self.assertTrue(conn.transport.disconnecting)
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_body_outgrowing_the_store_with_nobody_left_cancels(self) -> None:
        """The leader alone hung up while its answer was being stored: the
        fetch goes on until the body outgrows max_object_size, then stops."""
        self.h = harness(CachePolicy(max_object_size=16 * 1024))
        _, a = self.h.send(GET)
        conn = self.origin()
        conn.reply(CHUNKED + chunk(BODY[:4096]))
        hang_up(a)
        conn.reply(chunk(BODY[4096:8192]))
        self.assertFalse(conn.transport.disconnecting)
        conn.reply(chunk(BODY[8192:32_768]))
        conn.reply(chunk(BODY[32_768:]))
        self.assertTrue(conn.transport.disconnecting)
        self.assertEqual(len(self.flushLoggedErrors()), 0)
        self.h.send(GET)  # remembered as too large: fetched, not waited for
        self.assertEqual(len(self.h.conns), 2)

    def test_follower_left_alone_with_a_failing_upstream(self) -> None:
        """The fetch that went on breaks mid-body: the follower is reset (a
        clean end would pass a truncated body), nothing is stored."""
        _, a = self.h.send(GET)
        _, b = self.h.send(GET)
        conn = self.origin()
        conn.reply(HEAD + BODY[:1000])
        hang_up(a)
        conn.close()
        self.assertTrue(b.aborted)
        self.assertEqual(len(self.flushLoggedErrors()), 0)
        self.h.send(GET)  # nothing stored: fetched again
        self.assertEqual(len(self.h.conns), 2)


class DrainingTests(SynchronousTestCase):
    """Once the upstream body has all arrived, the connection is back in the
    pool while the rewrite works through it: what the client does then
    (leave, pause) is no longer the upstream's business."""

    def test_client_gone_while_its_rewrite_drains_leaves_the_pool_alone(self) -> None:
        """The upstream body is complete and the connection back in the pool
        while the rewrite still works through it: a client leaving then
        stops the rewrite, and never drops that pooled connection (which
        another request may be using already)."""
        h = harness(CachePolicy(), REWRITE)
        _, a = h.send(PASSING)  # passes the cache
        conn = h.conns[0]
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(PAGE))
        conn.reply(PAGE)
        self.assertEqual(h.pool.idle_connections(), 1)
        hang_up(a)
        h.settle()
        self.assertFalse(conn.transport.disconnecting)
        self.assertEqual(h.pool.idle_connections(), 1)

    def test_client_pausing_while_its_rewrite_drains_pauses_nobody_else(self) -> None:
        """The same connection, back in the pool, already streams another
        request's body: the first client's full socket does not pause it."""
        h = harness(CachePolicy(), REWRITE)
        _, a = h.send(PASSING)
        conn = h.conns[0]
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(PAGE)
        conn.reply(head)
        conn.reply(PAGE)  # a's rewrite drains
        _, b = h.send(PASSING)
        self.assertEqual(len(h.conns), 1)  # the same connection
        conn.reply(head + PAGE[:100])
        a.producer.pauseProducing()
        self.assertFalse(conn.paused)
        conn.reply(PAGE[100:])
        h.settle()
        self.assertEqual(parse_response(b.value())[2], PAGE.replace(b"origin", b"clone"))
