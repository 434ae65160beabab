"""The rules-file parser: nginx tokens, directives, and load errors with positions."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution.rules import RulesError, load_rules, parse_rules, parse_size, tokenize
from prexy.substitution.transducer import Transducer
from tests.cases import expand, parametrize, tmp_dir


def values(text: bytes) -> list[list[bytes]]:
    return [[t.value for t in d] for d in tokenize(text, "t.conf")]


@expand
class RulesTests(SynchronousTestCase):
    def test_tokens_quotes_and_unescaping(self) -> None:
        """Quotes group words; \\" \\' \\\\ \\t \\r \\n unescape, other pairs stay."""
        text = b"""replace_filter 'a\\.b\\d' "x\\"y\\ty" g;  # comment ; here
replace_filter bare\\d\\\\ 'it\\'s' ;"""
        assert values(text) == [
            [b"replace_filter", b"a\\.b\\d", b'x"y\ty', b"g"],
            [b"replace_filter", b"bare\\d\\", b"it's"],
        ]

    def test_hash_inside_token_is_not_a_comment(self) -> None:
        """``#`` starts a comment only between tokens."""
        assert values(b"replace_filter a#b '#c';") == [[b"replace_filter", b"a#b", b"#c"]]

    def test_directives_build_ruleset(self) -> None:
        """All four directives are understood; defaults as in the module."""
        rs = parse_rules(
            b"""
        replace_filter 'www\\.example\\.com' 'www.example.nl' g;
        replace_filter '(UA-)\\d+-\\d+' '${1}99999-9' gi;
        replace_filter_types text/css application/javascript;
        replace_filter_max_buffered_size 16k;
        replace_filter_last_modified keep;
        """,
            "site.rules",
        )
        assert [r.pattern for r in rs.rules] == [b"www\\.example\\.com", b"(UA-)\\d+-\\d+"]
        assert [(r.once, r.caseless) for r in rs.rules] == [(False, False), (False, True)]
        assert rs.types == frozenset({"text/html", "text/css", "application/javascript"})
        assert rs.max_buffered_size == 16384
        assert rs.keep_last_modified is True
        assert rs.applies_to("text/css; charset=utf-8")
        assert rs.applies_to("TEXT/HTML")
        assert not rs.applies_to("image/png")
        t = Transducer(rs)
        out = t.feed(b"<a href=//www.example.com>ua-12-3</a>") + t.finish()
        assert out == b"<a href=//www.example.nl>ua-99999-9</a>"

    def test_defaults(self) -> None:
        """Without settings: 8k limit, text/html only, Last-Modified cleared."""
        rs = parse_rules(b"replace_filter a b;")
        assert rs.max_buffered_size == 8192
        assert rs.types == frozenset({"text/html"})
        assert rs.keep_last_modified is False
        assert rs.rules[0].once

    def test_applies_to_header_answers_as_applies_to(self) -> None:
        """The raw-header form gives applies_to's answer, asked twice (the
        second from its memory), and treats a missing header as no type."""
        rs = parse_rules(b"replace_filter a b; replace_filter_types text/css;")
        for _ in range(2):
            assert rs.applies_to_header(b"text/html; charset=utf-8")
            assert rs.applies_to_header(b"TEXT/CSS")
            assert not rs.applies_to_header(b"image/png")
            assert not rs.applies_to_header(None)
            assert not rs.applies_to_header(b"")

    def test_star_type_applies_to_all(self) -> None:
        """``replace_filter_types *`` applies to every type."""
        rs = parse_rules(b"replace_filter a b; replace_filter_types *;")
        assert rs.applies_to("application/octet-stream")

    def test_no_rules_never_applies(self) -> None:
        """A rules file without replace_filter leaves every response alone."""
        assert not parse_rules(b"replace_filter_types *;").applies_to("text/html")

    @parametrize(
        ("size", "expected"),
        [
            (b"0", 0),
            (b"8192", 8192),
            (b"8k", 8192),
            (b"8K", 8192),
            (b"1m", 1 << 20),
            (b"x", None),
            (b"1g", None),
            (b"k", None),
        ],
    )
    def test_sizes(self, size: bytes, expected: int | None) -> None:
        """nginx sizes: bytes, k and m suffixes."""
        assert parse_size(size) == expected

    @parametrize(
        ("text", "where", "reason"),
        [
            (b"replace_filter a b gx;", "t.conf:1:20", "unknown flag 'x' in \"gx\""),
            (b"\n\nreplace_filter a b 'gx';", "t.conf:3:20", "unknown flag 'x'"),
            (b"replace_filter a;", "t.conf:1:1", "invalid number of arguments"),
            (b"replace_filtr a b;", "t.conf:1:1", 'unknown directive "replace_filtr"'),
            (b"replace_filter a b", "t.conf:1:1", "expecting ';'"),
            (b"replace_filter 'a b;", "t.conf:1:16", "expecting closing quote"),
            (b"replace_filter 'a'b c;", "t.conf:1:19", "after a quoted token"),
            (b"replace_filter (?=a) b;", "t.conf:1:16", "look-around"),
            (b"replace_filter 'x\\1' b;", "t.conf:1:18", "backreferences"),
            (b"replace_filter '(?<n>a)' b;", "t.conf:1:17", "named groups"),
            (b"replace_filter (?i)a b;", "t.conf:1:16", "inline flags"),
            (b"replace_filter a++ b;", "t.conf:1:18", "syntax error"),
            (b"replace_filter (?>a) b;", "t.conf:1:16", "atomic"),
            (b"replace_filter a\\G b;", "t.conf:1:17", "\\G"),
            (b"replace_filter a\\K b;", "t.conf:1:17", "\\K"),
            (b"replace_filter a\\Z b;", "t.conf:1:17", "\\Z"),
            (b"replace_filter a\\pL b;", "t.conf:1:17", "Unicode properties"),
            (b"replace_filter a\\q b;", "t.conf:1:17", "unknown escape \\q"),
            (b"replace_filter 'a{1,500}' b;", "t.conf:1:18", "below 500"),
            (b"replace_filter a $host;", "t.conf:1:18", "unknown variable '$host'"),
            (b"replace_filter a 'x$';", "t.conf:1:20", "lone '$'"),
            (b"replace_filter a '${1';", "t.conf:1:19", "closing bracket"),
            (b"replace_filter_max_buffered_size 8q;", "t.conf:1:34", 'invalid size "8q"'),
            (b"replace_filter_last_modified maybe;", "t.conf:1:30", '"keep" or "clear"'),
            (b"replace_filter_types nonsense;", "t.conf:1:22", "invalid media type"),
            (b"location / { }", "t.conf:1:12", "blocks are not allowed"),
        ],
    )
    def test_load_errors_name_file_line_column(self, text: bytes, where: str, reason: str) -> None:
        """Every refusal is a RulesError reading ``file:line:col: reason``."""
        with self.assertRaises(RulesError) as info:
            parse_rules(text, "t.conf")
        message = str(info.exception)
        assert message.startswith(where + ": "), message
        assert reason in message
        assert info.exception.filename == "t.conf"
        assert f"{info.exception.filename}:{info.exception.line}:{info.exception.column}" == where

    def test_error_keeps_offending_text(self) -> None:
        """The error carries the offending token."""
        with self.assertRaises(RulesError) as info:
            parse_rules(b"replace_filter a b gx;", "rules.conf")
        assert info.exception.text == "gx"
        assert str(info.exception) == "rules.conf:1:20: unknown flag 'x' in \"gx\""

    def test_load_rules_combines_files_in_order(self) -> None:
        """Several files: rules in file order, first explicit setting wins."""
        tmp_path = tmp_dir(self)
        first = tmp_path / "a.rules"
        second = tmp_path / "b.rules"
        first.write_bytes(b"replace_filter ab X g; replace_filter_max_buffered_size 1k;")
        second.write_bytes(
            b"replace_filter a Y g; replace_filter_types text/css;"
            b" replace_filter_max_buffered_size 2k; replace_filter_last_modified keep;"
        )
        rs = load_rules([first, second])
        assert [r.pattern for r in rs.rules] == [b"ab", b"a"]
        assert rs.max_buffered_size == 1024
        assert rs.keep_last_modified is True
        assert "text/css" in rs.types
        t = Transducer(rs)
        assert t.feed(b"aab") + t.finish() == b"YX"
        assert load_rules(first).rules == load_rules([first]).rules

    def test_missing_file_is_a_rules_error(self) -> None:
        """An unreadable file is reported like any load error."""
        tmp_path = tmp_dir(self)
        with self.assertRaisesRegex(RulesError, "cannot read rules file"):
            load_rules(tmp_path / "nope.rules")

    def test_digest_is_stable_and_sensitive(self) -> None:
        """The digest depends on everything that decides the output, nothing else."""
        a = parse_rules(b"replace_filter a b g;  # one", "x")
        b = parse_rules(b"replace_filter  'a'  \"b\"  g ;", "y")
        c = parse_rules(b"replace_filter a c g;")
        d = parse_rules(b"replace_filter a b;")
        assert a.digest == b.digest
        assert len({a.digest, c.digest, d.digest}) == 3
        assert len(a.digest) == 16 and int(a.digest, 16) >= 0

    def test_ruleset_is_immutable(self) -> None:
        """A RuleSet is a frozen value shared by every response."""
        rs = parse_rules(b"replace_filter a b;")
        with self.assertRaises(AttributeError):
            rs.max_buffered_size = 1  # type: ignore[misc]

    def test_literal_prefix_for_prefilters(self) -> None:
        """The fixed leading bytes of a rule, for a multi-pattern prefilter."""
        from prexy.substitution.analysis import literal_prefix
        from prexy.substitution.dialect import parse_sregex

        assert literal_prefix(parse_sregex(b"www\\.example\\.com").tree) == b"www.example.com"
        assert literal_prefix(parse_sregex(b"\\b(UA-)\\d+").tree) == b"UA-"
        assert literal_prefix(parse_sregex(b"ab+c").tree) == b"ab"
        assert literal_prefix(parse_sregex(b"a|b").tree) == b""
        assert literal_prefix(parse_sregex(b"x", caseless=True).tree) == b""

    def test_bare_tokens_keep_variables_and_quotes(self) -> None:
        """As in nginx, ``${1}`` stays in a bare token; '}' and quotes are ordinary."""
        assert values(b"replace_filter (UA-)\\d+ ${1}9} g;") == [
            [b"replace_filter", b"(UA-)\\d+", b"${1}9}", b"g"]
        ]
        assert values(b"replace_filter a'b c\"d;") == [[b"replace_filter", b"a'b", b'c"d']]
        rs = parse_rules(b"replace_filter (UA-)\\d+ ${1}X g;")
        t = Transducer(rs)
        assert t.feed(b"UA-12") + t.finish() == b"UA-X"

    def test_error_column_counts_raw_bytes(self) -> None:
        """The column points into the file as written, escapes included."""
        with self.assertRaises(RulesError) as info:
            parse_rules(b"replace_filter 'a\\\\\\'b(' X;", "t.conf")
        # replace_filter 'a\\\'b(' : the '(' is the 23rd column.
        assert info.exception.column == 23, str(info.exception)

    def test_load_rules_shares_compiled_sets_by_content(self) -> None:
        """Files with the same text give the same compiled RuleSet object."""
        tmp_path = tmp_dir(self)
        from prexy.substitution import rules as rules_module

        rules_module.clear_rules_cache()
        a = tmp_path / "a.rules"
        b = tmp_path / "b.rules"
        c = tmp_path / "c.rules"
        a.write_bytes(b"replace_filter 'foo' 'bar' g;\n")
        b.write_bytes(b"replace_filter 'foo' 'bar' g;\n")
        c.write_bytes(b"replace_filter 'foo' 'baz' g;\n")
        assert load_rules(a) is load_rules(b)
        assert load_rules(a) is not load_rules(c)
        assert load_rules([a, c]) is load_rules([b, c])
        assert load_rules([a, c]) is not load_rules([c, a])
        # Changed content is compiled afresh.
        before = load_rules(a)
        a.write_bytes(b"replace_filter 'foo' 'qux' g;\n")
        after = load_rules(a)
        assert after is not before
        assert Transducer(after).finish(b"foo") == b"qux"
        # A bad file is an error every time, never a cached set.
        a.write_bytes(b"replace_filter 'fo(o' 'x' g;\n")
        for _ in range(2):
            with self.assertRaises(RulesError):
                load_rules(a)

    def test_load_rules_cache_is_bounded(self) -> None:
        """At most RULES_CACHE_SIZE compiled sets are kept."""
        tmp_path = tmp_dir(self)
        from prexy.substitution import rules as rules_module

        rules_module.clear_rules_cache()
        for i in range(rules_module.RULES_CACHE_SIZE + 10):
            path = tmp_path / f"{i}.rules"
            path.write_bytes(f"replace_filter 'x{i}' 'y' g;\n".encode())
            load_rules(path)
        assert len(rules_module._cache) == rules_module.RULES_CACHE_SIZE
