"""Tests of :mod:`prexy.headeredits` and :mod:`prexy.headervars`: nginx's
``add_header``, ``proxy_hide_header`` and ``proxy_set_header`` as Prexy
rules-file directives, loaded through the rules tokenizer and the header
rules' builder, applied byte by byte.  (nginx itself is compared with in
``tests/integration/test_headeredits_nginx.py``.)"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.headeredits import SAFE_STATUSES, HeaderEdits
from prexy.headerrules import HeaderRules, HeaderRulesBuilder, HeaderRulesConflict
from prexy.headervars import RequestVars
from prexy.substitution.rules import RulesError, Token, parse_rules, tokenize

VARS = RequestVars.of(
    http_host=b"Proxy.NL:8080", secure=False, local_host="127.0.0.1", local_port=8080, proxy_host="origin:81",
    remote_host="192.0.2.7", remote_port=40000, method=b"GET", uri=b"/a/b?x=1&y", protocol=b"HTTP/1.1",
    headers={b"host": [b"Proxy.NL:8080"], b"x-forwarded-for": [b"10.0.0.1", b"10.0.0.2"],
             b"cookie": [b"a=1", b"b=2"], b"user-agent": [b"UA1", b"UA2"]},
)


def fail(tok: Token, reason: str) -> RulesError:
    return RulesError("<t>", tok.line, tok.column, tok.value.decode("latin-1"), reason)


def rules(text: str) -> HeaderRules:
    builder = HeaderRulesBuilder()
    for tokens in tokenize(text.encode(), "<t>"):
        if not builder.directive(tokens[0], tokens[1:], fail):
            raise AssertionError(f"not ours: {tokens[0].value!r}")
    return builder.build()


def edits(text: str) -> HeaderEdits:
    return rules(text).edits


UPSTREAM = [(b"Content-Type", b"text/html"), (b"X-Powered-By", b"PHP"), (b"Set-Cookie", b"a=1"),
            (b"x-powered-by", b"again"), (b"ETag", b'"e1"'), (b"Cache-Control", b"max-age=5")]


class LoadTests(SynchronousTestCase):
    """What loads, and what is refused with its token, line and reason."""

    def refused(self, text: str) -> RulesError:
        return self.assertRaises(RulesError, rules, text)

    def test_loads(self) -> None:
        """The three directives, in order, with their values as written."""
        e = edits("add_header X-A 1;\nadd_header X-B '$host:$server_port' always;\nproxy_hide_header X-Powered-By;"
                  "proxy_set_header Host $host; proxy_set_header X-Real-IP $remote_addr;")
        self.assertEqual([(a.name, a.source, a.always) for a in e.added],
                         [(b"X-A", b"1", False), (b"X-B", b"$host:$server_port", True)])
        self.assertEqual(e.hidden, frozenset({b"x-powered-by"}))
        self.assertEqual([(s.name, s.source) for s in e.sets], [(b"Host", b"$host"), (b"X-Real-IP", b"$remote_addr")])
        self.assertTrue(e.responds)
        self.assertTrue(e.always)

    def test_none(self) -> None:
        """Without directives nothing responds, nothing is set, no digest."""
        e = edits("proxy_redirect off;")
        self.assertEqual(e, HeaderEdits())
        self.assertFalse(e.responds or e.always or e.sets)
        self.assertEqual(e.digest, "")

    def test_argument_counts(self) -> None:
        """nginx's wording for a wrong number of arguments, on the directive name."""
        for text in ("add_header X;", "add_header X a always b;", "proxy_hide_header;",
                     "proxy_hide_header a b;", "proxy_set_header X;", "proxy_set_header X a b;"):
            err = self.refused(text)
            name = text.split()[0].rstrip(";")
            self.assertEqual(err.reason, f'invalid number of arguments in "{name}" directive')
            self.assertEqual((err.line, err.column), (1, 1))

    def test_always_only(self) -> None:
        """A third add_header argument other than "always" (case-sensitive) is refused on it."""
        err = self.refused("\n  add_header X a Always;")
        self.assertEqual(err.reason, 'invalid parameter "Always"')
        self.assertEqual((err.line, err.column, err.text), (2, 18, "Always"))

    def test_bad_names(self) -> None:
        """A name must be a header name."""
        for directive in ("add_header {} v;", "proxy_hide_header {};", "proxy_set_header {} v;"):
            for name in ("'X Y'", "'X:'", "''", "'é'"):
                err = self.refused(directive.format(name))
                self.assertTrue(err.reason.startswith("invalid header name"), err.reason)

    def test_framing_names(self) -> None:
        """Framing and hop-by-hop names are Prexy's, in all three directives, any case."""
        for name in ("Content-Length", "transfer-encoding", "Connection", "Upgrade", "TE", "Trailer",
                     "Keep-Alive", "Content-Encoding", "Content-Range", "Proxy-Authorization"):
            for directive in ("add_header {} v;", "proxy_hide_header {};", "proxy_set_header {} v;"):
                err = self.refused(directive.format(name))
                self.assertIn("frames the message or belongs to one connection", err.reason)
                self.assertEqual(err.text, name)

    def test_own_headers_not_hidden(self) -> None:
        """Via, Cache-Status and Server-Timing are Prexy's own: not hidden (but added to)."""
        for name in ("Via", "cache-status", "Server-Timing"):
            err = self.refused(f"proxy_hide_header {name};")
            self.assertEqual(err.reason, f'"{name}" cannot be hidden: Prexy adds it to every answer itself')
        edits("add_header Via extra;")

    def test_expect_not_set(self) -> None:
        """Expect is handled by Prexy itself."""
        self.assertIn("Prexy handles it itself", self.refused("proxy_set_header Expect 100-continue;").reason)

    def test_host(self) -> None:
        """An empty Host, or a second one, is refused."""
        self.assertIn("an empty Host", self.refused("proxy_set_header Host '';").reason)
        err = self.refused("proxy_set_header Host a;\nproxy_set_header host b;")
        self.assertEqual((err.line, err.reason),
                         (2, '"proxy_set_header Host" is duplicate: an upstream request has one Host'))

    def test_values(self) -> None:
        """CR, LF and NUL, captures, unknown variables and nginx's syntax errors."""
        self.assertIn("CR, LF or NUL", self.refused('add_header X "a\\nb";').reason)
        self.assertIn("CR, LF or NUL", self.refused('proxy_set_header X "a\\rb";').reason)
        err = self.refused("add_header X $1;")
        self.assertIn('regex captures such as "$1" do not exist in "add_header"', err.reason)
        for var in ("uri", "server_name", "request_id", "foo"):
            self.assertEqual(self.refused(f"add_header X ${var};").reason, f'unknown "{var}" variable')
        self.assertEqual(self.refused("proxy_set_header X ${host;").reason,
                         'the closing bracket in "host" variable is missing')
        self.assertEqual(self.refused("add_header X $;").reason, "invalid variable name")
        self.assertEqual(self.refused("add_header X $http_;").reason, 'unknown "http_" variable')

    def test_captures_of_header_rules_not_shared(self) -> None:
        """A proxy_redirect regex's named group is no variable of add_header."""
        err = self.refused("proxy_redirect ~(?<seg>x) /$seg; add_header X $seg;")
        self.assertEqual(err.reason, 'unknown "seg" variable')

    def test_whole_file(self) -> None:
        """Through parse_rules: the rule set's header rules carry them; a
        bad one names its file and line."""
        ruleset = parse_rules(b"replace_filter a b;\nadd_header X-Frame-Options DENY always;\n", "site.rules")
        self.assertEqual([a.name for a in ruleset.headers.edits.added], [b"X-Frame-Options"])
        err = self.assertRaises(RulesError, parse_rules, b"# c\nproxy_hide_header Content-Length;\n", "site.rules")
        self.assertEqual((err.filename, err.line), ("site.rules", 2))
        self.assertIn("site.rules:2", str(err))

    def test_digest_is_cache_neutral(self) -> None:
        """The header rules' digest (part of every cache key) ignores the
        edits, applied at delivery; the edits' own digest sees every change."""
        base = rules("proxy_redirect / /x/;")
        with_edits = rules("proxy_redirect / /x/; add_header X 1; proxy_hide_header Y; proxy_set_header Z 2;")
        self.assertEqual(base.digest, with_edits.digest)
        self.assertEqual(rules("add_header X 1;").digest, "")
        digests = {edits(t).digest for t in ("add_header X 1;", "add_header X 2;", "add_header X 1 always;",
                                             "add_header x 1;", "proxy_hide_header X;", "proxy_set_header X 1;")}
        self.assertEqual(len(digests), 6)

    def test_combine(self) -> None:
        """Combined rules files act as one file; Host set in two is a conflict."""
        combined = HeaderRules.combine([rules("add_header A 1; proxy_hide_header H;"),
                                        rules("add_header A 2 always; proxy_set_header Host $host;")])
        self.assertEqual(combined.edits, edits("add_header A 1; proxy_hide_header H;"
                                               "add_header A 2 always; proxy_set_header Host $host;"))
        self.assertRaises(HeaderRulesConflict, HeaderRules.combine,
                          [rules("proxy_set_header Host a;"), rules("proxy_set_header Host b;")])

    def test_bind_keeps_edits(self) -> None:
        """Binding proxy_redirect's default to a site keeps the edits."""
        r = rules("add_header A 1;")
        self.assertEqual(r.bind(b"http://o/").edits, r.edits)


