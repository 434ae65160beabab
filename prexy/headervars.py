"""The values of nginx's header directives: what one request gives their
variables (:class:`RequestVars`) and the values themselves, nginx's
"complex values" (``$name``, ``${name}``, ``$1``..``$9``), compiled once at
load (:func:`compile_value`) and expanded per response.

Pure (no Twisted, no I/O), with what else the directive modules share
(the refused framing names, header-name bytes, the cross-file conflict
error).  Shared by the rewriting directives
(``prexy.headerrules``: ``proxy_redirect``, ``proxy_cookie_*``, which also
take regex captures) and the adding / hiding / setting ones
(``prexy.headeredits``: ``add_header``, ``proxy_hide_header``,
``proxy_set_header``, which take the request variables of
:data:`EDIT_VARIABLES` and ``$http_NAME``).  Every variable here reads as
nginx 1.22 reads it; those nginx has and Prexy cannot know (``$uri`` after
nginx's normalisation, ``$server_name``, ``$request_id``...) are refused at
load as 'unknown "x" variable'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs
import regex

__all__ = ["EDIT_VARIABLES", "FRAMING_HEADERS", "TCHAR", "HeaderRulesConflict", "RequestVars", "Template",
           "TemplateError", "Token", "compile_value", "edit_variable"]

#: Header names the directives refuse: they frame the message or belong to
#: one connection, and Prexy sets them itself.
FRAMING_HEADERS = frozenset(
    b"connection keep-alive proxy-connection proxy-authenticate proxy-authorization te "
    b"trailer trailers transfer-encoding upgrade content-length content-encoding "
    b"content-range".split()
)

#: The bytes of a header name (RFC 9110 5.6.2 ``tchar``).
TCHAR = frozenset(b"!#$%&'*+-.^_`|~ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


class HeaderRulesConflict(ValueError):
    """Rules files that nginx would refuse as one file ("is duplicate")."""


class Token(Protocol):
    """A directive's token as ``prexy.substitution.rules.tokenize`` gives it."""

    @property
    def value(self) -> bytes: ...

    @property
    def line(self) -> int: ...

    @property
    def column(self) -> int: ...


class TemplateError(ValueError):
    """A value or regex refused; ``plain``: in nginx's words, not framed as "bad regex"."""

    def __init__(self, reason: str, plain: bool = False) -> None:
        super().__init__(reason)
        self.plain = plain


class HeaderLookup(Protocol):
    """The request's header values by lower-case name, None when absent (a
    dict of lists, or a request's own header table read in place)."""

    def get(self, name: bytes) -> Sequence[bytes] | None: ...


def _no_headers() -> dict[bytes, list[bytes]]:
    return {}


