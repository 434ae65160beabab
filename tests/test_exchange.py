"""The exchange core without I/O: its states, the head and request header
rules, validators, Server-Timing, slicing and the body pipeline."""

from __future__ import annotations

import gzip
import itertools
from collections import deque
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy import exchange
from prexy.codec import Compression, Decoder, GzipEncoder
from prexy.exchange import (
    FINAL,
    STALE_IF_ERROR_STATUSES,
    TRANSITIONS,
    BodyPipeline,
    Event,
    IllegalTransition,
    Lifecycle,
    Mode,
    PipelineError,
    Revalidation,
    State,
    derived_etag,
    finish_head,
    next_slice,
    plan_head,
    plan_response,
    rewrite_coding,
    server_timing,
    take_slice,
    upstream_if_none_match,
    upstream_request_headers,
)
from prexy.substitution import parse_rules
from prexy.substitution.transducer import Transducer

DIGEST = "0123456789abcdef"


@attrs.define
class FakeHead:
    """An upstream head as the plan reads it."""

    code: int
    headers: list[tuple[bytes, bytes]]
    length: int | None
    connection_names: frozenset[bytes] = frozenset()
    phrase: bytes = b"OK"

    @property
    def lnames(self) -> list[bytes]:
        return [n.lower() for n, _ in self.headers]

    def end_to_end(self, drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
        drop = drop | self.connection_names
        return [(n, v) for n, v in self.headers if n.lower() not in drop]

    def header(self, lname: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n.lower() == lname), None)

    def values(self, lname: bytes) -> list[bytes]:
        return [v for n, v in self.headers if n.lower() == lname]


@attrs.define
class FakeRules:
    digest: str = DIGEST
    keep_last_modified: bool = False
    types: tuple[bytes, ...] = (b"text/html",)

    def applies_to_header(self, content_type: bytes | None) -> bool:
        return content_type is not None and content_type.split(b";")[0].strip() in self.types


