"""Unit tests of :mod:`prexy.headerrules`: nginx's proxy_redirect,
proxy_cookie_domain and proxy_cookie_path, and replace_filter_headers.

Directives go through :func:`prexy.substitution.rules.tokenize` and the
builder, as a rules file would.  The same behaviours are checked against a
real nginx in ``tests/integration/test_headerrules_nginx.py``.
"""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy import headerrules
from prexy.headerrules import (
    HeaderRules,
    HeaderRulesBuilder,
    HeaderRulesConflict,
    RequestVars,
    parse_cookie,
)
from prexy.substitution.rules import RulesError, Token, tokenize

VARS = RequestVars(b"http", b"proxy.nl", b"Proxy.NL:8080", 8080, b"www.origin.com")
UP = b"https://www.origin.com/"


def fail(tok: Token, reason: str) -> RulesError:
    return RulesError("<t>", tok.line, tok.column, tok.value.decode("latin-1"), reason)


def rules(text: str) -> HeaderRules:
    builder = HeaderRulesBuilder()
    for tokens in tokenize(text.encode(), "<t>"):
        if not builder.directive(tokens[0], tokens[1:], fail):
            raise AssertionError(f"not ours: {tokens[0].value!r}")
    return builder.build()


def one(text: str, name: bytes, value: bytes, vars: RequestVars = VARS) -> bytes:
    """The value of the only header after ``text``'s rules (bound to UP)."""
    ((_, out),) = rules(text).bind(UP).apply([(name, value)], vars)
    return out