@attrs.frozen
class RequestVars:
    """What the variables read, for one request.

    ``scheme`` b"http" or b"https"; ``host`` the Host without port,
    lower-cased (else the server address), also the absolute Location's
    host; ``http_host`` the Host as sent (b"" if none); ``server_port`` the
    port the client reached; ``proxy_host`` the upstream's host[:port] as in
    its URL.  The rest is read by ``add_header`` / ``proxy_set_header``
    only: the client's address and port, the address it reached, the
    method, the request target as sent in origin form (``$request_uri``),
    the protocol as nginx names it (``HTTP/1.0``, ``HTTP/1.1``,
    ``HTTP/2.0``) and the request's headers by lower-case name."""

    scheme: bytes
    host: bytes
    http_host: bytes
    server_port: int
    proxy_host: bytes
    remote_addr: bytes = b""
    remote_port: bytes = b""
    server_addr: bytes = b""
    request_method: bytes = b""
    request_uri: bytes = b""
    server_protocol: bytes = b""
    headers: HeaderLookup = attrs.field(factory=_no_headers, eq=False, hash=False)

    @classmethod
    def of(
        cls, *, http_host: bytes, secure: bool, local_host: str, local_port: int, proxy_host: str,
        remote_host: str = "", remote_port: int | None = None, method: bytes = b"", uri: bytes = b"",
        protocol: bytes = b"", headers: HeaderLookup | None = None,
    ) -> RequestVars:
        """From a request's Host header (b"" if none), whether it came over
        TLS, the address it reached, the upstream's host[:port] and, for the
        edit directives, the client's address (``""``: a Unix socket, nginx's
        ``unix:``), method, target, protocol and headers (lower-case names)."""
        host = http_host.lower()
        if host.startswith(b"["):
            host = host[: host.find(b"]") + 1]
        elif b":" in host:
            host = host.rsplit(b":", 1)[0]
        if uri[:1] != b"/" and b"://" in uri[:9]:
            # The absolute form: nginx's $request_uri is its path and query.
            rest = uri[uri.find(b"://") + 3 :]
            cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
            uri = rest[cut:] or b"/"
            if uri[:1] == b"?":
                uri = b"/" + uri
        return cls(
            scheme=b"https" if secure else b"http", host=host or local_host.encode("latin-1"),
            http_host=http_host, server_port=local_port, proxy_host=proxy_host.encode("latin-1"),
            remote_addr=remote_host.encode("latin-1") if remote_host else b"unix:",
            remote_port=b"" if remote_port is None else b"%d" % remote_port,
            server_addr=local_host.encode("latin-1"), request_method=method, request_uri=uri,
            server_protocol=b"HTTP/2.0" if protocol == b"HTTP/2" else protocol,
            headers=headers if headers is not None else _no_headers(),
        )

    def header(self, name: bytes) -> bytes:
        """``$http_NAME`` (``name`` lower case, ``_`` for ``-``) as nginx
        1.22 reads it: the first such header, or all joined by ``, ``
        (X-Forwarded-For) or ``; `` (Cookie); b"" if none."""
        if name == b"host":
            return self.http_host
        # nginx drops request headers whose names hold "_" (its default
        # ignore_invalid_headers), so "_" in the variable is always "-".
        found = self.headers.get(name.replace(b"_", b"-"))
        if not found:
            return b""
        if name == b"x_forwarded_for":
            return b", ".join(found)
        if name == b"cookie":
            return b"; ".join(found)
        return found[0]

    @property
    def args(self) -> bytes:
        """``$args``: the request target after its first ``?``."""
        return self.request_uri.partition(b"?")[2]

    @property
    def proxy_add_x_forwarded_for(self) -> bytes:
        """``$proxy_add_x_forwarded_for``: the client's X-Forwarded-For with
        its address appended, or its address alone."""
        chain = self.header(b"x_forwarded_for")
        return chain + b", " + self.remote_addr if chain else self.remote_addr


#: A compiled value: literal bytes, a capture number, or a variable name.
Part = bytes | int | tuple[bytes]
Template = tuple[Part, ...]

_VAR = regex.compile(rb"\$(?:([1-9])|\{([A-Za-z0-9_]*)(\}?)|([A-Za-z0-9_]*))")


def compile_value(value: bytes, names: list[bytes]) -> Template:
    """A complex value (nginx's script syntax); variable names go to ``names``."""
    parts: list[Part] = []
    pos = 0
    for m in _VAR.finditer(value):
        if m.start() > pos:
            parts.append(value[pos : m.start()])
        pos = m.end()
        if m.group(1):
            parts.append(int(m.group(1)))
            continue
        braced = m.group(2) is not None
        name = m.group(2) if braced else m.group(4)
        if braced and not m.group(3) and (name or pos < len(value)):
            raise TemplateError(f'the closing bracket in "{name.decode("latin-1")}" variable is missing')
        if not name:
            raise TemplateError("invalid variable name")
        names.append(name.lower())
        parts.append((name.lower(),))
    if pos < len(value):
        parts.append(value[pos:])
    return tuple(parts)


#: The variables of ``add_header`` and ``proxy_set_header`` (and any
#: ``$http_NAME``), each read from a request's :class:`RequestVars`.
EDIT_VARIABLES: Mapping[bytes, Callable[[RequestVars], bytes]] = {
    b"host": lambda v: v.host,
    b"http_host": lambda v: v.http_host,
    b"scheme": lambda v: v.scheme,
    b"https": lambda v: b"on" if v.scheme == b"https" else b"",
    b"server_port": lambda v: b"%d" % v.server_port,
    b"server_addr": lambda v: v.server_addr,
    b"proxy_host": lambda v: v.proxy_host,
    b"remote_addr": lambda v: v.remote_addr,
    b"remote_port": lambda v: v.remote_port,
    b"request_method": lambda v: v.request_method,
    b"request_uri": lambda v: v.request_uri,
    b"args": lambda v: v.args,
    b"query_string": lambda v: v.args,
    b"is_args": lambda v: b"?" if v.args else b"",
    b"server_protocol": lambda v: v.server_protocol,
    b"proxy_add_x_forwarded_for": lambda v: v.proxy_add_x_forwarded_for,
}


def edit_variable(name: bytes) -> Callable[[RequestVars], bytes] | None:
    """How an edit directive reads ``$name`` (lower case); None: unknown."""
    getter = EDIT_VARIABLES.get(name)
    if getter is None and name.startswith(b"http_") and len(name) > 5:
        field = name[5:]
        return lambda v: v.header(field)
    return getter