def names(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [n.lower() for n, _ in headers]


class LifecycleTests(SynchronousTestCase):
    #: Events that lead from SENT to each state.
    PATHS = {
        State.SENT: [],
        State.STREAMING: [Event.HEAD],
        State.DRAINING: [Event.HEAD, Event.BODY_END],
        State.DONE: [Event.ANSWERED],
        State.GONE: [Event.UNWANTED],
        State.ABORTED: [Event.RESET],
    }

    def test_every_event_is_taken_or_refused_per_the_table(self) -> None:
        """From each state, exactly the events in TRANSITIONS are taken,
        to the state the table names; any other raises and leaves the state
        unchanged."""
        for start, path in self.PATHS.items():
            for event in Event:
                life = Lifecycle()
                for step in path:
                    life.on(step)
                self.assertIs(life.state, start)
                to = TRANSITIONS.get((start, event))
                if to is not None:
                    self.assertIs(life.on(event), to)
                    self.assertIs(life.state, to)
                else:
                    self.assertRaises(IllegalTransition, life.on, event)
                    self.assertIs(life.state, start)

    def test_the_table_walks(self) -> None:
        """The named walks: a streamed answer, a body rewritten before its
        head (COMPLETE from SENT), an error while the head is held."""
        for walk, end in (
            ([Event.HEAD, Event.BODY_END, Event.COMPLETE], State.DONE),
            ([Event.HEAD, Event.COMPLETE], State.DONE),
            ([Event.COMPLETE], State.DONE),
            ([Event.HEAD, Event.ANSWERED], State.DONE),
            ([Event.HEAD, Event.BODY_END, Event.RESET], State.ABORTED),
            ([Event.CLIENT_LEFT, Event.HEAD, Event.BODY_END, Event.UNWANTED], State.GONE),
        ):
            life = Lifecycle()
            for event in walk:
                life.on(event)
            self.assertIs(life.state, end, walk)

    def test_client_left_keeps_the_state_and_detaches_once(self) -> None:
        for start in (State.SENT, State.STREAMING, State.DRAINING):
            life = Lifecycle()
            for step in self.PATHS[start]:
                life.on(step)
            self.assertFalse(life.detached)
            self.assertIs(life.on(Event.CLIENT_LEFT), start)
            self.assertTrue(life.detached)
            self.assertRaises(IllegalTransition, life.on, Event.CLIENT_LEFT)
            self.assertIs(life.state, start)

    def test_a_background_fetch_starts_detached(self) -> None:
        life = Lifecycle(detached=True)
        self.assertTrue(life.detached)
        self.assertRaises(IllegalTransition, life.on, Event.CLIENT_LEFT)
        life.on(Event.HEAD)
        life.on(Event.COMPLETE)
        self.assertTrue(life.over)

    def test_final_states_are_over(self) -> None:
        for state in State:
            life = Lifecycle()
            life.state = state
            self.assertEqual(life.over, state in FINAL)
            self.assertEqual(life.head_sent, state in (State.STREAMING, State.DRAINING))
        for state in FINAL:
            self.assertFalse([e for e in Event if (state, e) in TRANSITIONS])


class RequestHeaderTests(SynchronousTestCase):
    RAW = {
        b"host": [b"clone.test"],
        b"accept-encoding": [b"gzip, br"],
        b"if-none-match": [b'"abc-px01234567"', b'"other"'],
        b"connection": [b"keep-alive, x-secret"],
        b"x-secret": [b"1"],
        b"cookie": [b"a=1", b"b=2"],
        b"x-forwarded-for": [b"1.2.3.4"],
        b"via": [b"1.0 edge"],
        b"content-length": [b"3"],
    }

    def headers(self, **kw: Any) -> list[tuple[bytes, bytes]]:
        args: dict[str, Any] = dict(
            host_header=b"origin.test", client_host=b"clone.test", client_ip=b"10.0.0.1",
            secure=True, rules_digest=None,
        )
        args.update(kw)
        return upstream_request_headers(self.RAW, **args)

    def test_plain_site(self) -> None:
        """Hop-by-hop, Connection-named and proxy-set headers are dropped;
        Host, X-Forwarded-* and Via are the proxy's; repeats stay apart."""
        out = self.headers()
        self.assertEqual(
            out,
            [
                (b"accept-encoding", b"gzip, br"),
                (b"if-none-match", b'"abc-px01234567"'),
                (b"if-none-match", b'"other"'),
                (b"cookie", b"a=1"),
                (b"cookie", b"b=2"),
                (b"Host", b"origin.test"),
                (b"X-Forwarded-For", b"1.2.3.4, 10.0.0.1"),
                (b"X-Forwarded-Proto", b"https"),
                (b"X-Forwarded-Host", b"clone.test"),
                (b"Via", b"1.0 edge, 1.1 prexy"),
            ],
        )

    def test_rewriting_site(self) -> None:
        """A rewriting site asks for identity and sends the upstream's own
        tags for the derived ones."""
        out = self.headers(rules_digest=DIGEST)
        self.assertIn((b"Accept-Encoding", b"identity"), out)
        self.assertNotIn(b"gzip, br", [v for _, v in out])
        self.assertEqual([v for n, v in out if n.lower() == b"if-none-match"], [b'"abc"', b'"other"'])

    def test_cache_fetch_drops_client_conditionals_and_revalidates(self) -> None:
        out = self.headers(for_cache=True)
        self.assertNotIn(b"if-none-match", names(out))
        stale = Revalidation(b'"v9"', b"Mon, 30 Nov 2026 00:00:00 GMT")
        self.assertTrue(stale.conditional)
        out = self.headers(for_cache=True, revalidate=stale)
        self.assertIn((b"If-None-Match", b'"v9"'), out)
        self.assertIn((b"If-Modified-Since", b"Mon, 30 Nov 2026 00:00:00 GMT"), out)
        self.assertFalse(Revalidation(None, None).conditional)
        # A stored derived tag goes up as the upstream's.
        out = self.headers(for_cache=True, rules_digest=DIGEST, revalidate=Revalidation(derived_etag(b'"v9"', DIGEST), None))
        self.assertIn((b"If-None-Match", b'"v9"'), out)

    def test_no_host_no_forwarded_host(self) -> None:
        out = upstream_request_headers(
            {}, host_header=b"o", client_host=None, client_ip=b"unix", secure=False, rules_digest=None
        )
        self.assertEqual(
            out,
            [(b"Host", b"o"), (b"X-Forwarded-For", b"unix"), (b"X-Forwarded-Proto", b"http"), (b"Via", b"1.1 prexy")],
        )


class ValidatorTests(SynchronousTestCase):
    @given(st.binary(min_size=0, max_size=20).filter(lambda b: b'"' not in b and b"," not in b), st.booleans())
    def test_derived_tag_goes_back(self, opaque: bytes, weak: bool) -> None:
        """A derived tag differs from the upstream's, keeps W/, and turns
        back into it in If-None-Match; other tags pass unchanged."""
        tag = (b"W/" if weak else b"") + b'"' + opaque.strip() + b'"'
        derived = derived_etag(tag, DIGEST)
        self.assertNotEqual(derived, tag)
        self.assertEqual(derived.startswith(b"W/"), weak)
        self.assertEqual(upstream_if_none_match(derived + b", " + b'"x"', DIGEST), tag + b', "x"')
        self.assertEqual(upstream_if_none_match(derived_etag(tag, "f" * 16), DIGEST), derived_etag(tag, "f" * 16))

    def test_unquoted_tag_is_kept(self) -> None:
        self.assertEqual(derived_etag(b"bare", DIGEST), b"bare")


class PlanTests(SynchronousTestCase):
    def plan(self, head: FakeHead, **kw: Any) -> exchange.ResponsePlan:
        args: dict[str, Any] = dict(
            rules=FakeRules(), rewrite=True, decode=False, out_coding=None, transduce=True, skipped=False,
            timing_in_trailer=True,
        )
        args.update(kw)
        return plan_response(head, **args)

    def test_passed_through_keeps_length(self) -> None:
        head = FakeHead(200, [(b"Content-Type", b"image/png"), (b"Content-Length", b"9"), (b"Via", b"x")], 9)
        plan = self.plan(head, rules=None, rewrite=False, transduce=False)
        self.assertEqual(plan.headers, [(b"Content-Type", b"image/png"), (b"Content-Length", b"9")])
        self.assertTrue(plan.has_length)
        for code in (204, 304):
            plan = self.plan(FakeHead(code, [], 0), rules=None, rewrite=False, transduce=False)
            self.assertEqual((plan.headers, plan.has_length), ([], False))

    def test_rewritten_body(self) -> None:
        """Rewritten: no length, derived ETag, no Last-Modified, the timing
        announced as a trailer; with keep_last_modified it stays."""
        head = FakeHead(
            200,
            [(b"Content-Type", b"text/html"), (b"ETag", b'"a"'), (b"Last-Modified", b"d"), (b"Content-Length", b"5"),
             (b"Connection", b"x-hop"), (b"X-Hop", b"1")],
            5,
            frozenset({b"x-hop"}),
        )
        plan = self.plan(head)
        self.assertEqual(
            plan.headers,
            [(b"Content-Type", b"text/html"), (b"ETag", derived_etag(b'"a"', DIGEST)), (b"Trailer", b"Server-Timing")],
        )
        self.assertFalse(plan.has_length)
        kept = self.plan(head, rules=FakeRules(keep_last_modified=True), timing_in_trailer=False)
        self.assertIn((b"Last-Modified", b"d"), kept.headers)
        self.assertNotIn(b"trailer", names(kept.headers))

    def test_skipped_and_head(self) -> None:
        """A version known to match nothing keeps its length; HEAD gets a
        GET's head without length or trailer."""
        head = FakeHead(200, [(b"Content-Type", b"text/html"), (b"Content-Length", b"5")], 5)
        skipped = self.plan(head, transduce=False, skipped=True)
        self.assertEqual(skipped.headers[-1], (b"Content-Length", b"5"))
        self.assertTrue(skipped.has_length)
        for_head = self.plan(head, transduce=False)
        self.assertEqual(for_head.headers, [(b"Content-Type", b"text/html")])
        self.assertFalse(for_head.has_length)

    def test_decoded_body(self) -> None:
        """A decoded body loses its Content-Encoding, gets gzip again when
        the client takes it, and Vary: Accept-Encoding unless Vary covers it."""
        head = FakeHead(200, [(b"Content-Type", b"text/html"), (b"Content-Encoding", b"gzip")], None)
        plain = self.plan(head, decode=True)
        self.assertEqual(plain.headers, [(b"Content-Type", b"text/html"), (b"Vary", b"Accept-Encoding"), (b"Trailer", b"Server-Timing")])
        zipped = self.plan(head, decode=True, out_coding=b"gzip")
        self.assertIn((b"Content-Encoding", b"gzip"), zipped.headers)
        varied = FakeHead(200, [*head.headers, (b"Vary", b"accept-encoding, cookie")], None)
        self.assertEqual(names(self.plan(varied, decode=True).headers).count(b"vary"), 1)
        star = FakeHead(200, [*head.headers, (b"Vary", b"*")], None)
        self.assertEqual(names(self.plan(star, decode=True).headers).count(b"vary"), 1)

    def test_rewrite_coding(self) -> None:
        """Which responses are rewritten and which codings come off first:
        every decodable coding, stacked ones in the order applied, identity
        ignored; an unknown coding (alone or stacked) keeps the rules off
        and is named, but only for a type the rules would rewrite."""
        rules = FakeRules()
        html = [(b"Content-Type", b"text/html")]
        png = [(b"Content-Type", b"image/png")]
        self.assertEqual(rewrite_coding(FakeHead(200, html, 5), rules), (True, (), None))
        self.assertEqual(rewrite_coding(FakeHead(200, html, 5), None), (False, (), None))
        self.assertEqual(rewrite_coding(FakeHead(200, html, 0), rules), (False, (), None))
        self.assertEqual(rewrite_coding(FakeHead(304, html, None), rules), (False, (), None))
        self.assertEqual(rewrite_coding(FakeHead(200, png, 5), rules), (False, (), None))
        gz = [*html, (b"Content-Encoding", b" GZIP ")]
        self.assertEqual(rewrite_coding(FakeHead(200, gz, 5), rules), (True, (b"gzip",), None))
        for coding in (b"br", b"zstd", b"deflate", b"x-gzip"):
            head = FakeHead(200, [*html, (b"Content-Encoding", coding)], 5)
            self.assertEqual(rewrite_coding(head, rules), (True, (coding,), None))
        stacked = [*html, (b"Content-Encoding", b"gzip, identity"), (b"Content-Encoding", b"BR")]
        self.assertEqual(rewrite_coding(FakeHead(200, stacked, 5), rules), (True, (b"gzip", b"br"), None))
        ident = [*html, (b"Content-Encoding", b"identity")]
        self.assertEqual(rewrite_coding(FakeHead(200, ident, 5), rules), (True, (), None))
        odd = [*html, (b"Content-Encoding", b"gzip, compress")]
        self.assertEqual(rewrite_coding(FakeHead(200, odd, 5), rules), (False, (b"gzip", b"compress"), b"compress"))
        odd_png = [*png, (b"Content-Encoding", b"compress")]
        self.assertEqual(rewrite_coding(FakeHead(200, odd_png, 5), rules), (False, (b"compress",), None))

    def test_server_timing(self) -> None:
        self.assertEqual(
            server_timing(0.001, 0.0025, -1.0),
            b"upstream-connect;dur=1.000, upstream-first-byte;dur=2.500, prexy;dur=0.000",
        )
        self.assertTrue(server_timing(0, 0, 0.0001, b"x").endswith(b"prexy;dur=0.100, x"))


HTML = [(b"Content-Type", b"text/html"), (b"ETag", b'"v1"'), (b"Content-Length", b"2000")]
PNG = [(b"Content-Type", b"image/png"), (b"Content-Length", b"2000")]


class PlanHeadTests(SynchronousTestCase):
    """``plan_head``: one named mode per way an answer goes, with what its
    head needs."""

    def plan(self, head: FakeHead, **kw: Any) -> exchange.HeadPlan:
        args: dict[str, Any] = dict(
            method=b"GET", trailers=True, accept_encoding=None, rules=FakeRules(),
            compression=Compression(min_length=1000), applicable=lambda: None, rules_count=10,
        )
        args.update(kw)
        return plan_head(head, **args)

    def test_modes_before_the_body(self) -> None:
        """A 101 tunnels; a 304 to a revalidation refreshes; an upstream
        error with a usable stale copy serves it; each before any other
        decision (the applicability memory is not asked)."""
        def never() -> Any:
            raise AssertionError("asked")

        self.assertIs(self.plan(FakeHead(101, [], None), applicable=never).mode, Mode.TUNNEL)
        self.assertIs(self.plan(FakeHead(304, HTML, None), revalidating=True, applicable=never).mode, Mode.REFRESH)
        self.assertIs(self.plan(FakeHead(304, HTML, None), applicable=never).mode, Mode.NO_BODY)
        for code in STALE_IF_ERROR_STATUSES:
            stale = self.plan(FakeHead(code, HTML, 2000), stale_usable=lambda: True, applicable=never)
            self.assertIs(stale.mode, Mode.STALE)
            self.assertIs(self.plan(FakeHead(code, PNG, 2000), stale_usable=lambda: False).mode, Mode.PASS)
        self.assertIs(self.plan(FakeHead(404, PNG, 2000), stale_usable=never).mode, Mode.PASS)

    def test_no_body(self) -> None:
        for head, method in ((FakeHead(200, HTML, 2000), b"HEAD"), (FakeHead(204, [], None), b"GET"),
                             (FakeHead(200, HTML, 0), b"GET")):
            plan = self.plan(head, method=method, accept_encoding=[b"gzip"])
            self.assertIs(plan.mode, Mode.NO_BODY)
            self.assertFalse(plan.encodes)
            self.assertFalse(plan.transduce)

    def test_rewritten_modes(self) -> None:
        """A rewritten body streams; one that came whole with its head and
        fits the budget is rewritten in one piece (after its head where the
        client takes trailers, before it elsewhere); never while cached,
        compressed, or past the budget."""
        head = FakeHead(200, HTML, 2000)
        self.assertIs(self.plan(head).mode, Mode.STREAM)
        self.assertIs(self.plan(head, body_in_hand=True, whole_max=2000).mode, Mode.HEAD_FIRST)
        whole = self.plan(head, body_in_hand=True, whole_max=2000, trailers=False)
        self.assertIs(whole.mode, Mode.WHOLE_FIRST)
        self.assertFalse(whole.timing_in_trailer)
        self.assertNotIn(b"trailer", names(whole.headers))
        self.assertTrue(self.plan(head, body_in_hand=True, whole_max=2000).timing_in_trailer)
        for kw in (dict(whole_max=1999), dict(cached=True), dict(whole_max=0)):
            self.assertIs(self.plan(head, body_in_hand=True, **{"whole_max": 2000, **kw}).mode, Mode.STREAM, kw)
        gz = FakeHead(200, [*HTML, (b"Content-Encoding", b"gzip")], 2000)
        decoded = self.plan(gz, body_in_hand=True, whole_max=4000)
        self.assertEqual((decoded.mode, decoded.decode, decoded.codings), (Mode.STREAM, True, (b"gzip",)))
        self.assertEqual(self.plan(head).rules_run, 10)
        self.assertEqual(self.plan(head, applicable=lambda: frozenset({1, 2})).rules_run, 2)

    def test_skipped_and_compressed(self) -> None:
        """A version that matched no rule before passes unscanned with its
        length, or compressed for a client that takes it; a passed body of
        a compressible type is compressed; the cache then gets identity
        bytes (the tap) and identity fields."""
        head = FakeHead(200, HTML, 2000)
        skipped = self.plan(head, applicable=lambda: frozenset())
        self.assertEqual((skipped.mode, skipped.skipped), (Mode.SKIP, True))
        self.assertIn((b"Content-Length", b"2000"), skipped.headers)
        self.assertEqual(skipped.timing_extra, exchange.SKIPPED_TIMING)
        zipped = self.plan(head, applicable=lambda: frozenset(), accept_encoding=[b"gzip"], cached=True)
        self.assertEqual((zipped.mode, zipped.encodes, zipped.tap), (Mode.SKIP, True, True))
        self.assertIn((b"Content-Encoding", b"gzip"), zipped.headers)
        assert zipped.stored is not None
        self.assertNotIn(b"content-encoding", names(zipped.stored))
        passed = FakeHead(200, [(b"Content-Type", b"text/css"), (b"Content-Length", b"2000")], 2000)
        css = self.plan(passed, rules=None, accept_encoding=[b"br"])
        self.assertEqual((css.mode, css.coding.coding, css.tap), (Mode.COMPRESS, b"br", False))
        self.assertIs(self.plan(passed, rules=None).mode, Mode.PASS)
        self.assertIs(self.plan(FakeHead(200, PNG, 2000), accept_encoding=[b"gzip"]).mode, Mode.PASS)

    def test_range_of_a_cached_fetch(self) -> None:
        """A cached GET with a Range: the whole object is fetched, the client
        gets a 206 of its part (or 416) cut as the body goes by."""
        head = FakeHead(200, PNG, 2000)
        plan = self.plan(head, cached=True, range_pairs=[(b"range", b"bytes=10-19")])
        self.assertEqual((plan.mode, plan.code, plan.phrase, plan.span), (Mode.RANGE, 206, b"Partial Content", (10, 19)))
        self.assertIn((b"Content-Range", b"bytes 10-19/2000"), plan.headers)
        self.assertIn((b"Content-Length", b"10"), plan.headers)
        assert plan.stored is not None
        self.assertIn((b"Content-Length", b"2000"), plan.stored)
        self.assertEqual(self.plan(head, cached=True, range_pairs=[(b"range", b"bytes=9000-")]).code, 416)
        self.assertIs(self.plan(head, cached=True, range_pairs=[(b"range", b"bytes=10-19")], method=b"HEAD").mode,
                      Mode.NO_BODY)
        rewritten = self.plan(FakeHead(200, HTML, 2000), cached=True, range_pairs=[(b"range", b"bytes=10-19")])
        self.assertIs(rewritten.mode, Mode.STREAM)

    def test_header_rules_and_targeted_fields(self) -> None:
        """Fields meant for this proxy alone go; the site's header rules
        run when a field they change is there, on the client's and the
        stored fields alike."""
        head = FakeHead(200, [*PNG, (b"Prexy-Cache-Control", b"max-age=5"), (b"Location", b"http://o/x")], 2000)
        seen: list[int] = []

        def rewrite(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
            seen.append(1)
            return [(n, b"http://clone/x" if n == b"Location" else v) for n, v in headers]

        plan = self.plan(head, targeted=frozenset({b"prexy-cache-control"}), header_names=frozenset({b"location"}),
                         rewrite_headers=rewrite, cached=True, accept_encoding=[b"gzip"])
        self.assertNotIn(b"prexy-cache-control", names(plan.headers))
        self.assertIn((b"Location", b"http://clone/x"), plan.headers)
        self.assertEqual(plan.stored, plan.headers)
        self.assertEqual(len(seen), 1)
        self.plan(head, header_names=frozenset({b"set-cookie"}), rewrite_headers=rewrite)
        self.assertEqual(len(seen), 1)

    def test_finish_head(self) -> None:
        """The delivery step's fields, in one order for every answer."""
        self.assertEqual(
            finish_head([(b"A", b"1")], via=[b"1.0 edge"], age=b"3", cache_status=b"prexy; hit", timing=b"t"),
            [(b"A", b"1"), (b"Age", b"3"), (b"Via", b"1.0 edge, 1.1 prexy"), (b"Cache-Status", b"prexy; hit"),
             (b"Server-Timing", b"t")],
        )
        self.assertEqual(finish_head([]), [(b"Via", b"1.1 prexy")])


class BacklogTests(SynchronousTestCase):
    def test_pauses_once_past_the_bound_and_resumes_once(self) -> None:
        backlog = exchange.Backlog()
        half = b"x" * (exchange.BACKLOG_PAUSE // 2)
        self.assertFalse(backlog.add(half))
        self.assertTrue(backlog.add(half))
        self.assertFalse(backlog.add(b"y"))
        self.assertEqual(backlog.size, exchange.BACKLOG_PAUSE + 1)
        self.assertTrue(backlog.resume())
        self.assertFalse(backlog.resume())

    def test_the_last_slice(self) -> None:
        """A slice is the body's last bytes once nothing waits after it and
        the body is known complete: its length read, or its end come."""
        backlog = exchange.Backlog(slice_size=4)
        backlog.expect = 6
        backlog.add(b"abcdef")
        self.assertEqual(backlog.take(ended=False), (b"abcd", False))
        self.assertEqual(backlog.take(ended=False), (b"ef", True))
        self.assertFalse(backlog)
        unknown = exchange.Backlog(slice_size=4)
        unknown.add(b"abcdef")
        self.assertEqual(unknown.take(ended=True), (b"abcd", False))
        self.assertEqual(unknown.take(ended=False), (b"ef", False))
        unknown.add(b"gh")
        self.assertEqual(unknown.take(ended=True), (b"gh", True))
        self.assertEqual(unknown.size, 0)

    def test_measured_sizes_the_next_slice(self) -> None:
        backlog = exchange.Backlog()
        self.assertIsNone(backlog.measured(10, 0.001))
        self.assertEqual(backlog.slice, exchange.FIRST_SLICE)
        size = backlog.measured(exchange.FIRST_SLICE, 1.0)
        self.assertEqual(size, backlog.slice)
        self.assertEqual(size, exchange.next_slice(exchange.FIRST_SLICE, exchange.FIRST_SLICE, 1.0))


class SliceTests(SynchronousTestCase):
    @given(st.lists(st.binary(min_size=1, max_size=5000), min_size=1, max_size=30), st.integers(1, 20000))
    def test_take_slice_keeps_the_bytes(self, pieces: list[bytes], size: int) -> None:
        """Slices never exceed the size unless one piece alone does not fit
        (it is then split to the size), and together they are the input."""
        backlog = deque(pieces)
        out = []
        while backlog:
            piece = take_slice(backlog, size)
            self.assertLessEqual(len(piece), size)
            self.assertGreater(len(piece), 0)
            out.append(piece)
        self.assertEqual(b"".join(out), b"".join(pieces))

    def test_next_slice(self) -> None:
        fs = exchange.FIRST_SLICE
        self.assertIsNone(next_slice(fs, fs, 0.0))
        self.assertIsNone(next_slice(fs, exchange.MIN_SLICE - 1, 1.0))
        self.assertEqual(next_slice(fs, fs, 1.0), fs // 2)  # at most halved
        self.assertEqual(next_slice(fs, fs, 1e-9), 2 * fs)  # at most doubled
        self.assertEqual(next_slice(exchange.MAX_SLICE, exchange.MAX_SLICE, 1e-9), exchange.MAX_SLICE)
        self.assertEqual(next_slice(exchange.MIN_SLICE, exchange.MIN_SLICE, 1.0), exchange.MIN_SLICE)
        just = fs * exchange.SLICE_SECONDS / (fs * 1.5)
        self.assertEqual(next_slice(fs, fs, just), int(fs * 1.5))

    def test_budget(self) -> None:
        now = [0.0]
        spent = exchange.budget(lambda: now[0], 0.5)
        self.assertFalse(spent())
        now[0] = 0.49
        self.assertFalse(spent())
        now[0] = 0.5
        self.assertTrue(spent())


RULES = parse_rules(b"replace_filter 'origin\\.test' 'clone.test' g;\n", "t.rules")
PAGE = b"<a href='http://origin.test/'>origin.test</a> " * 300


class PipelineTests(SynchronousTestCase):
    def whole(self) -> bytes:
        return Transducer(RULES).finish(PAGE)

    @settings(deadline=None)
    @given(st.lists(st.integers(1, 3000), min_size=1, max_size=20), st.booleans())
    def test_any_chunking_gives_the_whole_output(self, cuts: list[int], last_with_data: bool) -> None:
        """Pieces fed in any sizes, ended by finish() or by a last feed,
        give the bytes of one whole rewrite."""
        pipeline = BodyPipeline(Transducer(RULES))
        out, pos = [], 0
        for cut in itertools.cycle(cuts):
            if pos >= len(PAGE):
                break
            piece = PAGE[pos : pos + cut]
            pos += cut
            last = last_with_data and pos >= len(PAGE)
            out.append(pipeline.feed(piece, last))
        self.assertEqual(pipeline.ended, last_with_data)
        out.append(pipeline.finish())
        self.assertTrue(pipeline.ended)
        self.assertEqual(b"".join(out), self.whole())

    @settings(deadline=None)
    @given(
        st.lists(st.integers(1, 3000), min_size=1, max_size=20), st.booleans(), st.booleans(),
        st.sampled_from([b"", b"\r\n", b"<!-- junk -->" * 9]),
    )
    def test_decoded_body_ended_by_its_last_piece(
        self, cuts: list[int], last_with_data: bool, encode: bool, garbage: bytes
    ) -> None:
        """A compressed body (with or without garbage after its stream) fed
        in any pieces, the last one marked ``last`` or not: the decoder, the
        transducer and the encoder all end with the last piece when it is
        marked (``finish()`` then adds nothing), and the bytes are those of
        one whole rewrite; the garbage is reported."""
        body = gzip.compress(PAGE) + garbage
        pipeline = BodyPipeline(Transducer(RULES), Decoder(b"gzip"), GzipEncoder() if encode else None)
        out, pos = [], 0
        for cut in itertools.cycle(cuts):
            if pos >= len(body):
                break
            piece = body[pos : pos + cut]
            pos += cut
            out.append(pipeline.feed(piece, last_with_data and pos >= len(body)))
        ended = (pipeline.decoded_end, pipeline.ended, pipeline.encoded_end)
        self.assertEqual(ended, (last_with_data, last_with_data, last_with_data and encode))
        tail = pipeline.finish()
        if last_with_data:
            self.assertEqual(tail, b"")
        joined = b"".join(out) + tail
        self.assertEqual(gzip.decompress(joined) if encode else joined, self.whole())
        self.assertEqual(pipeline.trailing_garbage(), ((b"gzip", len(garbage)),) if garbage else ())

    def test_last_piece_decides_a_match_at_the_end(self) -> None:
        """With ``replace_filter_max_buffered_size 0``, ``\\s+$`` at the end
        of a body whose last piece carries the end is replaced, as the
        module does for a body that comes whole; when the end comes on its
        own, the held blanks exceed the limit and pass unchanged (the
        module's bail-out)."""
        rules = parse_rules(b"replace_filter_max_buffered_size 0;\nreplace_filter '\\s+$' '' g;\n", "t.rules")
        page = b"  hello, world  \nblah yeah\nhello  \n   baby!\n     \nabc\n"
        trimmed = b"  hello, world\nblah yeah\nhello\n   baby!\nabc"
        for decoder, body in ((None, page), (Decoder(b"gzip"), gzip.compress(page))):
            pipeline = BodyPipeline(Transducer(rules), decoder)
            self.assertEqual(pipeline.feed(body, True) + pipeline.finish(), trimmed)
            self.assertFalse(pipeline.transducer.bailed_out)
        apart = BodyPipeline(Transducer(rules), Decoder(b"gzip"))
        self.assertEqual(apart.feed(gzip.compress(page)) + apart.finish(), trimmed + b"\n")
        self.assertTrue(apart.transducer.bailed_out)

    @settings(deadline=None)
    @given(st.integers(1, 4000), st.booleans())
    def test_decode_and_encode(self, cut: int, encode: bool) -> None:
        body = gzip.compress(PAGE)
        pipeline = BodyPipeline(Transducer(RULES), Decoder(b"gzip"), GzipEncoder() if encode else None)
        out = b"".join(pipeline.feed(body[i : i + cut]) for i in range(0, len(body), cut)) + pipeline.finish()
        self.assertEqual(gzip.decompress(out) if encode else out, self.whole())

    def test_feeds_larger_than_max_feed_are_split(self) -> None:
        seen: list[int] = []
        transducer = Transducer(RULES)
        real = transducer.feed

        def feed(data: bytes) -> bytes:
            seen.append(len(data))
            return real(data)

        transducer.feed = feed  # type: ignore[method-assign]
        big = PAGE * 30
        out = BodyPipeline(transducer).feed(big) + transducer.finish()
        self.assertEqual(out, Transducer(RULES).finish(big))
        self.assertTrue(all(n <= exchange.MAX_FEED for n in seen))
        self.assertGreater(len(seen), 1)

    def test_failures(self) -> None:
        """A corrupt or truncated gzip body and an error in the rewrite are
        PipelineErrors that say which it was."""
        bad = BodyPipeline(Transducer(RULES), Decoder(b"gzip"))
        with self.assertRaises(PipelineError) as caught:
            bad.feed(b"\x1f\x8b\x08\x00garbage-not-gzip-at-all")
            bad.finish()
        self.assertTrue(caught.exception.decode)
        truncated = BodyPipeline(Transducer(RULES), Decoder(b"gzip"))
        truncated.feed(gzip.compress(PAGE)[:50])
        with self.assertRaises(PipelineError) as caught:
            truncated.finish()
        self.assertTrue(caught.exception.decode)

        class Broken:
            def feed(self, data: bytes) -> bytes:
                raise ValueError("boom")

            def finish(self, data: bytes = b"") -> bytes:
                raise ValueError("boom at end")

        with self.assertRaises(PipelineError) as caught:
            BodyPipeline(Broken()).feed(b"x")
        self.assertFalse(caught.exception.decode)
        with self.assertRaises(PipelineError) as caught:
            BodyPipeline(Broken()).finish()
        self.assertFalse(caught.exception.decode)
        self.assertIn("boom at end", str(caught.exception))


class ResourceKeyTests(SynchronousTestCase):
    def test_validators_target_and_variant(self) -> None:
        """No validator, no key; the key changes with the target, the ETag,
        the length and the values of the headers named in Vary, which are
        read only when there is a Vary."""
        asked: list[int] = []

        def headers(values: dict[bytes, list[bytes]]) -> Any:
            def read() -> dict[bytes, list[bytes]]:
                asked.append(1)
                return values

            return read

        plain = FakeHead(200, [(b"Content-Type", b"text/html")], 5)
        self.assertIsNone(exchange.resource_key(b"s", plain, b"/a", headers({})))
        tagged = FakeHead(200, [(b"ETag", b'"1"')], 5)
        key = exchange.resource_key(b"s", tagged, b"/a", headers({}))
        self.assertEqual(asked, [])
        self.assertIsNotNone(key)
        self.assertEqual(key, exchange.resource_key(b"s", FakeHead(200, [(b"ETag", b'"1"')], 5), b"/a", headers({})))
        self.assertNotEqual(key, exchange.resource_key(b"s", tagged, b"/b", headers({})))
        self.assertNotEqual(key, exchange.resource_key(b"s", FakeHead(200, [(b"ETag", b'"2"')], 5), b"/a", headers({})))
        self.assertNotEqual(key, exchange.resource_key(b"s", FakeHead(200, [(b"ETag", b'"1"')], 6), b"/a", headers({})))
        varied = FakeHead(200, [(b"ETag", b'"1"'), (b"Vary", b"Accept-Language")], 5)
        en = exchange.resource_key(b"s", varied, b"/a", headers({b"accept-language": [b"en"]}))
        nl = exchange.resource_key(b"s", varied, b"/a", headers({b"accept-language": [b"nl"]}))
        self.assertNotEqual(en, nl)
        self.assertEqual(asked, [1, 1])


class ClientCodingTests(SynchronousTestCase):
    """Prexy's own choice of a client coding (``choose_client_coding``) and
    the headers it changes (Vary, the ETag variant, conditionals upstream)."""

    HTML = [(b"Content-Type", b"text/html"), (b"ETag", b'"1"')]

    def choose(self, head: FakeHead, accept: bytes | None = b"gzip, br", **kw: Any) -> exchange.ClientCoding:
        args: dict[str, Any] = {"method": b"GET", "compression": Compression(), "encoded": False}
        args.update(kw)
        return exchange.choose_client_coding(head, accept_encoding=None if accept is None else [accept], **args)

    def test_when(self) -> None:
        """Compressed: a compressible body of unknown length or at least
        min_length; a HEAD as its GET would be.  Not: 1xx/204/304, an
        undecoded coding, no-transform, another type, a short body (no Vary
        either)."""
        big = FakeHead(200, self.HTML, 1000)
        self.assertEqual(self.choose(big), exchange.ClientCoding(b"br", True))
        self.assertEqual(self.choose(FakeHead(200, self.HTML, None)), exchange.ClientCoding(b"br", True))
        self.assertEqual(self.choose(FakeHead(200, self.HTML, 256)).coding, b"br")
        self.assertEqual(self.choose(big, None), exchange.ClientCoding(None, True))
        none = exchange.ClientCoding()
        self.assertEqual(self.choose(big, method=b"HEAD"), self.choose(big))
        for code in (101, 204, 304):
            self.assertEqual(self.choose(FakeHead(code, self.HTML, None)), none, code)
        self.assertEqual(self.choose(big, encoded=True), none)
        self.assertEqual(self.choose(FakeHead(200, self.HTML, 255)), none)
        self.assertEqual(self.choose(FakeHead(200, self.HTML, 0)), none)
        # A decoded body's length is the compressed one's: not a reason.
        coded = FakeHead(200, [*self.HTML, (b"Content-Encoding", b"gzip")], 40)
        self.assertEqual(self.choose(coded).coding, b"br")
        cc = FakeHead(200, [*self.HTML, (b"Cache-Control", b"max-age=1"), (b"Cache-Control", b"NO-TRANSFORM")], 1000)
        self.assertEqual(self.choose(cc), none)
        png = FakeHead(200, [(b"Content-Type", b"image/png")], 1000)
        self.assertEqual(self.choose(png), none)
        self.assertEqual(self.choose(big, compression=Compression(enabled=False)), none)

    def test_plan_headers(self) -> None:
        """Negotiated: Content-Encoding, one merged Vary, the coding in a
        strong or weak ETag; identity keeps the derived tag but says Vary."""
        for etag, variant in ((b'"1"', b'"1-px%s-br"'), (b'W/"1"', b'W/"1-px%s-br"')):
            head = FakeHead(200, [(b"Content-Type", b"text/html"), (b"ETag", etag), (b"Vary", b"Cookie")], 1000)
            plan = exchange.plan_response(
                head, rules=FakeRules(), rewrite=True, decode=False, out_coding=b"br", transduce=True,
                skipped=False, timing_in_trailer=True, negotiated=True,
            )
            h = dict(plan.headers)
            self.assertEqual(h[b"Content-Encoding"], b"br")
            self.assertEqual(h[b"Vary"], b"Cookie, Accept-Encoding")
            self.assertEqual(h[b"ETag"], variant % DIGEST[:8].encode())
            self.assertNotIn(b"Content-Length", h)
            plain = exchange.plan_response(
                head, rules=FakeRules(), rewrite=True, decode=False, out_coding=None, transduce=True,
                skipped=False, timing_in_trailer=True, negotiated=True,
            )
            h = dict(plain.headers)
            self.assertNotIn(b"Content-Encoding", h)
            self.assertEqual(h[b"ETag"], exchange.derived_etag(etag, DIGEST))

    def test_merge_vary(self) -> None:
        self.assertEqual(exchange.merge_vary([]), [(b"Vary", b"Accept-Encoding")])
        self.assertEqual(exchange.merge_vary([(b"Vary", b"*")]), [(b"Vary", b"*")])
        self.assertEqual(exchange.merge_vary([(b"vary", b"Cookie, ACCEPT-ENCODING")]), [(b"vary", b"Cookie, ACCEPT-ENCODING")])
        self.assertEqual(
            exchange.merge_vary([(b"Vary", b"Cookie"), (b"Vary", b"Origin")]),
            [(b"Vary", b"Cookie, Accept-Encoding"), (b"Vary", b"Origin")],
        )
        # "accept-encoding-x" is another header: not a match.
        self.assertEqual(exchange.merge_vary([(b"Vary", b"Accept-Encoding-X")]), [(b"Vary", b"Accept-Encoding-X, Accept-Encoding")])

    def test_variant_tags_go_upstream_as_the_upstreams(self) -> None:
        """A client's If-None-Match with a compressed variant's tag goes up
        as the upstream's own tag."""
        tag = exchange.coding_etag(exchange.derived_etag(b'"abc"', DIGEST), b"gzip")
        weak = exchange.coding_etag(exchange.derived_etag(b'W/"abc"', DIGEST), b"zstd")
        self.assertEqual(exchange.upstream_if_none_match(tag + b", " + weak, DIGEST), b'"abc", W/"abc"')
        self.assertEqual(exchange.upstream_if_none_match(b'"x-gzip"', DIGEST), b'"x-gzip"')
        self.assertEqual(exchange.coding_etag(b"bare", b"br"), b"bare")
