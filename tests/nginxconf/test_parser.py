"""prexy.nginxconf.parser: nginx's lexer, its errors with file and line,
include, and dump's round trip."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.nginxconf.parser import Directive, NginxConfigError, dump, load, parse

DATA = Path(__file__).parent / "data"
BENCH = Path(__file__).resolve().parents[2] / "bench"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def shape(directives: tuple[Directive, ...]) -> list[object]:
    """Names, arguments and blocks, without file and line."""
    return [(d.name, d.args, None if d.block is None else shape(d.block)) for d in directives]


def find(directives: tuple[Directive, ...], *path: str) -> list[Directive]:
    """Every directive reached by the names in ``path``, one level each."""
    found = [d for d in directives if d.name == path[0]]
    if len(path) == 1:
        return found
    return [x for d in found if d.block is not None for x in find(d.block, *path[1:])]


class TokensTests(SynchronousTestCase):
    """The lexer's rules, as in ngx_conf_read_token."""

    def test_directives_blocks_and_lines(self) -> None:
        text = "user www-data;\nevents {\n    worker_connections 768;\n}\nhttp{server{listen 80;}}\n"
        ds = parse(text, "/c/nginx.conf")
        self.assertEqual(shape(ds), [
            ("user", ("www-data",), None),
            ("events", (), [("worker_connections", ("768",), None)]),
            ("http", (), [("server", (), [("listen", ("80",), None)])]),
        ])
        self.assertEqual([d.line for d in ds], [1, 2, 5])
        self.assertEqual((ds[1].block or ())[0], Directive("worker_connections", ("768",), None, "/c/nginx.conf", 3))

    def test_line_is_the_line_of_the_name(self) -> None:
        ds = parse("\n\n  # a comment { ; }\n  proxy_pass\n   http://a\n;\n", "f")
        self.assertEqual(ds, (Directive("proxy_pass", ("http://a",), None, "f", 4),))

    def test_quotes_and_escapes(self) -> None:
        ds = parse(r'''add_header X "a b;{}#" 'it\'s' "q\"q" "t\tn\nr\r" "back\\slash" "\d+" '';''', "f")
        self.assertEqual(ds[0].args, ("X", "a b;{}#", "it's", 'q"q', "t\tn\nr\r", "back\\slash", "\\d+", ""))

    def test_comments_only_at_token_start(self) -> None:
        ds = parse("a b#c; # d ;\n e 'x # y';\n", "f")
        self.assertEqual(shape(ds), [("a", ("b#c",), None), ("e", ("x # y",), None)])

    def test_backslash_outside_quotes(self) -> None:
        # nginx keeps the backslash and the escaped character in the token
        ds = parse("a x\\ y \\;b;", "f")
        self.assertEqual(ds[0].args, ("x\\ y", "\\;b"))

    def test_variables_with_braces(self) -> None:
        ds = parse('return 200 ${host}x$uri"${a}";', "f")
        self.assertEqual(ds[0].args, ("200", '${host}x$uri"${a}"'))

    def test_unquoted_brace_in_regex_opens_a_block_as_in_nginx(self) -> None:
        # nginx reads ~^/a{2}$ as "~^/a" then a block; quoted it is one argument
        self.assertEqual(shape(parse('location "~^/a{2}$" { }', "f")), [("location", ("~^/a{2}$",), [])])
        self.assertEqual(shape(parse("location ~^/a{2}$; }", "f")),
                         [("location", ("~^/a",), [("2}$", (), None)])])

    def test_if_parentheses(self) -> None:
        ds = parse('if ($a = "b c") { return 403; }\nif ($http_x ~* ^(a|b)$) { set $x 1; }', "f")
        self.assertEqual(ds[0].args, ("($a", "=", "b c", ")"))
        self.assertEqual(ds[1].args, ("($http_x", "~*", "^(a|b)$)"))

    def test_map_block(self) -> None:
        ds = parse('map $host $site {\n  default 0;\n  ~^www\\.(?<n>.+)$ $n;\n  "~^a{2}" 2;\n}\n', "f")
        self.assertEqual(shape(ds), [("map", ("$host", "$site"), [
            ("default", ("0",), None), ("~^www\\.(?<n>.+)$", ("$n",), None), ("~^a{2}", ("2",), None)])])

    def test_crlf_and_tabs(self) -> None:
        ds = parse("a\t1;\r\nb {\r\n\tc;\r\n}\r\n", "f")
        self.assertEqual(shape(ds), [("a", ("1",), None), ("b", (), [("c", (), None)])])
        self.assertEqual((ds[1].block or ())[0].line, 3)

    def test_empty_file(self) -> None:
        self.assertEqual(parse("", "f"), ())
        self.assertEqual(parse("  # only a comment", "f"), ())


