"""What an admin ban removes from the cache, without I/O.

A ban is written as a Varnish operator writes one against ``req.url`` and
``req.http.host``: a regular expression searched (``re.search``) in the
path and query of a stored object's URL (``/obj?x=1``), and a host name
of its own, compared whole (``req.http.host ==``; case-insensitive, a
trailing dot ignored; a name without a port matches it on any port) or a
regular expression searched in the host as stored, lower-case with its
port (``req.http.host ~``).  Any may be left out; a ban names at least
one.

The store keeps each object's URL as :func:`prexy.cache.policy.key_url`
made it: the lower-cased Host followed by the path and query
(``shop.example/obj?x=1``), or the path and query alone when the site's key
leaves the host out.  :func:`split_key_url` takes it apart at the first
``/`` (a Host cannot hold one).  An object stored without a host (the key
leaves it out, or an HTTP/1.0 request had none) is the one every host of
its site is served, so a host selector (name or regex) matches it.

:attr:`Ban.key_url` is the older meaning of a ban's regex, kept for the
bans that older nodes of a fleet wrote to Redis (``prexy.cluster``): the
regex searched in the stored URL as a whole, host included.  A node that
replays such an entry applies it as the node that wrote it did.

Pure: imports neither Twisted nor the store.
"""

from __future__ import annotations

import re

import attrs

__all__ = ["Ban", "BanError", "normalise_host", "split_key_url"]


class BanError(ValueError):
    """A ban that cannot be made: a bad regex, a bad host, or nothing to match."""


_PORT = re.compile(r"(.*?):([0-9]*)")
#: What a host selector may hold: a reg-name or an IP literal, and a port.
_HOST = re.compile(r"[a-z0-9\-._~!$&'()*+,;=%\x80-\uffff]+|\[[0-9a-f:.v]+\]")


def normalise_host(host: str) -> tuple[str, str | None]:
    """``(name, port or None)`` of a Host value: lower-case, the trailing
    dot of a fully qualified name dropped."""
    host = host.strip().lower()
    port = None
    if host.startswith("["):
        end = host.find("]")
        if end >= 0 and host[end + 1 : end + 2] == ":":
            host, port = host[: end + 1], host[end + 2 :]
    else:
        m = _PORT.fullmatch(host)
        if m is not None:
            host, port = m.group(1), m.group(2)
    return host.rstrip("."), port or None


def split_key_url(url: bytes) -> tuple[bytes, bytes]:
    """``(host, path and query)`` of a stored key URL (host ``b""`` when the
    key holds none)."""
    slash = url.find(b"/")
    if slash < 0:
        return url, b""
    return url[:slash], url[slash:]


def _pattern(value: str | re.Pattern[str] | None) -> re.Pattern[str] | None:
    if value is None or isinstance(value, re.Pattern):
        return value
    try:
        return re.compile(value)
    except re.error as exc:
        raise BanError(f"bad regex {value!r}: {exc}") from None


def _host(value: str | None) -> tuple[str, str | None] | None:
    if value is None:
        return None
    name, port = normalise_host(value)
    if not name or not _HOST.fullmatch(name):
        raise BanError(f"bad host {value!r}: give a host name (and a port), e.g. host=shop.example")
    return name, port


@attrs.frozen
class Ban:
    """The objects a ban removes, of one site or of all (``site`` None):
    those whose path and query ``target`` matches and whose host is
    ``host``, or (``key_url``, the older form) whose stored URL as a whole
    matches."""

    site: str | None = None
    #: Searched in the path and query (Varnish's ``req.url``).
    target: re.Pattern[str] | None = attrs.field(default=None, converter=_pattern)
    #: ``(name, port or None)``, compared whole (Varnish's ``req.http.host ==``).
    host: tuple[str, str | None] | None = attrs.field(default=None, converter=_host)
    #: Searched in the host as stored (Varnish's ``req.http.host ~``).
    host_regex: re.Pattern[str] | None = attrs.field(default=None, converter=_pattern)
    #: Searched in the stored URL, host and all (bans older nodes wrote).
    key_url: re.Pattern[str] | None = attrs.field(default=None, converter=_pattern)

    def __attrs_post_init__(self) -> None:
        if self.target is None and self.host is None and self.host_regex is None and self.key_url is None:
            raise BanError("a ban needs a regex (on the path and query) or a host")

    def matches(self, url: bytes) -> bool:
        """Whether the object stored under key URL ``url`` is banned (its
        site already matched)."""
        text = url.decode("latin-1")
        if self.key_url is not None and not self.key_url.search(text):
            return False
        if self.target is None and self.host is None and self.host_regex is None:
            return True
        host, target = split_key_url(url)
        if self.target is not None and not self.target.search(target.decode("latin-1")):
            return False
        if host:
            if self.host is not None:
                name, port = normalise_host(host.decode("latin-1"))
                want_name, want_port = self.host
                if name != want_name or (want_port is not None and port != want_port):
                    return False
            if self.host_regex is not None and not self.host_regex.search(host.decode("latin-1")):
                return False
        return True

    def describe(self) -> str:
        """The ban in words, for answers and logs."""
        parts = [f"site {self.site}" if self.site is not None else "every site"]
        if self.target is not None:
            parts.append(f"path and query ~ '{self.target.pattern}'")
        if self.host is not None:
            name, port = self.host
            parts.append(f"host {name}{':' + port if port else ''}")
        if self.host_regex is not None:
            parts.append(f"host ~ '{self.host_regex.pattern}'")
        if self.key_url is not None:
            parts.append(f"stored URL ~ '{self.key_url.pattern}'")
        return ", ".join(parts)