class RespondTests(SynchronousTestCase):
    """add_header and proxy_hide_header on one answer, byte by byte."""

    def test_added_after_upstream(self) -> None:
        """Added at the end, in order, never replacing the upstream's."""
        e = edits("add_header Cache-Control no-transform; add_header X-A 1; add_header x-a 2;")
        self.assertEqual(e.respond(UPSTREAM, 200, VARS, False),
                         [*UPSTREAM, (b"Cache-Control", b"no-transform"), (b"X-A", b"1"), (b"x-a", b"2")])

    def test_statuses(self) -> None:
        """Without always, only nginx's ten statuses; with always, every one."""
        e = edits("add_header X-S s; add_header X-A a always;")
        for status in range(100, 600):
            out = e.respond([], status, VARS, False)
            if status in SAFE_STATUSES:
                self.assertEqual(out, [(b"X-S", b"s"), (b"X-A", b"a")])
            else:
                self.assertEqual(out, [(b"X-A", b"a")])
        self.assertEqual(sorted(SAFE_STATUSES), [200, 201, 204, 206, 301, 302, 303, 304, 307, 308])

    def test_own_answers(self) -> None:
        """Prexy's own answer: always ones only (even on a 200-class status), nothing hidden."""
        e = edits("add_header X-S s; add_header X-A a always; proxy_hide_header Content-Type;")
        head = [(b"Content-Type", b"text/html")]
        self.assertEqual(e.respond(head, 502, VARS, True), [*head, (b"X-A", b"a")])
        self.assertEqual(e.respond(head, 200, VARS, True), [*head, (b"X-A", b"a")])

    def test_empty_value(self) -> None:
        """An empty value, or one that expands to nothing, adds nothing."""
        e = edits("add_header X-E ''; add_header X-V $http_x_missing; add_header X-W $args always;")
        self.assertEqual(e.respond([(b"A", b"1")], 200, attrsevolve(VARS, request_uri=b"/"), False), [(b"A", b"1")])

    def test_hide(self) -> None:
        """Every header of a hidden name goes, any case, before the adds."""
        e = edits("proxy_hide_header x-POWERED-by; proxy_hide_header Set-Cookie; add_header X-Powered-By Prexy;")
        self.assertEqual(e.respond(UPSTREAM, 404, VARS, False),
                         [(b"Content-Type", b"text/html"), (b"ETag", b'"e1"'), (b"Cache-Control", b"max-age=5")])
        self.assertEqual(e.respond(UPSTREAM, 200, VARS, False)[-1], (b"X-Powered-By", b"Prexy"))

    def test_etag_and_last_modified_replace(self) -> None:
        """As nginx: add_header ETag / Last-Modified replace the last one
        there is in place (named as written); empty removes it."""
        head = [(b"etag", b'"a"'), (b"X", b"1"), (b"ETag", b'"b"'), (b"Last-Modified", b"Mon")]
        e = edits('add_header ETag "\\"n\\""; add_header last-modified Tue;')
        self.assertEqual(e.respond(head, 200, VARS, False),
                         [(b"etag", b'"a"'), (b"X", b"1"), (b"ETag", b'"n"'), (b"last-modified", b"Tue")])
        e = edits("add_header ETag ''; add_header Last-Modified '';")
        self.assertEqual(e.respond(head, 200, VARS, False), [(b"etag", b'"a"'), (b"X", b"1")])
        e = edits("add_header ETag x; add_header ETag y;")
        self.assertEqual(e.respond([], 200, VARS, False), [(b"ETag", b"y")])

    def test_variables(self) -> None:
        """Every variable, as nginx reads it."""
        names = ("host http_host scheme https server_port server_addr proxy_host remote_addr remote_port "
                 "request_method request_uri args query_string is_args server_protocol "
                 "proxy_add_x_forwarded_for http_user_agent http_cookie http_x_forwarded_for http_x_none HOST").split()
        e = edits("".join(f"add_header V{i} '[${{{n}}}]';" for i, n in enumerate(names)))
        got = [v for _, v in e.respond([], 200, VARS, False)]
        self.assertEqual(got, [b"[proxy.nl]", b"[Proxy.NL:8080]", b"[http]", b"[]", b"[8080]", b"[127.0.0.1]",
                               b"[origin:81]", b"[192.0.2.7]", b"[40000]", b"[GET]", b"[/a/b?x=1&y]", b"[x=1&y]",
                               b"[x=1&y]", b"[?]", b"[HTTP/1.1]", b"[10.0.0.1, 10.0.0.2, 192.0.2.7]", b"[UA1]",
                               b"[a=1; b=2]", b"[10.0.0.1, 10.0.0.2]", b"[]", b"[proxy.nl]"])

    def test_new_list(self) -> None:
        """The head given is never changed."""
        head = list(UPSTREAM)
        edits("proxy_hide_header ETag; add_header ETag x; add_header A 1;").respond(head, 200, VARS, False)
        self.assertEqual(head, UPSTREAM)

    @given(st.lists(st.tuples(st.sampled_from([b"A", b"a", b"B", b"ETag", b"etag", b"X-Y"]),
                              st.binary(max_size=4)), max_size=8),
           st.sampled_from([200, 206, 304, 404, 500, 502]), st.booleans())
    def test_properties(self, head: list[tuple[bytes, bytes]], status: int, own: bool) -> None:
        """Hiding removes exactly that name; adds (other than ETag) only
        append, what their status and always allow."""
        e = edits("proxy_hide_header a; add_header B b; add_header X-Y y always; add_header Z '';")
        out = e.respond(head, status, VARS, own)
        kept = head if own else [(n, v) for n, v in head if n.lower() != b"a"]
        adds = [(b"B", b"b")] if status in SAFE_STATUSES and not own else []
        self.assertEqual(out, [*kept, *adds, (b"X-Y", b"y")])
        self.assertEqual(HeaderEdits().respond(head, status, VARS, own), head)