class ErrorTests(SynchronousTestCase):
    """nginx's reason, file and line for every syntax error (the same as
    ``nginx -t`` says: see NginxAgreesTests)."""

    def check(self, text: str, reason: str, line: int) -> None:
        with self.assertRaises(NginxConfigError) as caught:
            parse(text, "/etc/nginx/nginx.conf")
        e = caught.exception
        self.assertEqual((e.reason, e.file, e.line), (reason, "/etc/nginx/nginx.conf", line))
        self.assertEqual(str(e), f"{reason} in /etc/nginx/nginx.conf:{line}")

    def test_unexpected_close(self) -> None:
        self.check("events {}\n}\n", 'unexpected "}"', 2)

    def test_close_after_arguments(self) -> None:
        self.check("events { worker_connections 1 }\n", 'unexpected "}"', 1)

    def test_unexpected_open(self) -> None:
        self.check("events {}\n\n{\n", 'unexpected "{"', 3)

    def test_unexpected_semicolon(self) -> None:
        self.check("events {}\n;\n", 'unexpected ";"', 2)

    def test_end_of_file_in_a_block(self) -> None:
        self.check("http {\n  server {\n  }\n", 'unexpected end of file, expecting "}"', 4)

    def test_end_of_file_in_a_directive(self) -> None:
        self.check("events {}\nworker_processes 1\n", 'unexpected end of file, expecting ";" or "}"', 3)
        self.check("events {}\nworker_processes 1", 'unexpected end of file, expecting ";" or "}"', 2)

    def test_unbalanced_quotes(self) -> None:
        self.check('events {}\npid "abc;\n\n', 'unexpected end of file, expecting ";" or "}"', 4)
        self.check("pid 'abc;\n", 'unexpected end of file, expecting ";" or "}"', 2)
        self.check('pid "' + "a" * 5000 + ";\nmore\n",
                   'too long parameter, probably missing terminating """ character', 1)

    def test_too_long_parameter(self) -> None:
        self.check("events {}\npid " + "a" * 5000 + ";\n", 'too long parameter "aaaaaaaaaa..." started', 2)

    def test_no_space_after_quote(self) -> None:
        self.check('events {}\npid "a"b;\n', 'unexpected "b"', 2)

    def test_lua_block_refused_by_name(self) -> None:
        with self.assertRaises(NginxConfigError) as caught:
            parse("http {\n  server {\n    content_by_lua_block {\n ngx.say('}') }\n", "/x.conf")
        e = caught.exception
        self.assertEqual((e.file, e.line), ("/x.conf", 3))
        self.assertIn('"content_by_lua_block" is not supported', e.reason)


