"""``prexy.errorpages`` and the ``error_pages`` keys of the configuration:
the generic body, which page a status gets (its exact one, then its
class's), the checks a page file passes at load time, and every refusal
named with its file, line and key."""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Config, ConfigError, ConfigMemo, load_config
from prexy.errorpages import (
    MAX_PAGE,
    NO_PAGES,
    ErrorPage,
    ErrorPages,
    error_answer,
    generic_body,
    load_error_pages,
)
from tests.cases import tmp_dir


def write(path: str, data: bytes | str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def page(name: str) -> ErrorPage:
    return ErrorPage(name, name.encode(), b"text/html")


class Failed(Exception):
    pass


def fail(key: str | None, reason: str) -> None:
    raise Failed(key, reason)


class ChoiceTests(SynchronousTestCase):
    def test_generic_bodies(self) -> None:
        """The status and its phrase, nothing else, as text/plain."""
        self.assertEqual(error_answer(502), (b"text/plain; charset=utf-8", b"502 Bad Gateway\n"))
        self.assertEqual(error_answer(504, NO_PAGES)[1], b"504 Gateway Timeout\n")
        self.assertEqual(generic_body(413), b"413 Payload Too Large\n")
        self.assertEqual(generic_body(431), b"431 Request Header Fields Too Large\n")
        self.assertEqual(generic_body(418), b"418 I'm a Teapot\n")  # (from http.HTTPStatus)
        self.assertEqual(generic_body(599), b"599 Error\n")

    def test_exact_status_then_class(self) -> None:
        """An exact status wins over its class, whatever the order they
        were given in; a status with neither gets the generic body."""
        for pages in (
            ErrorPages((("5xx", page("5xx")), ("504", page("504")), ("404", page("404")))),
            ErrorPages((("504", page("504")), ("404", page("404")), ("5xx", page("5xx")))),
        ):
            self.assertEqual(pages.page_for(504), page("504"))
            self.assertEqual(pages.page_for(502), page("5xx"))
            self.assertEqual(pages.page_for(404), page("404"))
            self.assertIsNone(pages.page_for(400))
            self.assertEqual(error_answer(400, pages), (b"text/plain; charset=utf-8", b"400 Bad Request\n"))
            self.assertEqual(error_answer(503, pages), (b"text/html", b"5xx"))
        self.assertFalse(NO_PAGES)


class LoadTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.tmp = str(tmp_dir(self))

    def resolve(self, name: str) -> str:
        return os.path.join(self.tmp, name)

    def test_pages_read_with_their_types(self) -> None:
        """Each file is read at load; the Content-Type comes from the
        extension, with charset=utf-8 for text that is UTF-8."""
        write(self.resolve("e/5xx.html"), "<h1>Sorry — down</h1>")
        write(self.resolve("e/404.json"), b'{"error": 404}')
        write(self.resolve("e/4xx.txt"), b"\xff\xfe latin-1 \xe9")
        pages = load_error_pages(
            {"5xx": "e/5xx.html", "404": "e/404.json", "4xx": "e/4xx.txt"}, self.resolve, fail
        )
        p5 = pages.page_for(500)
        assert p5 is not None
        self.assertEqual((p5.body, p5.content_type), ("<h1>Sorry — down</h1>".encode(), b"text/html; charset=utf-8"))
        self.assertEqual(p5.path, self.resolve("e/5xx.html"))
        p404 = pages.page_for(404)
        assert p404 is not None
        self.assertEqual(p404.content_type, b"application/json")
        p4 = pages.page_for(400)
        assert p4 is not None
        self.assertEqual(p4.content_type, b"text/plain")  # not UTF-8: no charset claimed

    def test_refusals(self) -> None:
        """Every bad entry is refused with its key and a reason."""
        write(self.resolve("ok.html"), "ok")
        write(self.resolve("big.html"), b"x" * (MAX_PAGE + 1))
        write(self.resolve("page.php"), "x")
        os.mkdir(self.resolve("dir.html"))
        cases = [
            ("not a table", None, "must be a table"),
            ({"3xx": "ok.html"}, "3xx", "not a status class"),
            ({"600": "ok.html"}, "600", "not a status class"),
            ({"5XX": "ok.html"}, "5XX", "not a status class"),
            ({"x": "ok.html"}, "x", "not a status class"),
            ({"502": 5}, "502", "must be a file name"),
            ({"502": ""}, "502", "must be a file name"),
            ({"502": "missing.html"}, "502", "cannot read " + self.resolve("missing.html")),
            ({"502": "dir.html"}, "502", "cannot read"),
            ({"502": "page.php"}, "502", "the Content-Type comes from the extension"),
            ({"502": "big.html"}, "502", "larger than 1024k"),
        ]
        for value, key, reason in cases:
            with self.subTest(value=value):
                with self.assertRaises(Failed) as caught:
                    load_error_pages(value, self.resolve, fail)
                self.assertEqual(caught.exception.args[0], key)
                self.assertIn(reason, caught.exception.args[1])


class ConfigTests(SynchronousTestCase):
    """The keys in a configuration file: [server] error_pages and a site's."""

    def setUp(self) -> None:
        self.tmp = str(tmp_dir(self))
        write(os.path.join(self.tmp, "errors/5xx.html"), "<p>server 5xx</p>")
        write(os.path.join(self.tmp, "errors/404.html"), "<p>404</p>")

    def load(self, text: str, memo: ConfigMemo | None = None) -> Config:
        return load_config(write(os.path.join(self.tmp, "prexy.toml"), text), memo)

    def refused(self, text: str) -> str:
        with self.assertRaises(ConfigError) as caught:
            self.load(text)
        return str(caught.exception)

    def test_site_pages_and_the_server_default(self) -> None:
        """A site with error_pages uses only its own (as nginx's
        error_page in a server block); one without uses [server]'s."""
        write(os.path.join(self.tmp, "shop/errors/502.html"), "<p>shop 502</p>")
        config = self.load(
            '[server]\nerror_pages = { "5xx" = "errors/5xx.html", "404" = "errors/404.html" }\n'
            '[sites.a]\nupstream = "http://a"\n'
            '[sites.shop]\nupstream = "http://s"\nerror_pages = { "502" = "shop/errors/502.html" }\n'
        )
        a, shop = config.site("a").error_pages, config.site("shop").error_pages
        self.assertEqual(config.error_pages, a)
        p = a.page_for(503)
        assert p is not None
        self.assertEqual(p.body, b"<p>server 5xx</p>")
        p = shop.page_for(502)
        assert p is not None
        self.assertEqual(p.body, b"<p>shop 502</p>")
        self.assertIsNone(shop.page_for(503))
        self.assertIsNone(shop.page_for(404))

    def test_errors_name_file_line_and_key(self) -> None:
        """A bad entry of an inline table: the table's line and key, the
        entry named in the reason; an entry of a [..error_pages] table:
        its own line and key."""
        error = self.refused(
            '[sites.a]\nupstream = "http://a"\nerror_pages = { "5xx" = "errors/5xx.html", "502" = "nope.html" }\n'
        )
        self.assertEqual(
            error,
            f"{self.tmp}/prexy.toml:3: sites.a.error_pages: '502': cannot read "
            f"{self.tmp}/nope.html: No such file or directory",
        )
        error = self.refused(
            '[sites.a]\nupstream = "http://a"\n[sites.a.error_pages]\n"5xx" = "errors/5xx.html"\n"4xx" = "x.gif"\n'
        )
        self.assertTrue(error.startswith(f"{self.tmp}/prexy.toml:5: sites.a.error_pages.4xx: {self.tmp}/x.gif: "), error)
        error = self.refused('[server]\nerror_pages = "errors/5xx.html"\n[sites.a]\nupstream = "http://a"\n')
        self.assertTrue(error.startswith(f"{self.tmp}/prexy.toml:2: server.error_pages: must be a table"), error)
        error = self.refused('[server]\nerror_pages = { "2xx" = "errors/5xx.html" }\n[sites.a]\nupstream = "http://a"\n')
        self.assertIn("prexy.toml:2: server.error_pages: '2xx': '2xx' is not a status class", error)

    def test_included_site_file_relative_names(self) -> None:
        """In an included site file, names are relative to that file's
        folder, and errors name it."""
        write(os.path.join(self.tmp, "sites.d/errors/5xx.html"), "<p>site.d 5xx</p>")
        write(
            os.path.join(self.tmp, "sites.d/b.toml"),
            '[sites.b]\nupstream = "http://b"\nerror_pages = { "5xx" = "errors/5xx.html" }\n',
        )
        config = self.load('include = "sites.d/*.toml"\n')
        p = config.site("b").error_pages.page_for(500)
        assert p is not None
        self.assertEqual(p.body, b"<p>site.d 5xx</p>")
        write(
            os.path.join(self.tmp, "sites.d/b.toml"),
            '[sites.b]\nupstream = "http://b"\n\nerror_pages = { "5xx" = "errors/gone.html" }\n',
        )
        error = self.refused('include = "sites.d/*.toml"\n')
        self.assertTrue(error.startswith(f"{self.tmp}/sites.d/b.toml:4: sites.b.error_pages: '5xx': cannot read"), error)

    def test_memo_sees_a_changed_page(self) -> None:
        """A reload with the memo of an unchanged site file still reads
        the pages again: a changed page is served after the reload, and a
        page removed since is refused."""
        write(
            os.path.join(self.tmp, "sites.d/b.toml"),
            '[sites.b]\nupstream = "http://b"\nerror_pages = { "5xx" = "../errors/5xx.html" }\n',
        )
        memo = ConfigMemo()
        first = self.load('include = "sites.d/*.toml"\n', memo)
        again = self.load('include = "sites.d/*.toml"\n', memo)
        self.assertIs(again.site("b"), first.site("b"))
        write(os.path.join(self.tmp, "errors/5xx.html"), "<p>new</p>")
        changed = self.load('include = "sites.d/*.toml"\n', memo)
        p = changed.site("b").error_pages.page_for(502)
        assert p is not None
        self.assertEqual(p.body, b"<p>new</p>")
        os.remove(os.path.join(self.tmp, "errors/5xx.html"))
        with self.assertRaises(ConfigError) as caught:
            self.load('include = "sites.d/*.toml"\n', memo)
        self.assertIn("sites.b.error_pages: '5xx': cannot read", str(caught.exception))