class BuilderTests(SynchronousTestCase):
    def refused(self, text: str) -> RulesError:
        return self.assertRaises(RulesError, rules, text)

    def test_not_ours(self) -> None:
        """Directives of other modules are declined with False, nothing raised."""
        builder = HeaderRulesBuilder()
        (tokens,) = tokenize(b"replace_filter a b;", "<t>")
        self.assertFalse(builder.directive(tokens[0], tokens[1:], fail))
        self.assertEqual(builder.build(), HeaderRules.default())

    def test_argument_counts(self) -> None:
        """nginx's wording for a wrong number of arguments, on the directive name."""
        for name in ("proxy_redirect", "proxy_cookie_domain", "proxy_cookie_path"):
            for args in ("", " a b c"):
                err = self.refused(f"{name}{args};")
                self.assertEqual(err.reason, f'invalid number of arguments in "{name}" directive')
                self.assertEqual((err.line, err.column), (1, 1))
        err = self.refused("replace_filter_headers;")
        self.assertEqual(err.reason, 'invalid number of arguments in "replace_filter_headers" directive')

    def test_invalid_parameter(self) -> None:
        """One argument must be off (or default for proxy_redirect), case-sensitively."""
        for text, bad in (("proxy_redirect x;", "x"), ("proxy_redirect OFF;", "OFF"),
                          ("proxy_redirect Default;", "Default"), ("proxy_cookie_path default;", "default"),
                          ("proxy_cookie_domain x;", "x")):
            err = self.refused(text)
            self.assertEqual(err.reason, f'invalid parameter "{bad}"')
            self.assertEqual(err.text, bad)

    def test_off_is_duplicate(self) -> None:
        """off with any other directive of the same name, either order, is "duplicate"."""
        for name in ("proxy_redirect", "proxy_cookie_domain", "proxy_cookie_path"):
            other = "default" if name == "proxy_redirect" else "a b"
            for text in (f"{name} off; {name} off;", f"{name} off; {name} {other};",
                         f"{name} {other}; {name} off;", f"{name} a b; {name} off;"):
                self.assertEqual(self.refused(text).reason, f'"{name}" directive is duplicate')

    def test_bad_regex(self) -> None:
        """A regex that does not compile is refused at load, naming the pattern."""
        for text, pattern in (("proxy_redirect ~(a b;", "(a"), ("proxy_redirect ~*[ b;", "["),
                              ("proxy_cookie_domain ~*a b;", "*a"), ("proxy_cookie_path ~**a b;", "*a"),
                              ("proxy_redirect ~(?<a>x)(?<a>y) b;", "(?<a>x)(?<a>y)"),
                              ("proxy_redirect ~(?<a>x)(?<A>y) b;", "(?<a>x)(?<A>y)"),
                              ("proxy_redirect ~(?<1a>x) b;", "(?<1a>x)"),
                              ("proxy_redirect ~(?<%s>x) b;" % ("a" * 33), "(?<%s>x)" % ("a" * 33))):
            err = self.refused(text)
            self.assertTrue(err.reason.startswith(f'bad regex "{pattern}": '), err.reason)

    def test_capture_named_like_a_variable(self) -> None:
        """A named capture may not take a variable's name (nginx: "the duplicate")."""
        for var in ("host", "HTTP_HOST", "scheme", "server_port", "proxy_host"):
            err = self.refused(f"proxy_redirect ~(?<{var}>a) b;")
            self.assertEqual(err.reason, f'the duplicate "{var.lower()}" variable')

    def test_variable_syntax(self) -> None:
        """nginx's script syntax errors: a lone $, ${} and an unclosed ${."""
        for text, reason in (("proxy_redirect a $;", "invalid variable name"),
                             ("proxy_redirect a ${};", "invalid variable name"),
                             ("proxy_redirect a $-;", "invalid variable name"),
                             ("proxy_redirect a ${;", "invalid variable name"),
                             ("proxy_redirect a ${host;", 'the closing bracket in "host" variable is missing'),
                             ("proxy_cookie_path /$ b;", "invalid variable name")):
            self.assertEqual(self.refused(text).reason, reason)

    def test_unknown_variable(self) -> None:
        """Unknown names (lower-cased, as nginx prints them) are refused at build()."""
        for text, name, where in (("proxy_redirect a $foo;", "foo", "$foo"), ("proxy_redirect $FOO b;", "foo", "$FOO"),
                                  ("proxy_redirect a $0;", "0", "$0"), ("proxy_redirect ~a $h;", "h", "$h"),
                                  ("proxy_redirect a $uri;", "uri", "$uri"),
                                  ("proxy_cookie_domain a x$host_x;", "host_x", "x$host_x")):
            err = self.refused(text)
            self.assertEqual(err.reason, f'unknown "{name}" variable')
            self.assertEqual(err.text, where)

    def test_known_variables(self) -> None:
        """The five variables in any case, braces, captures, and named captures
        of any regex of the file, even a later one."""
        rules("proxy_redirect a $HOST${http_host}$Scheme$server_port$proxy_host$1$9;")
        rules("proxy_cookie_path / /$seg; proxy_redirect ~(?<Seg>x) $SEG;")
        rules("proxy_redirect ~(?P<n>a) $n; proxy_cookie_domain ~(?'q'a) $q;")

    def test_filter_headers_refused(self) -> None:
        """Framing and hop-by-hop headers, bad names and "off" are refused."""
        for name in ("Content-Length", "transfer-encoding", "Content-Encoding", "Connection",
                     "Keep-Alive", "TE", "Trailer", "Upgrade", "Content-Range"):
            err = self.refused(f"replace_filter_headers Location {name};")
            self.assertIn("cannot be rewritten", err.reason)
            self.assertEqual(err.text, name)
        self.assertEqual(self.refused("replace_filter_headers 'a b';").reason, 'invalid header name "a b"')
        self.assertEqual(self.refused("replace_filter_headers '';").reason, 'invalid header name ""')
        self.assertIn('invalid parameter "off"', self.refused("replace_filter_headers off;").reason)

    def test_regex_translation(self) -> None:
        """PCRE's \\Q...\\E quoting, (?'name'...) groups and comments are understood."""
        self.assertEqual(one(r"proxy_redirect ~^\Qa(.\E$ ok;", b"Location", b"a(."), b"ok")
        self.assertEqual(one(r"proxy_redirect ~^\Qa(.\E$ ok;", b"Location", b"a(x"), b"a(x")
        self.assertEqual(one(r"proxy_redirect ~^[\Q]\E]$ ok;", b"Location", b"]"), b"ok")
        self.assertEqual(one("proxy_redirect ~^(?'n'x)(?#(c) /$n;", b"Location", b"xy"), b"http://proxy.nl:8080/x")
        self.assertEqual(one("proxy_redirect ~^[]a(]+$ ok;", b"Location", b"a(]"), b"ok")
        self.assertEqual(one("proxy_redirect ~^[[:digit:]]+$ ok;", b"Location", b"42"), b"ok")


