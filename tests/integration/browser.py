"""A real browser for the integration tier: headless Chromium loads a URL
and gives back what it made of it.

:func:`render` runs ``chromium --headless --dump-dom`` once on a URL and
returns a :class:`Rendered`: the DOM after the page loaded (serialized as
HTML), the messages the page wrote to the console (CSP violations, failed
loads and script errors show there), and, when asked, a screenshot taken
in the same launch.  :func:`rendered` is the same in a thread, for a test
whose server runs in the reactor (a blocking call would keep the server
from answering).  :func:`parse_dom` makes the dumped HTML a small tree to
query, :func:`site_view` reads the admin's site page from that tree, and
:func:`read_png` decodes a screenshot's pixels (no imaging library
needed)::

    shown = yield rendered(f"{admin}/sites/shop", screenshot=True)
    view = site_view(parse_dom(shown.dom))
    assert view.rules[3].matches == 12 and view.rules[2].never_matched
    assert shown.console == []

Chromium comes from ``$PREXY_CHROMIUM``, ``chromium`` on ``$PATH`` or
``/usr/bin/chromium`` (Debian's package; ``.ci/run`` installs it);
:func:`find_chromium` returns None without one and the tests skip.

Each launch gets a private profile, home and temporary directory in a
:func:`~.twistd_support.scratch_dir`, removed after; it runs in a process
group of its own, killed whole after it exits or at the timeout.  It
reaches loopback only: every other host name resolves to nothing and any
other address goes through a proxy that is not there, and background
services (updates, sync, metrics) are off.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from twisted.internet import threads

from .twistd_support import remove_scratch, scratch_dir

#: A discard-port proxy on loopback: nothing listens there, so whatever
#: Chromium would send beyond loopback (which it never proxies) fails.
NO_PROXY = "http://127.0.0.1:9"

#: Flags for a quiet, confined, repeatable headless run.
FLAGS = (
    "--headless",
    "--no-sandbox",  # in a container, as root
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--disable-breakpad",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--metrics-recording-only",
    "--mute-audio",
    "--hide-scrollbars",
    f"--proxy-server={NO_PROXY}",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1 , EXCLUDE [::1]",
    # Console messages go to stderr, where render() reads them.
    "--enable-logging=stderr",
    "--v=0",
)

#: A console line in Chromium's log: ``[...:INFO:CONSOLE:12] "text", source: URL (12)``
#: (older versions write ``CONSOLE(12)``).
_CONSOLE = re.compile(r'^\[[^\]]*:CONSOLE(?::\d+|\(\d+\))\] "(?P<text>.*)", source: (?P<source>.*) \((?P<line>\d+)\)$')


#: Chromium's line for a page it could not load (``net::ERR_CONNECTION_REFUSED``;
#: ``net::ERR_UNSAFE_PORT`` for the ports browsers refuse, such as 6000 or
#: 10080, which free_port's range and the kernel's ephemeral ports avoid).
_LOAD_FAILED = re.compile(r"Page load failed: (?P<reason>\S+)")


def find_chromium() -> str | None:
    """The Chromium binary to run, or None when there is none."""
    for candidate in (os.environ.get("PREXY_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass(frozen=True)
class ConsoleMessage:
    text: str
    source: str
    line: int


@dataclass(frozen=True)
class Rendered:
    """What Chromium made of a URL."""

    #: The DOM after the load, as Chromium serializes it (HTML).
    dom: str
    #: What the page wrote to the console, in order.
    console: list[ConsoleMessage]
    #: The screenshot (PNG bytes), when one was asked for.
    screenshot: bytes | None
    #: Chromium's whole log (stderr), for a failure's message.
    log: str


class BrowserError(AssertionError):
    """Chromium failed to load the page or did not finish in time."""


def render(
    url: str, screenshot: bool = False, window: tuple[int, int] = (1200, 1600),
    timeout: float = 60, binary: str | None = None, extra: Sequence[str] = (),
) -> Rendered:
    """Loads ``url`` in one headless Chromium launch; returns its DOM, its
    console messages and, with ``screenshot``, a ``window``-sized PNG.
    ``extra`` flags go to Chromium after :data:`FLAGS`.  Blocks: from the
    reactor's thread use :func:`rendered`.  A page that fails to load (no
    server, a refused connection) raises :class:`BrowserError`; an HTTP
    error status does not (its body is the DOM)."""
    binary = binary or find_chromium()
    if binary is None:
        raise BrowserError("no chromium binary (install Debian's chromium, or set PREXY_CHROMIUM)")
    home = scratch_dir("prexy-chromium-")
    try:
        profile = os.path.join(home, "profile")
        tmp = os.path.join(home, "tmp")
        os.mkdir(tmp)
        shot = os.path.join(home, "screenshot.png")
        args = [binary, *FLAGS, *extra, f"--user-data-dir={profile}", "--dump-dom"]
        if screenshot:
            args += [f"--screenshot={shot}", f"--window-size={window[0]},{window[1]}"]
        env = dict(os.environ, HOME=home, TMPDIR=tmp, XDG_CONFIG_HOME=os.path.join(home, ".config"),
                   XDG_CACHE_HOME=os.path.join(home, ".cache"))
        env.pop("DBUS_SESSION_BUS_ADDRESS", None)
        process = subprocess.Popen(
            [*args, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            env=env, cwd=home, start_new_session=True,
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            out, err = process.communicate()
            raise BrowserError(
                f"chromium did not finish {url} in {timeout} s; its log:\n{err.decode('utf-8', 'replace')}"
            ) from None
        finally:
            _kill_group(process.pid)  # renderer, GPU and zygote children that outlive it
        log = err.decode("utf-8", "replace")
        if process.returncode != 0:
            raise BrowserError(f"chromium exited {process.returncode} on {url}; its log:\n{log}")
        failed = _LOAD_FAILED.search(log)
        if failed:  # refused, reset, an unsafe port...: exit status 0 and an empty DOM
            raise BrowserError(f"chromium could not load {url}: {failed['reason']}; its log:\n{log}")
        image = None
        if screenshot:
            if not os.path.exists(shot):
                raise BrowserError(f"chromium wrote no screenshot of {url}; its log:\n{log}")
            with open(shot, "rb") as f:
                image = f.read()
        return Rendered(out.decode("utf-8", "replace"), console_messages(log), image, log)
    finally:
        remove_scratch([home])


def rendered(url: str, **options: Any) -> Any:
    """:func:`render` in a thread: a Deferred that fires with the
    :class:`Rendered`, while the reactor goes on serving the page."""
    return threads.deferToThread(render, url, **options)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def console_messages(log: str) -> list[ConsoleMessage]:
    """The console messages in Chromium's log."""
    found = []
    for line in log.splitlines():
        m = _CONSOLE.match(line)
        if m:
            found.append(ConsoleMessage(m["text"], m["source"], int(m["line"])))
    return found


