"""The answers Prexy makes itself when it cannot serve a request (a 502
when the upstream is down, a 504 on a timeout, a 413, a refused request
head...): their status, Content-Type and body.

By default the body is generic, ``502 Bad Gateway`` and a line end, as
text/plain: the reason (which may name the upstream's address) goes to
the log only, never to the visitor.  A site may give its own pages, as
nginx's ``error_page`` does: a file per status class (``5xx``, ``4xx``)
or per exact status, which wins over its class (``ErrorPages``).  The
files are read when the configuration loads (``load_error_pages``); the
answers to the upstream's own errors pass through untouched and never get
these pages.

Pure: no Twisted, no sockets; the proxy side writes what ``error_answer``
returns.
"""

from __future__ import annotations

import http
import os
import re
from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["ErrorPage", "ErrorPages", "error_answer", "generic_body", "load_error_pages", "phrase"]

#: The largest error page file (every worker keeps each page in memory).
MAX_PAGE = 1024 * 1024

#: A page's Content-Type, from its file name's extension.
PAGE_TYPES = {
    ".html": b"text/html",
    ".htm": b"text/html",
    ".xhtml": b"application/xhtml+xml",
    ".txt": b"text/plain",
    ".json": b"application/json",
    ".xml": b"application/xml",
}

_KEY = re.compile(r"[45]xx|[45]\d\d")


#: The reason phrases of the statuses Prexy answers itself (fixed here,
#: not taken from the Python version's ``http.HTTPStatus``).
PHRASES = {
    400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed", 408: b"Request Timeout",
    413: b"Payload Too Large", 414: b"URI Too Long", 431: b"Request Header Fields Too Large",
    500: b"Internal Server Error", 501: b"Not Implemented", 502: b"Bad Gateway", 503: b"Service Unavailable",
    504: b"Gateway Timeout", 505: b"HTTP Version Not Supported",
}


def phrase(status: int) -> bytes:
    """The reason phrase of ``status`` (``Error`` if unknown)."""
    known = PHRASES.get(status)
    if known is not None:
        return known
    try:
        return http.HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b"Error"


def generic_body(status: int) -> bytes:
    """The default body of an answer: its status line's words, nothing else."""
    return b"%d %s\n" % (status, phrase(status))


GENERIC_TYPE = b"text/plain; charset=utf-8"


@attrs.frozen
class ErrorPage:
    """One page: the file it was read from, its bytes and its Content-Type."""

    path: str
    body: bytes
    content_type: bytes


@attrs.frozen
class ErrorPages:
    """A site's pages by key: an exact status (``"404"``) or a class
    (``"5xx"``).  Empty: every answer has the generic body."""

    pages: tuple[tuple[str, ErrorPage], ...] = ()

    def page_for(self, status: int) -> ErrorPage | None:
        """The page for ``status``: its exact one, else its class's, else None."""
        exact = str(status)
        klass = f"{status // 100}xx"
        found = None
        for key, page in self.pages:
            if key == exact:
                return page
            if key == klass:
                found = page
        return found

    def __bool__(self) -> bool:
        return bool(self.pages)


NO_PAGES = ErrorPages()


def error_answer(status: int, pages: ErrorPages | None = None) -> tuple[bytes, bytes]:
    """``(content_type, body)`` of Prexy's own answer with ``status``: the
    page ``pages`` give for it, else the generic body."""
    page = pages.page_for(status) if pages else None
    if page is None:
        return GENERIC_TYPE, generic_body(status)
    return page.content_type, page.body


def load_error_pages(
    value: Any,
    resolve: Callable[[str], str],
    fail: Callable[[str | None, str], Any],
    read: Callable[[str], bytes] | None = None,
) -> ErrorPages:
    """The ``error_pages`` table of a configuration: keys ``4xx``, ``5xx``
    or an exact status from 400 to 599, each naming a file (``resolve``
    makes a relative name relative to the file that names it).  Each file
    is read now: it must exist, be at most ``MAX_PAGE`` bytes and have an
    extension of ``PAGE_TYPES``.  ``fail(key, reason)`` reports an error
    (``key``: the table's key at fault, None for the table itself) and
    does not return.  ``read`` reads a file (``prexy.files``: the disk or a
    master's snapshot); without it, the file system."""
    if not isinstance(value, dict):
        fail(None, 'must be a table of status keys and file names, such as { "5xx" = "errors/5xx.html" }')
    pages = []
    for key, name in value.items():
        if not _KEY.fullmatch(key):
            fail(key, f"{key!r} is not a status class (4xx, 5xx) nor a status from 400 to 599")
        if not isinstance(name, str) or not name:
            fail(key, f"must be a file name, got {name!r}")
        path = resolve(name)
        extension = os.path.splitext(path)[1].lower()
        kind = PAGE_TYPES.get(extension)
        if kind is None:
            fail(key, f"{path}: the Content-Type comes from the extension; use one of {', '.join(PAGE_TYPES)}")
            continue
        try:
            if read is not None:
                body = read(path)
            else:
                with open(path, "rb") as f:
                    body = f.read(MAX_PAGE + 1)
        except OSError as exc:
            fail(key, f"cannot read {path}: {exc.strerror}")
            continue
        if len(body) > MAX_PAGE:
            fail(key, f"{path}: larger than {MAX_PAGE // 1024}k")
        if kind.startswith(b"text/") or kind.endswith(b"+xml"):
            try:
                body.decode("utf-8")
            except UnicodeDecodeError:
                pass  # its own charset, if it declares one
            else:
                kind += b"; charset=utf-8"
        pages.append((key, ErrorPage(path, body, kind)))
    return ErrorPages(tuple(pages))