class RedirectTests(SynchronousTestCase):
    def test_default(self) -> None:
        """No directive: FROM the upstream prefix TO /, then made absolute."""
        out = HeaderRules.default().bind(UP).apply([(b"Location", UP + b"a?b")], VARS)
        self.assertEqual(out, [(b"Location", b"http://proxy.nl:8080/a?b")])

    def test_unbound_default_does_nothing(self) -> None:
        """Before bind() the default has no prefix: nothing changes, nothing active."""
        self.assertFalse(HeaderRules.default().active)
        headers = [(b"Location", UP + b"a")]
        self.assertEqual(HeaderRules.default().apply(headers, VARS), headers)
        self.assertTrue(HeaderRules.default().bind(UP).active)

    def test_off(self) -> None:
        """proxy_redirect off leaves Location, Refresh and Content-Location alone."""
        r = rules("proxy_redirect off;").bind(UP)
        headers = [(b"Location", UP + b"a"), (b"Refresh", b"0; url=" + UP), (b"Content-Location", UP)]
        self.assertEqual(r.apply(headers, VARS), headers)
        self.assertFalse(r.active)

    def test_prefix(self) -> None:
        """A string FROM is a case-sensitive prefix; the rest of the value is kept."""
        text = "proxy_redirect https://www.origin.com/a/ /b/;"
        self.assertEqual(one(text, b"Location", UP + b"a/x?y"), b"http://proxy.nl:8080/b/x?y")
        self.assertEqual(one(text, b"Location", b"HTTPS://www.origin.com/a/x"), b"HTTPS://www.origin.com/a/x")

    def test_explicit_rules_replace_the_default(self) -> None:
        """Explicit rules without default: the upstream prefix is not rewritten."""
        self.assertEqual(one("proxy_redirect http://x/ /;", b"Location", UP + b"a"), UP + b"a")
        text = "proxy_redirect http://x/ /; proxy_redirect default;"
        self.assertEqual(one(text, b"Location", UP + b"a"), b"http://proxy.nl:8080/a")

    def test_default_with_two_arguments_is_a_string(self) -> None:
        """proxy_redirect default x; is the literal prefix "default"."""
        self.assertEqual(one("proxy_redirect default /z/;", b"Location", b"default/a"), b"http://proxy.nl:8080/z//a")
        self.assertEqual(one("proxy_redirect default /z/;", b"Location", UP + b"a"), UP + b"a")

    def test_first_match_wins(self) -> None:
        """Rules are tried in order; the first that matches is the only one applied."""
        text = "proxy_redirect / /one/; proxy_redirect /x /two/;"
        self.assertEqual(one(text, b"Location", b"/x"), b"http://proxy.nl:8080/one/x")

    def test_regex(self) -> None:
        """~ searches case-sensitively; the whole value becomes TO with captures."""
        text = r"proxy_redirect ~^https?://([^/]+)/(.*)$ http://$1.proxy/$2;"
        self.assertEqual(one(text, b"Location", UP + b"p?q"), b"http://www.origin.com.proxy/p?q")
        self.assertEqual(one("proxy_redirect ~origin /x;", b"Location", UP + b"p"), b"http://proxy.nl:8080/x")
        self.assertEqual(one("proxy_redirect ~ORIGIN /x;", b"Location", UP), UP)
        self.assertEqual(one("proxy_redirect ~*ORIGIN /x;", b"Location", UP), b"http://proxy.nl:8080/x")

    def test_captures(self) -> None:
        """$1..$9 are one digit ($10 is $1 then 0); unset groups are empty; named captures."""
        self.assertEqual(one("proxy_redirect ~^(.)(.) $2$1$10$9;", b"Location", b"ab"), b"baa0")
        self.assertEqual(one("proxy_redirect ~(a)|(b) [$1][$2][$3];", b"Location", b"b"), b"[][b][]")
        self.assertEqual(one("proxy_redirect ~(?<h>b) $h$H${h};", b"Location", b"abc"), b"bbb")

    def test_stale_captures(self) -> None:
        """Like nginx, captures outlive their header: the last regex that matched
        in this response, even on an earlier header; one without groups clears them."""
        text = "proxy_redirect ~^/f(o)o /1:$1; proxy_redirect ~bar /2:$1; proxy_redirect / /3:$1;"
        headers = [(b"Location", b"/x"), (b"Location", b"/foo"), (b"Location", b"/z"), (b"Location", b"/bar"), (b"Location", b"/y")]
        out = [v for _, v in rules(text).apply(headers, VARS)]
        self.assertEqual(out, [b"/3:x", b"/1:o", b"/3:oz", b"/2:", b"http://proxy.nl:8080/3:y"])

    def test_variables(self) -> None:
        """Variables in FROM (expanded per request) and in TO."""
        self.assertEqual(one("proxy_redirect http://$host/ /h/;", b"Location", b"http://proxy.nl/a"), b"http://proxy.nl:8080/h/a")
        text = "proxy_redirect / $scheme://$http_host/$server_port/$proxy_host/;"
        self.assertEqual(one(text, b"Location", b"/a"), b"http://Proxy.NL:8080/8080/www.origin.com/a")

    def test_absolute_ports(self) -> None:
        """The port is left out for http on 80 and https on 443 only."""
        for scheme, port, prefix in ((b"http", 80, b"http://h"), (b"https", 443, b"https://h"),
                                     (b"https", 80, b"https://h:80"), (b"http", 443, b"http://h:443"),
                                     (b"https", 8443, b"https://h:8443")):
            vars = RequestVars(scheme, b"h", b"H", port, b"o")
            self.assertEqual(one("proxy_redirect / /;", b"Location", b"/a", vars), prefix + b"/a")

    def test_only_last_rewritten_location_is_absolute(self) -> None:
        """nginx makes absolute the last Location the rules rewrote, no other."""
        r = rules("proxy_redirect /a /b;")
        out = r.apply([(b"Location", b"/a1"), (b"Location", b"/a2"), (b"Location", b"/c")], VARS)
        self.assertEqual([v for _, v in out], [b"/b1", b"http://proxy.nl:8080/b2", b"/c"])
        out = r.apply([(b"Location", b"/c"), (b"Location", b"a")], VARS)
        self.assertEqual([v for _, v in out], [b"/c", b"a"])
        self.assertEqual(one("proxy_redirect / x/;", b"Location", b"/a"), b"x/a")

    def test_refresh(self) -> None:
        """Refresh: only after the first caseless url= (even inside curl=); never absolute."""
        text = "proxy_redirect / /r/;"
        for value, expected in ((b"0;url=/a", b"0;url=/r/a"), (b"0; curl=/b; url=/c", b"0; curl=/r/b; url=/c"),
                                (b"/d", b"/d"), (b"3; uRl= /e", b"3; uRl= /e"), (b"1; URL=/f", b"1; URL=/r/f")):
            self.assertEqual(one(text, b"Refresh", value), expected)
        self.assertEqual(one("proxy_redirect ~^/(.) x$1;", b"Refresh", b"0; url=/abc"), b"0; url=xa")

    def test_content_location(self) -> None:
        """Prexy's extension: Content-Location like Location, never made absolute,
        and it is not "the last Location"."""
        r = rules("proxy_redirect / /r/;")
        out = r.apply([(b"Location", b"/a"), (b"Content-Location", b"/b")], VARS)
        self.assertEqual(out, [(b"Location", b"http://proxy.nl:8080/r/a"), (b"Content-Location", b"/r/b")])

    def test_names_caseless_order_and_repeats_kept(self) -> None:
        """Header names match in any case, keep their case; order and repeats stay."""
        headers = [(b"X-A", b"/1"), (b"LOCATION", b"/2"), (b"set-cookie", b"a=1; path=/3"),
                   (b"Set-Cookie", b"b=1; Path=/4"), (b"X-A", b"/5")]
        out = rules("proxy_redirect / /r/; proxy_cookie_path / /p/;").apply(headers, VARS)
        self.assertEqual(out, [(b"X-A", b"/1"), (b"LOCATION", b"http://proxy.nl:8080/r/2"),
                               (b"set-cookie", b"a=1; path=/p/3"), (b"Set-Cookie", b"b=1; Path=/p/4"), (b"X-A", b"/5")])

    def test_regex_timeout_is_no_match(self) -> None:
        """A regex running past REGEX_TIMEOUT counts as no match (the next rule runs)."""
        r = rules("proxy_redirect ~^(a|aa)+$ /slow; proxy_redirect a /fast;")
        with mock.patch.object(headerrules, "REGEX_TIMEOUT", 0.001):
            ((_, out),) = r.apply([(b"Location", b"a" * 60 + b"b")], VARS)
        # Without the timeout this backtracks for ages (2**60 ways to split).
        self.assertEqual(out, b"http://proxy.nl:8080/fast" + b"a" * 59 + b"b")


