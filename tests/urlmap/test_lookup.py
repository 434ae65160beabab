"""Lookups give nginx's answer: order of kinds, file order, captures, hostnames, PCRE syntax."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.urlmap import MapError, MapLookup, parse_map
from tests.cases import expand, parametrize


@expand
class HostnamesTests(SynchronousTestCase):
    """``hostnames`` maps: masks after exact keys, longest mask first, trailing dot dropped."""

    MAP = """
        hostnames;
        default none;
        example.com            exact;
        *.example.com          star;
        *.deep.example.com     deep-star;
        .dot.example.com       dot;
        www.example.*          tail;
        www.*                  www;
        ~^(?<sub>[a-z]+)\\.regex\\.org$ re-$sub;
    """

    @parametrize(
        ("key", "value", "kind"),
        [
            ("example.com", "exact", "exact"),
            ("EXAMPLE.COM.", "exact", "exact"),
            ("a.example.com", "star", "wildcard_head"),
            ("a.b.example.com", "star", "wildcard_head"),
            ("deep.example.com", "star", "wildcard_head"),
            ("x.deep.example.com", "deep-star", "wildcard_head"),
            ("dot.example.com", "dot", "wildcard_dot"),
            ("a.b.dot.example.com.", "dot", "wildcard_dot"),
            ("www.example.org", "tail", "wildcard_tail"),
            ("www.example.co.uk", "tail", "wildcard_tail"),
            ("www.example", "www", "wildcard_tail"),
            ("www.other.net", "www", "wildcard_tail"),
            ("www", "none", "default"),
            ("api.regex.org.", "re-api", "regex"),
            ("example.org", "none", "default"),
        ],
    )
    def test_lookup(self, key: str, value: str, kind: str) -> None:
        """Each key gets the value of the mask nginx's combined hash would pick."""
        got = parse_map(self.MAP).match(key)
        assert (got.value, got.kind) == (value, kind)

    def test_head_mask_beats_tail_mask(self) -> None:
        """A ``*.`` mask is consulted before any ``.*`` mask."""
        m = parse_map("hostnames; *.example.com head; www.example.* tail;")
        assert m.lookup("www.example.com") == "head"

    def test_without_hostnames_masks_are_exact_keys(self) -> None:
        """Without ``hostnames``, ``*.example.com`` is just a key and dots are kept."""
        m = parse_map("*.example.com star; example.com e;")
        assert m.lookup("a.example.com") == ""
        assert m.lookup("*.example.com") == "star"
        assert m.lookup("example.com.") == ""

    def test_hostnames_applies_to_later_entries(self) -> None:
        """Like nginx, ``hostnames`` affects keys added after it."""
        m = parse_map("*.a.com early; hostnames; *.b.com late;")
        assert m.lookup("x.a.com") == ""
        assert m.lookup("*.a.com") == "early"
        assert m.lookup("x.b.com") == "late"

    @parametrize("key", ["*.a.*", "a.*.com", "a..com", "*a.com"])
    def test_invalid_wildcards(self, key: str) -> None:
        """Masks nginx rejects are load errors."""
        with self.assertRaisesRegex(MapError, "invalid hostname or wildcard"):
            parse_map(f"hostnames; {key} v;", "h.map")

    @parametrize(
        "pair", [("example.com", ".example.com"), (".example.com", "example.com"),
                 ("*.a.com", "*.A.com"), ("www.a.*", "WWW.a.*"),
                 ("*.a.com", ".a.com"), (".a.com", "*.a.com")],
    )
    def test_conflicts(self, pair: tuple[str, str]) -> None:
        """A dot mask claims its bare name too; repeated masks conflict, and
        ``*.a.com`` and ``.a.com`` are the same name to nginx (verified with nginx 1.22)."""
        with self.assertRaisesRegex(MapError, "conflicting parameter"):
            parse_map(f"hostnames; {pair[0]} 1; {pair[1]} 2;", "h.map")


