"""``twistd prexy --demo``: a small built-in origin with Prexy in front of it.

The origin (127.0.0.1:8081) serves a few HTML pages that link to their own
domain and carry an analytics id, plus a large body streamed in pieces.  Prexy
(127.0.0.1:8080) proxies it with the demo rules and URL map shipped in
``prexy/demo_files``, so one start shows the rewriting, the redirects and the
streaming at work.

What a demo run writes (its cache store, beside it the workers' notice
sockets, and a copy of the rules for another port) lives in one directory of
its own, :func:`demo_dir`, which the demo removes when it stops: on SIGTERM
or SIGINT (twistd stops the services, then the reactor fires its "after
shutdown" trigger), and at exit when the process that made the directory
never ran the demo (``--check``, a port in use).
"""

from __future__ import annotations

import atexit
import os
import shutil
from typing import Any

from twisted.application import service, strports
from twisted.internet.interfaces import IPullProducer
from twisted.logger import Logger
from twisted.web import resource, server
from zope.interface import implementer

from prexy.cache.paths import default_cache_path
from prexy.cache.policy import CachePolicy
from prexy.config import Config, MapConfig, SiteConfig, UpstreamURL

log = Logger()

#: Ports: Prexy on BASE, the origin on BASE+1, admin on BASE+2 (BASE from
#: the PREXY_DEMO_PORT environment variable, 8080 by default).
BASE = int(os.environ.get("PREXY_DEMO_PORT", "8080"))
ORIGIN = f"tcp:{BASE + 1}:interface=127.0.0.1"
ORIGIN_URL = f"http://127.0.0.1:{BASE + 1}"
PROXY = f"tcp:{BASE}:interface=127.0.0.1"
ADMIN = f"tcp:{BASE + 2}:interface=127.0.0.1"
FILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_files")

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{title} - Original Shop</title>
<link rel="stylesheet" href="https://www.original-shop.example/style.css">
<script>ga('create', 'UA-12345-1', 'auto'); ga('send', 'pageview');</script>
</head><body>
<h1>{title}</h1>
<p>Welcome to Original Shop. Every link below points at https://www.original-shop.example
and the analytics id above is UA-12345-1; Prexy rewrites both on the way through.</p>
<ul>
<li><a href="https://www.original-shop.example/">Home</a></li>
<li><a href="https://www.original-shop.example/products/widget.html">The widget</a></li>
<li><a href="https://www.original-shop.example/news/summer-sale.html">Summer sale</a></li>
<li><a href="https://www.original-shop.example/large">A large streamed page (64 MB)</a></li>
</ul>
{body}
</body></html>
"""

PAGES = {
    b"/": ("Home", "<p>Try the old URLs too: /old-home, /catalog/widget.php?id=1, /blog/2024/summer-sale</p>"),
    b"/index.html": ("Home", ""),
    b"/products/widget.html": ("The widget", "<p>A fine widget. Price: 10 EUR.</p>"),
    b"/news/summer-sale.html": ("Summer sale", "<p>Everything half price at Original Shop.</p>"),
}

CSS = b"body { font-family: sans-serif; background: url(https://www.original-shop.example/bg.png); }\n"


@implementer(IPullProducer)
class _LargeBody:
    """Streams ``size`` bytes of HTML, one piece per resumeProducing call."""

    PIECE = (
        b'<p>Line of a large page at <a href="https://www.original-shop.example/p">'
        b"Original Shop</a> with UA-12345-1 inside.</p>\n"
    ) * 512

    def __init__(self, request: server.Request, size: int) -> None:
        self.request = request
        self.left = size

    def resumeProducing(self) -> None:
        if self.left <= 0:
            return
        piece = self.PIECE if self.left >= len(self.PIECE) else self.PIECE[: self.left]
        self.left -= len(piece)
        self.request.write(piece)
        if self.left <= 0:
            self.request.unregisterProducer()
            self.request.finish()

    def stopProducing(self) -> None:
        self.left = 0


class DemoOrigin(resource.Resource):
    """The built-in origin's pages."""

    isLeaf = True

    def render_GET(self, request: server.Request) -> Any:
        path = request.path
        if path in PAGES:
            title, body = PAGES[path]
            request.setHeader(b"content-type", b"text/html; charset=utf-8")
            request.setHeader(b"cache-control", b"public, max-age=60")
            return _PAGE.format(title=title, body=body).encode("utf-8")
        if path == b"/style.css":
            request.setHeader(b"content-type", b"text/css")
            return CSS
        if path == b"/large":
            try:
                mb = int(request.args.get(b"mb", [b"64"])[0])
            except ValueError:
                mb = 64
            size = max(0, min(mb, 4096)) * 1024 * 1024
            request.setHeader(b"content-type", b"text/html; charset=utf-8")
            request.setHeader(b"content-length", b"%d" % size)
            if size == 0:
                return b""
            request.registerProducer(_LargeBody(request, size), False)
            return server.NOT_DONE_YET
        request.setResponseCode(404)
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        return b"<html><body><h1>Not found at Original Shop</h1></body></html>\n"

    render_HEAD = render_GET