class CookieTests(SynchronousTestCase):
    def test_parse(self) -> None:
        """nginx's cut: every ';', spaces (not tabs) trimmed, None without '='."""
        self.assertEqual(parse_cookie(b" a = 1 ;; b;c=\t;d=x=y; "),
                         [(b"a", b"1"), (b"", None), (b"b", None), (b"c", b"\t"), (b"d", b"x=y"), (b"", None)])

    def test_domain(self) -> None:
        """Domain: caseless exact match past a leading dot that is kept; the
        pattern's and replacement's leading dots are dropped at load."""
        text = "proxy_cookie_domain .Origin.com .proxy.nl;"
        self.assertEqual(one(text, b"Set-Cookie", b"a=1; Domain=.origin.COM"), b"a=1; Domain=.proxy.nl")
        self.assertEqual(one(text, b"Set-Cookie", b"a=1; domain=origin.com; x"), b"a=1; domain=proxy.nl; x")
        self.assertEqual(one(text, b"Set-Cookie", b"a=1; Domain=sub.origin.com"), b"a=1; Domain=sub.origin.com")
        self.assertEqual(one("proxy_cookie_domain . x;", b"Set-Cookie", b"a=1; Domain=.;b"), b"a=1; Domain=.x; b")

    def test_domain_regex(self) -> None:
        """Domain regexes are caseless and replace the whole value, dot included."""
        text = r"proxy_cookie_domain ~^\.?(.*)\.ORIGIN\.com$ $1.proxy.nl;"
        self.assertEqual(one(text, b"Set-Cookie", b"a=1; Domain=.www.origin.com"), b"a=1; Domain=www.proxy.nl")

    def test_path(self) -> None:
        """Path: case-sensitive prefix; regexes ~ and ~* replace the whole value."""
        self.assertEqual(one("proxy_cookie_path /app/ /;", b"Set-Cookie", b"a=1;Path=/app/x"), b"a=1; Path=/x")
        self.assertEqual(one("proxy_cookie_path /app/ /;", b"Set-Cookie", b"a=1;Path=/APP/x"), b"a=1;Path=/APP/x")
        self.assertEqual(one("proxy_cookie_path ~^/app /y;", b"Set-Cookie", b"a=1;Path=/APP"), b"a=1;Path=/APP")
        self.assertEqual(one("proxy_cookie_path ~*^/app(.*) /y$1;", b"Set-Cookie", b"a=1;Path=/APP/z"), b"a=1; Path=/y/z")

    def test_rebuild(self) -> None:
        """A rewritten cookie is rebuilt with "; ", keeping empty attributes and a trailing one."""
        value = b" e = 5 ;; Domain=origin.com;Path=/app/;"
        self.assertEqual(one("proxy_cookie_path /app/ /;", b"Set-Cookie", value), b"e=5; ; Domain=origin.com; Path=/; ")

    def test_untouched(self) -> None:
        """No '=' in the first pair, the first pair itself, no value, nothing matching: untouched."""
        text = "proxy_cookie_path / /p/; proxy_cookie_domain ~ d;"
        for value in (b"d; Domain=x; Path=/", b"Path=/a; b", b"a=1; Path; Domain", b"a=1", b"a=1; Path=x ;  z"):
            self.assertEqual(one(text, b"Set-Cookie", value), value)

    def test_every_domain_and_path(self) -> None:
        """Every Domain and Path attribute is rewritten, first matching rule each."""
        text = "proxy_cookie_domain a b; proxy_cookie_domain ~ z; proxy_cookie_path / /p/;"
        self.assertEqual(one(text, b"Set-Cookie", b"n=v; Domain=a; domain=.c; Path=/x; PATH=/y"),
                         b"n=v; Domain=b; domain=z; Path=/p/x; PATH=/p/y")

    @given(st.lists(st.sampled_from([b"a", b"=", b";", b" ", b"\t", b".", b"Domain", b"path", b"origin.com", b"/"]), max_size=30))
    @settings(max_examples=300, deadline=None)
    def test_random_cookies(self, pieces: list[bytes]) -> None:
        """Random Set-Cookie values never crash; rules that cannot match leave them
        untouched; a rewrite keeps the number of attributes."""
        value = b"".join(pieces)
        never = rules("proxy_cookie_domain never.invalid x; proxy_cookie_path /never/ /x;")
        self.assertEqual(never.apply([(b"Set-Cookie", value)], VARS), [(b"Set-Cookie", value)])
        ((_, out),) = rules("proxy_cookie_domain ~ d; proxy_cookie_path '' /p;").apply([(b"Set-Cookie", value)], VARS)
        self.assertEqual(len(parse_cookie(out)), len(parse_cookie(value)))