@expand
class PcreSyntaxTests(SynchronousTestCase):
    """Map regexes are PCRE; the translation keeps PCRE's meaning."""

    @parametrize(
        ("regex", "key", "matches"),
        [
            (r"^/a(?=b)", "/ab", True),
            (r"^/a(?!b)", "/ab", False),
            (r"(?<=/x)y", "/xy", True),
            (r"(?<!/x)y", "/xy", False),
            (r"^\d+$", "\u0663", False),  # \d is ASCII only without UCP
            (r"^\w$", "\xe9", False),
            (r"^\Qa.b\E$", "a.b", True),
            (r"^\Qa.b\E$", "axb", False),
            (r"^\x{41}\x42$", "AB", True),
            (r"^a\{,3}$", "a{,3}", True),
            (r"^a\Z", "a\n", True),
            (r"^a\z", "a\n", False),
            (r"^a$", "a\n", True),
            (r"^[[:alpha:]]+$", "abC", True),
            (r"^[[:^digit:]]+$", "ab1", False),
            (r"^a.c$", "a\nc", False),
            (r"^(?i)abc$", "ABC", True),
            (r"^a(?i)b|c$", "C", True),
            (r"^(?:a(?i)b)c$", "aBC", False),
            (r"^(a)\1$", "aa", True),
            (r"^(?<n>a)\k<n>$", "aa", True),
            (r"^(?<n>a)\g{n}$", "aa", True),
            (r"^(a)\g{-1}$", "aa", True),
            (r"^\101$", "A", True),
            (r"^a++b$", "aab", True),
            (r"^(?>a+)a$", "aaa", False),
            (r"^\h$", "\t", True),
            (r"^[\d-]+$", "1-", True),
            (r"^[a-z-]+$", "a-", True),
            (r"^[]a]+$", "]a", True),
            (r"^(?x) a b # comment", "ab", True),
            (r"^/(?#comment)x$", "/x", True),
            (r"^\Ax", "x", True),
            (r"^a{2}$", "aa", True),
            (r"^[a&&b]$", "&", True),
            (r"^(?(?=a)ab|cd)$", "cd", True),
            (r"^(?(?=a)ab|cd)$", "ad", False),
            (r"^(x)?(?(1)y|z)$", "xy", True),
            (r"^(x)?(?(1)y|z)$", "xz", False),
            (r"^/caf\xc3\xa9$", "/caf\xc3\xa9", True),
            (r"(?i)^/ABC$", "/abc", True),
            (r"^/abc\Gx", "/abcx", False),
            (r"^(\((?1)*\))$", "(()())", True),
            (r"^(\((?1)*\))$", "(()", False),
        ],
    )
    def test_match(self, regex: str, key: str, matches: bool) -> None:
        """Each construct matches (or not) as PCRE does."""
        quoted = '"~' + regex.replace("\\", "\\\\").replace('"', '\\"') + '"'
        m = parse_map(f"{quoted} yes;")
        assert (m.lookup(key) == "yes") is matches