# -- the DOM ----------------------------------------------------------------------


@dataclass
class Node:
    """An element of a parsed DOM: its tag, attributes, children (nodes
    and text, in order) and parent."""

    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)
    parent: Node | None = field(default=None, repr=False)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        """All the text inside, as it stands in the document."""
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self) -> Iterator[Node]:
        """This node and every element below it, in document order."""
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def select(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Node]:
        """The elements below (and including) this one with ``tag``, the
        class ``cls`` and the attributes given (``data_number="3"`` for
        ``data-number``)."""
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            n for n in self.iter()
            if (tag is None or n.tag == tag) and (cls is None or cls in n.classes)
            and all(n.attrs.get(k) == v for k, v in wanted.items())
        ]

    def one(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> Node:
        found = self.select(tag, cls, **attrs)
        if len(found) != 1:
            raise AssertionError(f"{len(found)} elements {tag or '*'} .{cls} {attrs} (want 1)")
        return found[0]


#: Elements without an end tag in HTML.
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.current = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, parent=self.current)
        self.current.children.append(node)
        if tag not in _VOID:
            self.current = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.current.children.append(Node(tag, {k: v or "" for k, v in attrs}, parent=self.current))

    def handle_endtag(self, tag: str) -> None:
        node: Node | None = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.current = node.parent

    def handle_data(self, data: str) -> None:
        self.current.children.append(data)


def parse_dom(html: str) -> Node:
    """The serialized DOM as a tree of :class:`Node` (Chromium's dump is
    well nested, so an end tag closes up to its element)."""
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root


# -- the admin's site page, as shown ------------------------------------------------


@dataclass(frozen=True)
class RuleRow:
    """One row of the site page's rules table, as shown."""

    number: int
    origin: str
    pattern: str
    matches: int
    responses: int
    never_matched: bool


@dataclass(frozen=True)
class Bar:
    """One bar of the latency histogram."""

    series: str
    bucket: int
    count: int
    height: float


@dataclass(frozen=True)
class SiteView:
    """What the site page (``prexy.observe.page.site_page``) shows: its
    site, its rules by number, the histogram's bars and the last errors'
    rows (their cells' text)."""

    site: str
    rules: dict[int, RuleRow]
    bars: list[Bar]
    errors: list[list[str]]


def _shown_count(text: str) -> int:
    return int(text.strip().replace(",", ""))


def site_view(dom: Node) -> SiteView:
    """Reads a rendered site page by its ids and classes (``table#rules``,
    ``tr.rule[data-number]``, ``tr.never-matched``, ``svg#latency``,
    ``table#errors``)."""
    rules = {}
    for row in dom.one("table", id="rules").select("tr", cls="rule"):
        number = int(row.attrs["data-number"])
        rules[number] = RuleRow(
            number=number,
            origin=row.one("td", "origin").text().strip(),
            pattern=row.one("td", "pattern").one("code").text(),
            matches=_shown_count(row.one("td", "matches").text()),
            responses=_shown_count(row.one("td", "responses").text()),
            never_matched="never-matched" in row.classes,
        )
    bars = [
        Bar(r.attrs["data-series"], int(r.attrs["data-bucket"]), int(r.attrs["data-count"]), float(r.attrs["height"]))
        for r in dom.one("svg", id="latency").select("rect", cls="bar")
    ]
    errors = [
        [td.text().strip() for td in row.select("td")]
        for row in dom.one("table", id="errors").select("tr", cls="error")
    ]
    return SiteView(dom.one(id="site-name").text(), rules, bars, errors)


# -- screenshots --------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    #: Rows of (r, g, b) pixels.
    rows: list[list[tuple[int, int, int]]]

    def count(self, rgb: tuple[int, int, int], tolerance: int = 2) -> int:
        """How many pixels have the colour ``rgb`` (within ``tolerance`` per channel)."""
        r0, g0, b0 = rgb
        return sum(
            1 for row in self.rows for r, g, b in row
            if abs(r - r0) <= tolerance and abs(g - g0) <= tolerance and abs(b - b0) <= tolerance
        )

    def colours(self) -> int:
        """How many distinct colours the image holds."""
        return len({p for row in self.rows for p in row})


def read_png(data: bytes) -> Image:
    """Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium's
    screenshots are)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError("PNG without IHDR")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[list[tuple[int, int, int]]] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = previous[i]
            c = previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append([(line[x], line[x + 1], line[x + 2]) for x in range(0, stride, bpp)])
        previous = line
    return Image(width, height, rows)