class RequestHeadersTests(SynchronousTestCase):
    """proxy_set_header on a request going upstream, byte by byte."""

    SENT = [(b"Host", b"origin:81"), (b"Accept", b"*/*"), (b"x-real-ip", b"spoofed"),
            (b"X-Forwarded-For", b"10.0.0.1, 10.0.0.2, 192.0.2.7"), (b"Via", b"1.1 prexy")]

    def test_replace(self) -> None:
        """Same names (any case) go, the set ones come last, in order."""
        e = edits("proxy_set_header X-Real-IP $remote_addr; proxy_set_header Host $host;"
                  "proxy_set_header X-Forwarded-For $remote_addr; proxy_set_header X-Real-IP again;")
        self.assertEqual(e.request_headers(self.SENT, VARS),
                         [(b"Accept", b"*/*"), (b"Via", b"1.1 prexy"), (b"X-Real-IP", b"192.0.2.7"),
                          (b"Host", b"proxy.nl"), (b"X-Forwarded-For", b"192.0.2.7"), (b"X-Real-IP", b"again")])

    def test_empty_removes(self) -> None:
        """An empty value sends none, the client's included; a Host that
        expands to nothing keeps Prexy's."""
        e = edits("proxy_set_header Accept ''; proxy_set_header Via $http_x_none; proxy_set_header Host $http_x_none;")
        self.assertEqual(e.request_headers(self.SENT, VARS),
                         [(b"Host", b"origin:81"), (b"x-real-ip", b"spoofed"),
                          (b"X-Forwarded-For", b"10.0.0.1, 10.0.0.2, 192.0.2.7")])

    def test_proxy_add_x_forwarded_for(self) -> None:
        """nginx's idiom gives what Prexy sends anyway, with or without a chain."""
        e = edits("proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;")
        self.assertEqual(e.request_headers(self.SENT, VARS), self.SENT[:3] + [self.SENT[4], self.SENT[3]])
        alone = attrsevolve(VARS, headers={})
        self.assertEqual(e.request_headers([], alone), [(b"X-Forwarded-For", b"192.0.2.7")])

    def test_none(self) -> None:
        self.assertEqual(HeaderEdits().request_headers(self.SENT, VARS), self.SENT)

    @given(st.lists(st.tuples(st.sampled_from([b"A", b"a", b"B", b"Host", b"C"]), st.binary(min_size=1, max_size=3)),
                    max_size=8))
    def test_properties(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """The set names appear only with their values; the rest stays in order."""
        e = edits("proxy_set_header a 1; proxy_set_header B ''; proxy_set_header A 2;")
        out = e.request_headers(pairs, VARS)
        self.assertEqual(out, [(n, v) for n, v in pairs if n.lower() not in (b"a", b"b")] + [(b"a", b"1"), (b"A", b"2")])


class VarsTests(SynchronousTestCase):
    """RequestVars.of: what a request gives the variables."""

    def of(self, **kw: object) -> RequestVars:
        args: dict[str, object] = {"http_host": b"h", "secure": False, "local_host": "10.1.1.1", "local_port": 80,
                                   "proxy_host": "o"}
        args.update(kw)
        return RequestVars.of(**args)  # type: ignore[arg-type]

    def test_request_uri(self) -> None:
        """The target as sent; an absolute form's path and query (nginx's $request_uri)."""
        for uri, want in ((b"/a?b", b"/a?b"), (b"http://h:1/p?q", b"/p?q"), (b"HTTPS://h", b"/"),
                          (b"http://h?q", b"/?q"), (b"*", b"*"), (b"/x://y", b"/x://y")):
            self.assertEqual(self.of(uri=uri).request_uri, want, uri)

    def test_client(self) -> None:
        """A Unix socket's client is nginx's "unix:" without a port; HTTP/2 is "HTTP/2.0"."""
        v = self.of(remote_host="", protocol=b"HTTP/2")
        self.assertEqual((v.remote_addr, v.remote_port, v.server_protocol), (b"unix:", b"", b"HTTP/2.0"))
        v = self.of(remote_host="::1", remote_port=5, protocol=b"HTTP/1.0")
        self.assertEqual((v.remote_addr, v.remote_port, v.server_protocol), (b"::1", b"5", b"HTTP/1.0"))

    def test_args(self) -> None:
        """$args is after the first "?"; $is_args "?" only when there are some."""
        e = edits("add_header A '[$args][$is_args]';")
        for uri, want in ((b"/p", b"[][]"), (b"/p?", b"[][]"), (b"/p?a?b", b"[a?b][?]")):
            self.assertEqual(e.respond([], 200, self.of(uri=uri), False), [(b"A", want)])


def attrsevolve(vars: RequestVars, **changes: object) -> RequestVars:
    import attrs

    return attrs.evolve(vars, **changes)  # type: ignore[arg-type]