@expand
class LookupTests(SynchronousTestCase):
    def test_exact_keys_are_case_insensitive_ascii_only(self) -> None:
        """Exact keys and input are lower-cased, ASCII letters only (bytes >= 0x80 unchanged)."""
        m = parse_map("/Old/Path /new; /caf\xc9 /cafe;")
        assert m.lookup("/OLD/path") == "/new"
        assert m.lookup("/CAF\xc9") == "/cafe"
        assert m.lookup("/caf\xe9") == ""

    def test_exact_beats_an_earlier_regex(self) -> None:
        """Exact keys are consulted before any regex, wherever they are in the file."""
        m = parse_map("~^/a regex; /a/b exact;")
        assert m.lookup("/a/b") == "exact"
        assert m.lookup("/a/c") == "regex"

    def test_first_regex_in_file_order_wins_across_index_buckets(self) -> None:
        """Candidates from different prefixes, pieces and unindexed regexes are tried in file order."""
        m = parse_map(
            r"""
        ~^/shop/item  by-long-prefix-late;
        ~^/shop       by-short-prefix;
        ~^/shop/item/ never;
        """
        )
        assert m.lookup("/shop/item/1") == "by-long-prefix-late"
        assert parse_map("~^/shop short; ~^/shop/item long;").lookup("/shop/item") == "short"
        m = parse_map(
            r"""
        ~item/\d+$      by-literal;
        ~^/shop/item/7  by-prefix;
        ~\d$            unindexed;
        """
        )
        assert m.lookup("/shop/item/7") == "by-literal"
        assert m.lookup("/shop/item/7x") == "by-prefix"
        assert m.lookup("/x/9") == "unindexed"
        assert m.match("/x/9") == MapLookup("unindexed", "regex", r"~\d$", "<map>", 4)

    def test_regex_is_a_search_not_anchored(self) -> None:
        """Without ``^``/``$`` a regex matches anywhere in the key."""
        assert parse_map("~old new;").lookup("/very/old/page") == "new"

    def test_regexes_never_tried_on_empty_key(self) -> None:
        """nginx skips regexes for an empty key; an exact empty key still matches it."""
        assert parse_map("default d; ~^$ empty-regex;").lookup("") == "d"
        assert parse_map('default d; "" empty-key;').lookup("") == "empty-key"

    def test_caseless_regex(self) -> None:
        """``~*`` matches ignoring ASCII case, including its indexed prefix."""
        m = parse_map(r"~*^/Legacy/(\d+)$ /items/$1; ~^/CS x;")
        assert m.lookup("/LEGACY/42") == "/items/42"
        assert m.lookup("/legacy/42") == "/items/42"
        assert m.lookup("/cs") == ""
        assert m.match("/LEGACY/1").kind == "regex_caseless"

    def test_numbered_captures(self) -> None:
        """``$1``..``$9`` and ``${1}`` are captures; ``$10`` is capture 1 then ``0``."""
        m = parse_map(r"~^/(a)(b)(c)(d)(e)(f)(g)(h)(i)(j) $9-${1}-$10;")
        assert m.lookup("/abcdefghij") == "i-a-a0"

    def test_unmatched_and_missing_groups_are_empty(self) -> None:
        """A group that did not take part, or does not exist, expands to nothing."""
        m = parse_map(r"~^/(x)?y(z)? [$1|$2|$5];")
        assert m.lookup("/y") == "[||]"

    def test_named_captures_both_syntaxes(self) -> None:
        """``(?<name>..)`` and ``(?P<name>..)`` are named groups, used as ``$name`` or ``${name}``."""
        m = parse_map(r"""
        ~^/u/(?<user>[a-z]+)/(?P<page>\d+) /users/$user/p${page}x;
        ~^/q/(?'q'\w+)  /q=$q;
    """)
        assert m.lookup("/u/ann/12") == "/users/ann/p12x"
        assert m.lookup("/q/zz") == "/q=zz"

    def test_captures_outside_a_regex_answer_are_empty(self) -> None:
        """An exact or default value using captures gets empty strings for them."""
        m = parse_map(r"default /d$1$name; /e /e$1; ~(?<name>zzz) z;")
        assert m.lookup("/e") == "/e"
        assert m.lookup("/other") == "/d"

    def test_variables_from_caller(self) -> None:
        """Non-capture variables come from the caller (mapping or callable); unknown ones are empty."""
        m = parse_map("default $scheme://$host/x; /a ${host}:$port;")
        assert m.variables == frozenset({"scheme", "host", "port"})
        assert m.lookup("/zz", {"scheme": "https", "host": "h"}) == "https://h/x"
        assert m.lookup("/a", lambda name: {"host": "h"}.get(name)) == "h:"
        assert m.lookup("/a") == ":"

    def test_values_without_dollar_are_verbatim(self) -> None:
        """Plain values come back as written (after token unescaping)."""
        assert parse_map(r'/a "/b c\td";').lookup("/a") == "/b c\td"

    def test_match_reports_the_answering_entry(self) -> None:
        """``match`` names the kind and key of the entry that answered (regexes with file:line)."""
        m = parse_map("default d;\n/A exact;\n~^/r(x) r$1;\n", "m.map")
        assert m.match("/a") == MapLookup("exact", "exact", "/a")
        assert m.match("/rx") == MapLookup("rx", "regex", "~^/r(x)", "m.map", 3)
        assert m.match("/z") == MapLookup("d", "default", "default")
        h = parse_map("hostnames; *.Example.com star;")
        assert h.match("a.example.com.") == MapLookup("star", "wildcard_head", "*.example.com")

    @parametrize(
        ("regex", "key", "value"),
        [
            (r"(?U)(a+)", "aaa", "[a]"),
            (r"(?U)(a+?)", "aaa", "[aaa]"),
            (r"(?n)(a)(?<x>b)", "ab", "[b]"),
            (r"(?x) ( a ) b # comment", "ab", "[a]"),
            (r"(*NO_JIT)(*LIMIT_MATCH=10)(a)", "a", "[a]"),
            (r"(a|ab)(c|bcd)(d*)", "abcd", "[a]"),
            (r"^(?:(a)|b)*$", "ab", "[a]"),
            (r"(?|(a)|(b))", "b", "[b]"),
        ],
    )
    def test_pcre_options_and_captures(self, regex: str, key: str, value: str) -> None:
        """Captures under PCRE options (ungreedy, no auto-capture, extended, start-of-pattern
        limits) and PCRE's capture rules, each checked against nginx 1.22."""
        assert parse_map(f'"~{regex}" "[$1]";').lookup(key) == value