class FilterHeadersTests(SynchronousTestCase):
    def test_substitute(self) -> None:
        """Named headers (any case) get substitute(value), after the nginx rewrites
        and before a Location is made absolute; others do not; repeats each."""
        r = rules("proxy_redirect / /r/; replace_filter_headers location LINK; replace_filter_headers Link;")
        self.assertEqual(r.filter_headers, (b"location", b"link"))
        headers = [(b"Location", b"/a"), (b"Link", b"<a>"), (b"Link", b"<aa>"), (b"X", b"a")]
        out = r.apply(headers, VARS, lambda v: v.replace(b"a", b"b"))
        self.assertEqual(out, [(b"Location", b"http://proxy.nl:8080/r/b"), (b"Link", b"<b>"), (b"Link", b"<bb>"), (b"X", b"a")])
        self.assertEqual(r.apply(headers[1:], VARS), headers[1:])

    @given(st.lists(st.tuples(st.sampled_from([b"Location", b"Refresh", b"Set-Cookie", b"Link", b"X"]),
                              st.binary(max_size=40)), max_size=8))
    @settings(max_examples=200, deadline=None)
    def test_names_and_order_kept(self, headers: list[tuple[bytes, bytes]]) -> None:
        """Whatever the values, apply() returns the same names in the same order."""
        r = rules("proxy_redirect ~(.)(.)? $2$1; proxy_cookie_path / /p; replace_filter_headers Link;")
        out = r.apply(headers, VARS, lambda v: v[::-1])
        self.assertEqual([n for n, _ in out], [n for n, _ in headers])