def demo_dir(base: int = BASE) -> str:
    """The directory of one demo run's files: on tmpfs where the cache store
    would be by default, one per user and port."""
    return os.path.join(os.path.dirname(default_cache_path()), f"prexy-demo-{os.getuid()}-{base}")


def remove_demo_files() -> None:
    """Remove what a demo run wrote (:func:`demo_dir`); harmless when gone."""
    shutil.rmtree(demo_dir(), ignore_errors=True)


#: Whether this process made :func:`demo_dir` (and removes it at exit).
_made: list[str] = []


def _make_demo_dir() -> str:
    """:func:`demo_dir`, made if missing.  The process that makes it removes
    it at exit; one that finds it (a worker, whose master made it; a
    ``--check`` beside a running demo) leaves it to its maker."""
    directory = demo_dir()
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if not _made:
            atexit.register(remove_demo_files)
        _made.append(directory)
    return directory


class DemoService(service.MultiService):
    """The demo origin, and a banner saying what to open.

    Once it runs (twistd starts services only after every port is bound,
    so no other demo uses this port and its files), it removes the demo's
    files when everything has stopped: after the reactor's shutdown, when
    the workers, which share the store, have exited.  Only the process that
    runs the demo (the master) makes this service."""

    def __init__(self, reactor: Any) -> None:
        super().__init__()
        self.reactor = reactor
        site = server.Site(DemoOrigin())
        site.log = lambda request: None  # type: ignore[method-assign]
        strports.service(ORIGIN, site, reactor=reactor).setServiceParent(self)

    def startService(self) -> None:
        super().startService()
        self.reactor.addSystemEventTrigger("after", "shutdown", remove_demo_files)
        self.reactor.callWhenRunning(self._banner)

    def _banner(self) -> None:
        p, o, a = BASE, BASE + 1, BASE + 2
        log.info(
            "\n"
            "  Prexy demo is running.\n"
            f"    origin (as is):      http://127.0.0.1:{o}/\n"
            f"    through Prexy:       http://127.0.0.1:{p}/            (domain and analytics id rewritten)\n"
            f"    old URL redirected:  http://127.0.0.1:{p}/blog/2024/summer-sale\n"
            f"    large streamed body: http://127.0.0.1:{p}/large?mb=64\n"
            f"    cache: request a page twice, the second answer has Age and Cache-Status: hit\n"
            f"    admin:               http://127.0.0.1:{a}/metrics\n"
            f"  Try: curl -si http://127.0.0.1:{p}/ | head -20\n"
        )


def demo_config(workers: int | None = None) -> Config:
    """The configuration the demo runs with; its files go in :func:`demo_dir`."""
    directory = _make_demo_dir()
    rules = os.path.join(FILES, "demo.rules")
    if BASE != 8080:
        # The shipped rules point the clone's links at 127.0.0.1:8080.
        with open(rules, encoding="utf-8") as f:
            text = f.read().replace("127.0.0.1:8080", f"127.0.0.1:{BASE}")
        rules = os.path.join(directory, "demo.rules")
        tmp = f"{rules}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, rules)
    site = SiteConfig(
        name="demo",
        upstream=UpstreamURL.parse(ORIGIN_URL),
        rules=(rules,),
        map=MapConfig(os.path.join(FILES, "demo.map")),
        cache=CachePolicy(),
    )
    return Config(
        listen=(PROXY,),
        sites=(site,),
        default_site="demo",
        admin=ADMIN,
        cache_size=64 * 1024 * 1024,
        cache_path=os.path.join(directory, "cache"),
        workers=0 if workers is None else workers,
    )