class LoadTests(SynchronousTestCase):
    """include, as nginx follows it."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="prexy-nginxconf-")
        self.addCleanup(shutil.rmtree, self.dir)

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_include_spliced_in_place_with_its_own_file_and_line(self) -> None:
        main = self.write("nginx.conf", "a;\nhttp {\n  include site.d/*.conf;\n  z;\n}\n")
        self.write("site.d/b.conf", "\n\nserver { listen 2; }\n")
        self.write("site.d/a.conf", "server { listen 1; }\n")
        self.write("site.d/B.conf", "server { listen 0; }\n")
        self.write("site.d/.hidden.conf", "broken {\n")
        self.write("site.d/c.txt", "broken {\n")
        ds = load(main)
        http = ds[1].block
        assert http is not None
        self.assertEqual([d.block[0].args for d in http[:3] if d.block], [("0",), ("1",), ("2",)])
        self.assertEqual(http[3].name, "z")
        self.assertEqual((http[2].file, http[2].line), (os.path.join(self.dir, "site.d/b.conf"), 3))
        self.assertEqual((http[3].file, http[3].line), (main, 4))

    def test_relative_names_against_prefix(self) -> None:
        main = self.write("conf/nginx.conf", "include extra.conf;\n")
        self.write("conf/extra.conf", "from_conf;\n")
        self.write("extra.conf", "from_prefix;\n")
        self.assertEqual(load(main)[0].name, "from_conf")
        self.assertEqual(load(main, prefix=self.dir)[0].name, "from_prefix")

    def test_missing_file_is_an_error_and_missing_glob_is_not(self) -> None:
        main = self.write("nginx.conf", "events {}\ninclude none/*.conf;\n\ninclude none.conf;\n")
        with self.assertRaises(NginxConfigError) as caught:
            load(main)
        missing = os.path.join(self.dir, "none.conf")
        self.assertEqual(str(caught.exception),
                         f'open() "{missing}" failed (2: No such file or directory) in {main}:4')

    def test_errors_name_the_included_file(self) -> None:
        main = self.write("nginx.conf", "http {\n include s.conf;\n}\n")
        inc = self.write("s.conf", "server {\n")
        with self.assertRaises(NginxConfigError) as caught:
            load(main)
        self.assertEqual(str(caught.exception), f'unexpected end of file, expecting "}}" in {inc}:2')

    def test_include_arguments(self) -> None:
        main = self.write("nginx.conf", "events {}\ninclude a b;\n")
        with self.assertRaises(NginxConfigError) as caught:
            load(main)
        self.assertEqual(str(caught.exception), f'invalid number of arguments in "include" directive in {main}:2')
        main = self.write("nginx.conf", "events {}\ninclude a { }\n")
        with self.assertRaises(NginxConfigError) as caught:
            load(main)
        self.assertEqual(str(caught.exception), f'directive "include" is not terminated by ";" in {main}:2')

    def test_include_loop_refused(self) -> None:
        main = self.write("nginx.conf", "include a.conf;\n")
        a = self.write("a.conf", "x;\ninclude b.conf;\n")
        b = self.write("b.conf", "include a.conf;\n")
        with self.assertRaises(NginxConfigError) as caught:
            load(main)
        self.assertEqual(caught.exception.reason, f'include loop: "{a}" -> "{b}" -> "{a}"')
        self.assertEqual((caught.exception.file, caught.exception.line), (b, 1))

    def test_include_loop_under_another_name(self) -> None:
        main = self.write("nginx.conf", "include a.conf;\n")
        a = self.write("a.conf", "include ./sub/../a.conf;\n")
        os.mkdir(os.path.join(self.dir, "sub"))
        with self.assertRaises(NginxConfigError) as caught:
            load(main)
        again = os.path.join(self.dir, "./sub/../a.conf")
        self.assertEqual(str(caught.exception), f'include loop: "{a}" -> "{again}" in {a}:1')

    def test_same_file_twice_is_not_a_loop(self) -> None:
        main = self.write("nginx.conf", "include a.conf;\ninclude a.conf;\n")
        self.write("a.conf", "x;\n")
        self.assertEqual([d.name for d in load(main)], ["x", "x"])

    def test_missing_main_file(self) -> None:
        missing = os.path.join(self.dir, "nope.conf")
        with self.assertRaises(NginxConfigError) as caught:
            load(missing)
        # as nginx says it: no file and line for the main file itself
        self.assertEqual(str(caught.exception), f'open() "{missing}" failed (2: No such file or directory)')
        self.assertEqual((caught.exception.file, caught.exception.line), (missing, 0))

    def test_include_of_a_directory(self) -> None:
        os.mkdir(os.path.join(self.dir, "d"))
        main = self.write("nginx.conf", "events {}\ninclude d;\n")
        with self.assertRaises(NginxConfigError) as caught:
            load(main)
        d = os.path.join(self.dir, "d")
        self.assertEqual(str(caught.exception), f'pread() "{d}" failed (21: Is a directory) in {main}:2')


class RealConfigurationTests(SynchronousTestCase):
    """Debian's default configuration and the project's own."""

    def check_debian(self, directives: tuple[Directive, ...]) -> None:
        self.assertEqual(find(directives, "user")[0].args, ("www-data",))
        self.assertEqual(find(directives, "load_module")[0].args,
                         ("modules/ngx_http_subs_filter_module.so",))
        types = find(directives, "http", "types")
        self.assertEqual(len(types), 1)
        entries = {d.name: d.args for d in types[0].block or ()}
        self.assertEqual(entries["text/html"], ("html", "htm", "shtml"))
        self.assertEqual(entries["application/javascript"], ("js",))
        server = find(directives, "http", "server")
        self.assertEqual(len(server), 1)
        self.assertEqual([d.args for d in find(server[0].block or (), "listen")],
                         [("80", "default_server"), ("[::]:80", "default_server")])
        self.assertEqual(find(server[0].block or (), "location", "try_files")[0].args,
                         ("$uri", "$uri/", "=404"))
        self.assertFalse(find(directives, "include", ))
        self.assertFalse(find(directives, "http", "include"))

    def test_debian_default_fixture(self) -> None:
        ds = load(str(DATA / "debian" / "nginx.conf"))
        self.check_debian(ds)
        mime = find(ds, "http", "types")[0]
        self.assertEqual((mime.file, mime.line), (str(DATA / "debian" / "mime.types"), 2))

    def test_etc_nginx(self) -> None:
        if not os.path.exists("/etc/nginx/nginx.conf"):
            raise self.skipTest("no /etc/nginx/nginx.conf on this machine")
        ds = load("/etc/nginx/nginx.conf")
        self.assertTrue(find(ds, "http"))
        self.assertEqual(shape(parse(dump(ds), "x")), shape(ds))

    def test_bench_configuration(self) -> None:
        if str(BENCH) not in sys.path:
            sys.path.append(str(BENCH))
        import content
        import servers

        rules = content.rule_set(40)
        body = servers.proxy_location(content.subs_filter_directives(rules), access_log="/tmp/a.log")
        text = servers.nginx_conf(Path("/tmp/p"), 8080, body, http_extra=servers.upstream_block(9090))
        ds = parse(text, "/tmp/p/nginx.conf")
        location = find(ds, "http", "server", "location")
        self.assertEqual(location[0].args, ("/",))
        block = location[0].block or ()
        self.assertEqual(find(block, "proxy_set_header")[0].args, ("Connection", ""))
        self.assertEqual([d.args for d in find(block, "subs_filter")],
                         [(r.pattern, r.replacement, "gr") for r in rules])
        self.assertEqual(find(ds, "http", "upstream", "server")[0].args[0].rsplit(":", 1)[1], "9090")
        self.assertEqual((find(ds, "http", "types")[0].block or ())[0].args, ("html",))

    def test_headeredits_configuration(self) -> None:
        # the integration test's directives, read from its source without importing it
        source = (Path(__file__).parents[1] / "integration" / "test_headeredits_nginx.py").read_text()
        assigned = next(node for node in ast.parse(source).body if isinstance(node, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == "DIRECTIVES" for t in node.targets))
        directives = ast.literal_eval(assigned.value)
        text = f"http {{\n  server {{ listen 127.0.0.1:1; server_name _;\n    location / {{ proxy_pass http://127.0.0.1:2;\n{directives} }} }}\n}}\n"
        ds = parse(text, "/h/nginx.conf")
        block = find(ds, "http", "server", "location")[0].block or ()
        self.assertIn(("Strict-Transport-Security", "max-age=31536000", "always"),
                      [d.args for d in find(block, "add_header")])
        self.assertIn(("X-Empty", ""), [d.args for d in find(block, "add_header")])
        self.assertEqual([d.args for d in find(block, "proxy_set_header")][-2:],
                         [("X-Req", "$request_method $request_uri"), ("X-Req", "second")])
        self.assertEqual(len(block), len([line for line in directives.splitlines() if line.strip()]) + 1)

    def test_urlmap_differential_configuration(self) -> None:
        from tests.urlmap.test_nginx_differential import _conf

        d = tempfile.mkdtemp(prefix="prexy-nginxconf-")
        self.addCleanup(shutil.rmtree, d)
        with open(os.path.join(d, "m0.map"), "w") as f:
            f.write('default "none";\n"~^/a/(?<x>[0-9]{2,3})$" "a-$x";\n/exact 1;\n')
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(_conf(d, ["unused"], "127.0.0.1:1"))
        ds = load(os.path.join(d, "nginx.conf"))
        m = find(ds, "http", "map")[0]
        self.assertEqual(m.args, ("$http_x_key", "$m0"))
        self.assertEqual(shape(m.block or ()), [
            ("default", ("none",), None), ("~^/a/(?<x>[0-9]{2,3})$", ("a-$x",), None), ("/exact", ("1",), None)])
        self.assertEqual(find(ds, "http", "server", "location")[0].args, ("=", "/m0"))
        self.assertEqual(find(ds, "http", "server", "location", "return")[0].args, ("200", "[$m0]"))


# -- round trip ---------------------------------------------------------------

_chars = st.characters(codec="utf-8")
_words = st.one_of(
    st.text(alphabet=_chars, max_size=12),
    st.sampled_from(["$host", "${host}x", "~^/a{2}$", "a;b", "#x", "}", "{", "'q'", '"', "\\", "\\d+",
                     "\\n", "a b", "\t", "\n", "(", ")", "$", "", "$\\"]),
)
_names = _words.filter(lambda w: w != "include" and not w.endswith("lua_block"))


def _tree(depth: int) -> st.SearchStrategy[tuple[Directive, ...]]:
    block = st.none() if depth == 0 else st.one_of(st.none(), st.deferred(lambda: _tree(depth - 1)))
    one = st.builds(lambda n, a, b: Directive(n, tuple(a), b, "f", 0),
                    _names, st.lists(_words, max_size=4), block)
    return st.lists(one, max_size=4).map(tuple)


def _numbered(directives: tuple[Directive, ...], line: int = 1) -> tuple[tuple[Directive, ...], int]:
    """``directives`` with the lines dump writes them at, and the next free line."""
    out = []
    for d in directives:
        if d.block is None:
            out.append(Directive(d.name, d.args, None, "/t.conf", line))
            line += 1
        else:
            inner, after = _numbered(d.block, line + 1)
            out.append(Directive(d.name, d.args, inner, "/t.conf", line))
            line = after + 1
    return tuple(out), line


class RoundTripTests(SynchronousTestCase):
    @given(_tree(3))
    def test_parse_of_dump_is_the_same_tree(self, tree: tuple[Directive, ...]) -> None:
        self.assertEqual(parse(dump(tree), "/t.conf"), _numbered(tree)[0])

    def test_replace_filter_conformance_rules(self) -> None:
        """replace-filter's conformance patterns and replacements (backslashes,
        ``$&``, ``{n,m}``...) written by dump read back the same."""
        from tests.substitution.shared import SKIP_REASON, load_cases

        cases = load_cases("replace_filter_cases.json")
        if cases is None:
            raise self.skipTest(SKIP_REASON)
        rules = [Directive("replace_filter", (r["pattern"], r["replacement"], *([r["flags"]] if r["flags"] else [])),
                           None, "f", 0) for case in cases for r in case["rules"]]
        self.assertGreater(len(rules), 50)
        location = (Directive("location", ("/",), tuple(rules), "f", 0),)
        self.assertEqual(shape(parse(dump(location), "/t.conf")), shape(location))

    def test_dump_quotes_only_what_needs_it(self) -> None:
        ds = (Directive("location", ("~^/a{2}$",), (Directive("return", ("200", 'say "hi"\n'), None, "f", 2),),
                        "f", 1),)
        self.assertEqual(dump(ds), 'location "~^/a{2}$" {\n    return 200 "say \\"hi\\"\\n";\n}\n')


# -- nginx itself --------------------------------------------------------------

BROKEN = {
    "close": "events {}\n}\n",
    "open": "events {}\n{\n",
    "semicolon": "events {}\n;\n",
    "eof_block": "events {\n",
    "eof_directive": "events {}\nworker_processes 1\n",
    "unbalanced": 'events {}\npid "abc;\n\n',
    "unbalanced_long": 'events {}\npid "' + "a" * 5000 + ";\n" + "x" * 10 + "\n",
    "need_space": 'events {}\npid "a"b;\n',
    "close_args": "events { worker_connections 1 }\n",
    "include_missing": "events {}\n\ninclude /nonexistent-prexy/x.conf;\n",
    "include_relative": "events {}\ninclude nothere.conf;\n",
    "include_dotted": "events {}\ninclude ./no/../nothere.conf;\n",
    "include_args": "events {}\ninclude a b;\n",
    "include_block_lines": "events {}\ninclude a\n\n{ }\n",
    "include_args_lines": "events {}\ninclude a\n b\n\n;\n",
    "include_missing_lines": "events {}\ninclude\n /nonexistent-prexy/x.conf\n\n;\n",
    "comment": "events {} # }\n pid \"a#b\" ;# x\n}",
    "multiline": 'events {}\n\n\npid\n  "x"  \n\n',
}


class NginxAgreesTests(SynchronousTestCase):
    """``nginx -t`` on the same broken files says the same reason and line."""

    def test_nginx_says_the_same(self) -> None:
        if NGINX is None:
            raise self.skipTest("nginx is not installed")
        d = tempfile.mkdtemp(prefix="prexy-nginxconf-")
        self.addCleanup(shutil.rmtree, d)
        for name, text in BROKEN.items():
            path = os.path.join(d, f"{name}.conf")
            with open(path, "w") as f:
                f.write(text)
            run = subprocess.run([NGINX, "-t", "-q", "-e", "stderr", "-p", d + "/", "-c", path],
                                 capture_output=True, text=True, timeout=30)
            said = re.search(r"\[emerg\] \d+#\d+: (.*)", run.stderr)
            self.assertIsNotNone(said, f"{name}: nginx said {run.stderr!r}")
            assert said is not None
            with self.assertRaises(NginxConfigError, msg=name) as caught:
                load(path)
            self.assertEqual(str(caught.exception), said.group(1), name)
