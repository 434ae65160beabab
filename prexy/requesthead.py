"""The rules a client's request head must meet, on the head as parsed.

llhttp (``prexy.h1server``) parses the head and refuses what RFC 9112
forbids; these are the rules on top, made as strict as nginx 1.22 where
nginx refuses more (``tests/integration/test_strict.py`` sends the same
requests to both), because a front proxy that forwards what the next hop
reads differently is a request smuggling hole:

- Line ends are CRLF; a bare CR or LF, or a line that starts with white
  space (obs-fold, RFC 9112 5.2), is a 400 (llhttp).  Empty lines before
  the request line are skipped (RFC 9112 2.2; nginx does the same).
- The method is upper-case letters, ``_`` and ``-`` (nginx's set; ``get``
  is a 400).  Versions other than 1.0 and 1.1 get 505.  ``CONNECT`` gets
  405: Prexy is not a forward proxy.
- The target is origin-form (``/path?query``) or absolute-form with an
  ``http`` or ``https`` scheme, whose authority then wins over the Host
  header (RFC 9112 3.2.2).  ``*``, other schemes, a userinfo, bytes outside
  visible ASCII, ``#``, a bad ``%`` escape, ``%00``, and dot-segments that
  climb above the root are 400s (``check_target``).
- Header names are tokens; a value holds no control byte but HTAB (llhttp).
- Exactly one Host on HTTP/1.1 (none or several: 400), with a host a name
  can have (no white space, ``/``, ``\\``, ``@``, empty label, or port that is
  not digits) (``check_host``, ``conclude``).
- Content-Length is digits and said once (llhttp); Transfer-Encoding is
  said once, never beside Content-Length (llhttp) or on HTTP/1.0 (400), and
  ``chunked`` is the only coding (anything else: 501, as nginx answers).
- The request line is at most ``max_request_line`` bytes (else 414), each
  header line at most ``max_header_line``, the whole head at most
  ``max_request_head`` and the header lines at most ``max_header_lines``
  in number (else 431) (``prexy.h1server``).

It imports no Twisted.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import attrs

from prexy.shortmemo import short_memo

#: Body framings a head can announce.
NO_BODY = "none"
LENGTH = "length"
CHUNKED = "chunked"


@attrs.frozen
class Refusal:
    """A head that is not answered normally: the status to send and why."""

    status: int
    reason: str


class Head(NamedTuple):
    """What a head that passed says, for the proxy to act on.  (A named
    tuple: made once per request, it costs a quarter of a frozen attrs
    class.)"""

    method: bytes
    #: The target in origin-form (an absolute-form target's path and query).
    target: bytes
    #: The authority to route by: an absolute-form target's, else the Host
    #: header's; None on an HTTP/1.0 request without Host.
    host: bytes | None
    version: bytes
    #: The Host header differed from the absolute-form target's authority
    #: (or was missing), so the proxy must replace it.
    replace_host: bool
    framing: str
    #: The Content-Length, when ``framing`` is ``LENGTH``.
    length: int = 0

    @property
    def has_body(self) -> bool:
        return self.framing == CHUNKED or (self.framing == LENGTH and self.length > 0)


#: Bytes a request target may not hold: controls, space, DEL, non-ASCII, '#'.
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f-\xff#]")
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})|%00")
#: A reg-name (RFC 3986 3.2.2) and a port; bytes >= 0x80 pass, as in nginx.
_REG_NAME = re.compile(rb"[A-Za-z0-9\-._~!$&'()*+,;=%\x80-\xff]+")
_IP_LITERAL = re.compile(rb"\[[0-9A-Fa-f:.]+\]|\[v[0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+\]")
_DIGITS = re.compile(rb"[0-9]*")
_SCHEME = re.compile(rb"(?i:https?)://")


#: The shape of nearly every Host: labels of letters, digits and '-', a port.
_PLAIN_HOST = re.compile(rb"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.?(?::[0-9]{0,5})?")


@short_memo(4096)
def check_host(value: bytes) -> str | None:
    """Why ``value`` cannot be a Host (an authority: host and optional
    port), or None when it can."""
    if _PLAIN_HOST.fullmatch(value):
        return None
    if not value:
        return "empty Host"
    if value.startswith(b"["):
        end = value.find(b"]")
        literal, rest = value[: end + 1], value[end + 1 :]
        if end < 0 or not _IP_LITERAL.fullmatch(literal):
            return "bad IP literal in Host"
    else:
        colon = value.rfind(b":")
        literal, rest = (value, b"") if colon < 0 else (value[:colon], value[colon:])
        if not _REG_NAME.fullmatch(literal):
            return "a host name cannot hold these characters"
        if b".." in literal:
            return "empty label in host name"
    if rest and (rest[:1] != b":" or not _DIGITS.fullmatch(rest, 1) or len(rest) > 6):
        return "port is not a number"
    return None


def _climbs_above_root(path: bytes) -> bool:
    """Whether the dot-segments of ``path`` (escaped dots included) go
    above the root, as ``/../etc`` does."""
    if b"." not in path and b"%2" not in path:
        return False
    depth = 0
    for segment in path.split(b"/")[1:]:
        segment = segment.replace(b"%2e", b".").replace(b"%2E", b".")
        if segment == b"..":
            depth -= 1
            if depth < 0:
                return True
        elif segment != b".":
            depth += 1
    return False


@short_memo(4096)
def check_target(method: bytes, target: bytes) -> tuple[bytes, bytes | None] | Refusal:
    """``(origin-form target, authority or None)`` for a request target,
    or the refusal.  This and ``check_host`` remember their last answers
    (what they return is immutable) for values up to 512 bytes
    (``prexy.shortmemo``): a site's requests repeat a few thousand
    targets and Host values, checked once each; 3-5 µs less per
    in-memory hit."""
    if _BAD_TARGET.search(target):
        return Refusal(400, "request target holds a byte it cannot hold")
    authority = None
    if target[:1] != b"/":
        if target == b"*":
            return Refusal(400, "asterisk-form target")
        if not _SCHEME.match(target):
            return Refusal(400, "request target is neither /path nor an http(s) URL")
        rest = target[target.index(b"//") + 2 :]
        end = len(rest)
        for sep in (b"/", b"?"):
            i = rest.find(sep)
            if 0 <= i < end:
                end = i
        authority, target = rest[:end], rest[end:]
        if b"@" in authority:
            return Refusal(400, "userinfo in request target")
        why = check_host(authority)
        if why is not None:
            return Refusal(400, f"request target: {why}")
        if not target.startswith(b"/"):
            target = b"/" + target
    if b"%" in target and _BAD_ESCAPE.search(target):
        return Refusal(400, "bad percent-escape in request target")
    path = target.split(b"?", 1)[0]
    if _climbs_above_root(path):
        return Refusal(400, "request target climbs above the root")
    return target, authority


def conclude(
    method: bytes, target: bytes, authority: bytes | None, version: bytes,
    hosts: list[bytes], length: bytes | None, coding: bytes | None,
) -> Head | Refusal:
    """The checks of a head as a whole, once its lines passed: Host, and
    the body's framing."""
    if len(hosts) > 1:
        return Refusal(400, "more than one Host header")
    host = hosts[0] if hosts else None
    if host is not None:
        why = check_host(host)
        if why is not None:
            return Refusal(400, why)
    elif version == b"HTTP/1.1":
        return Refusal(400, "HTTP/1.1 request without Host")
    framing, size = NO_BODY, 0
    if coding is not None:
        if version == b"HTTP/1.0":
            return Refusal(400, "Transfer-Encoding on an HTTP/1.0 request")
        if coding.lower() != b"chunked":
            return Refusal(501, "only the chunked transfer coding is supported")
        if length is not None:
            return Refusal(400, "Transfer-Encoding beside Content-Length")
        framing = CHUNKED
    elif length is not None:
        framing, size = LENGTH, int(length)
    route = authority if authority is not None else host
    replace = authority is not None and (host is None or host.lower() != authority.lower())
    return Head(method, target, route, version, replace, framing, size)