class CombineBindDigestTests(SynchronousTestCase):
    def test_combine(self) -> None:
        """Parts concatenate in order, as one file; header lists merge."""
        a = rules("proxy_redirect /a /1/; replace_filter_headers Link;")
        b = rules("proxy_redirect / /2/; proxy_cookie_path / /p/; replace_filter_headers link X;")
        c = HeaderRules.combine([a, HeaderRules.default(), b])
        self.assertEqual(c, rules("proxy_redirect /a /1/; proxy_redirect / /2/; proxy_cookie_path / /p/; replace_filter_headers Link X;"))
        self.assertEqual(HeaderRules.combine([]), HeaderRules.default())
        self.assertIs(HeaderRules.combine([a]), a)

    def test_combine_conflicts(self) -> None:
        """off in one part and the same directive in another is refused."""
        for x, y in (("proxy_redirect off;", "proxy_redirect default;"), ("proxy_redirect / /;", "proxy_redirect off;"),
                     ("proxy_cookie_path off;", "proxy_cookie_path off;"), ("proxy_cookie_domain a b;", "proxy_cookie_domain off;")):
            err = self.assertRaises(HeaderRulesConflict, HeaderRules.combine, [rules(x), rules(y)])
            self.assertIn("directive is duplicate", str(err))
        HeaderRules.combine([rules("proxy_redirect off;"), rules("proxy_cookie_path off;")])

    def test_bind(self) -> None:
        """bind() turns each default into FROM prefix TO / in place; off and a
        second bind change nothing."""
        r = rules("proxy_redirect /x /y; proxy_redirect default;").bind(UP)
        self.assertEqual(r.apply([(b"Location", UP + b"z"), (b"Location", b"/xa")], VARS),
                         [(b"Location", b"/z"), (b"Location", b"http://proxy.nl:8080/ya")])
        self.assertEqual(r.bind(b"http://other/"), r)
        off = rules("proxy_redirect off;")
        self.assertEqual(off.bind(UP), off)

    def test_digest(self) -> None:
        """"" for the default however reached; stable, and different for different rules."""
        self.assertEqual(HeaderRules.default().digest, "")
        self.assertEqual(HeaderRules.default().bind(UP).digest, "")
        self.assertEqual(rules("proxy_redirect default;").digest, "")
        texts = ["proxy_redirect off;", "proxy_redirect / /;", "proxy_redirect / /x;", "proxy_redirect ~/ /;",
                 "proxy_cookie_path / /;", "proxy_cookie_domain / /;", "replace_filter_headers Link;",
                 "proxy_redirect / /; proxy_redirect default;"]
        digests = [rules(t).digest for t in texts]
        self.assertEqual(len(set(digests)), len(texts))
        self.assertEqual(digests, [rules(t).digest for t in texts])
        self.assertTrue(all(len(d) == 16 and int(d, 16) >= 0 for d in digests))
        self.assertEqual(rules(texts[1]).bind(UP).digest, digests[1])
        self.assertEqual(rules("replace_filter_headers A B;").digest, rules("replace_filter_headers b a;").digest)

    def test_active(self) -> None:
        """active: something apply() can change."""
        self.assertFalse(rules("proxy_redirect off; proxy_cookie_path off;").active)
        self.assertTrue(rules("proxy_cookie_path / /;").active)
        self.assertTrue(rules("proxy_redirect off; replace_filter_headers Link;").active)


class RequestVarsOfTests(SynchronousTestCase):
    def test_from_a_request(self) -> None:
        """$host drops the port and lower-cases; IPv6 keeps its brackets;
        no Host: the server address."""
        of = RequestVars.of
        v = of(http_host=b"Clone.Test:8080", secure=True, local_host="10.0.0.1", local_port=8443, proxy_host="o:81")
        self.assertEqual((v.scheme, v.host, v.http_host, v.server_port, v.proxy_host),
                         (b"https", b"clone.test", b"Clone.Test:8080", 8443, b"o:81"))
        self.assertEqual(of(http_host=b"[::1]:80", secure=False, local_host="::1", local_port=80, proxy_host="o").host, b"[::1]")
        self.assertEqual(of(http_host=b"", secure=False, local_host="10.0.0.1", local_port=80, proxy_host="o").host, b"10.0.0.1")
