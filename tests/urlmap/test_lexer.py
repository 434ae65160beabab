"""The map-file tokenizer cuts and unescapes tokens as nginx's ngx_conf_read_token does."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.urlmap.errors import MapError
from prexy.urlmap.lexer import Statement, statements
from tests.cases import expand, parametrize


def _args(text: str) -> list[list[str]]:
    return [s.args for s in statements(text, "t.map")]


@expand
class LexerTests(SynchronousTestCase):
    def test_simple_statements_and_lines(self) -> None:
        """Statements split on ``;``, whitespace of any kind separates tokens, lines are counted."""
        got = list(statements("a b;\n\n  c\td ;\r\ne\n f;", "t.map"))
        assert got == [Statement(["a", "b"], 1), Statement(["c", "d"], 3), Statement(["e", "f"], 4)]

    def test_comments_only_at_token_start(self) -> None:
        """``#`` starts a comment where a token could start; inside a token it is a character."""
        assert _args("# all comment\n/a#b c; # tail\n") == [["/a#b", "c"]]

    def test_quotes_and_escapes(self) -> None:
        """Quoted tokens may hold spaces and ``;``; \\" \\' \\\\ \\t \\r \\n unescape, other pairs stay."""
        text = r'''"a b;c" 'd\'e';  x\"y  "t\tn\nr\r\\z";  \default "\d\.";'''
        assert _args(text) == [["a b;c", "d'e"], ['x"y', "t\tn\nr\r\\z"], ["\\default", "\\d\\."]]

    def test_empty_quoted_value(self) -> None:
        """``""`` is an empty token, not a missing one."""
        assert _args('k "";') == [["k", ""]]

    def test_dollar_brace_does_not_end_token(self) -> None:
        """``${name}`` stays inside a token, while a bare ``{`` is an error in a map."""
        assert _args("k ${x}y;") == [["k", "${x}y"]]
        with self.assertRaisesRegex(MapError, r't.map:1: unexpected "{"'):
            _args("k v{;")

    def test_escaped_semicolon_and_space_continue_token(self) -> None:
        """A backslash protects the next character from ending the token (and is kept)."""
        assert _args(r"a\;b c\ d;") == [[r"a\;b", r"c\ d"]]

    def test_quote_in_middle_of_token_is_literal(self) -> None:
        """Only a token's first character can open a quote."""
        assert _args("a\"b c'd;") == [['a"b', "c'd"]]

    @parametrize(
        ("text", "message"),
        [
            ("a b", 't.map:1: unexpected end of file, expecting ";" or "}" "a b"'),
            ("a b;\nc", 't.map:2: unexpected end of file'),
            ('a "b;\n\n', "t.map:3: unexpected end of file"),
            ("a b;\n}", 't.map:2: unexpected "}"'),
            ("a b;\n;", 't.map:2: unexpected ";"'),
            ('a "b"c;', 't.map:1: unexpected "c"'),
        ],
    )
    def test_syntax_errors_name_file_and_line(self, text: str, message: str) -> None:
        """Malformed input raises MapError naming the file and line, like nginx's messages."""
        with self.assertRaises(MapError) as info:
            _args(text)
        assert str(info.exception).startswith(message)

    def test_quote_followed_by_paren_starts_new_token(self) -> None:
        """After a closing quote nginx accepts ``)`` as a separator (it begins the next token)."""
        assert _args('"a")b;') == [["a", ")b"]]

    def test_long_tokens_do_not_backtrack(self) -> None:
        """Statements the one-step fast path rejects (one or three long tokens) are cut in
        linear time, not after exponential backtracking."""
        long = "a" * 5000
        assert _args(f"{long};\nk {long} {long};") == [[long], ["k", long, long]]
