"""nginx's ``add_header``, ``proxy_hide_header`` and ``proxy_set_header`` as
directives of a Prexy rules file, with nginx 1.22's semantics.

Pure (no Twisted, no I/O): :class:`HeaderEditsBuilder` takes the directives
(through ``prexy.headerrules.HeaderRulesBuilder``), :class:`HeaderEdits`
holds them and applies them, at delivery, to one response head
(:meth:`HeaderEdits.respond`) and to the headers of one request sent
upstream (:meth:`HeaderEdits.request_headers`).  They change nothing that
is stored: a cache hit gets them from its own request and status as a miss
does.  Checked against nginx 1.22.1 by
``tests/integration/test_headeredits_nginx.py``.

* ``add_header NAME VALUE [always]``: added to answers with status 200,
  201, 204, 206, 301, 302, 303, 304, 307 or 308, or with ``always`` to
  every answer, Prexy's own error answers included (only those with
  ``always``).  An empty value adds nothing.  Every directive adds its own
  header, after the upstream's of the same name (never replacing them),
  in the order written; except, as nginx, ``ETag`` and ``Last-Modified``,
  which replace the last one there is (in place, named as written), and
  whose empty value removes it.
* ``proxy_hide_header NAME``: the upstream's (or the stored answer's)
  headers of that name, any case, are not sent; before ``add_header``.
  Prexy's own error answers have nothing to hide.  nginx hides Date,
  Server, X-Pad and X-Accel-* by default and sends its own Date and Server;
  Prexy hides nothing unless told: the upstream's Date and Server pass
  unchanged and X-Accel-* have no meaning here.
* ``proxy_set_header NAME VALUE``: the request goes upstream with this
  header instead of the client's (any case); every directive for a name
  adds one, in order; an empty value sends none (the client's is dropped
  all the same).  It applies after Prexy built the request, so it replaces
  Prexy's own ``Host``, ``X-Forwarded-For``, ``X-Forwarded-Proto``,
  ``X-Forwarded-Host`` and ``Via`` too: ``proxy_set_header X-Forwarded-For
  $proxy_add_x_forwarded_for;`` (nginx's idiom) gives what Prexy sends
  anyway, ``$remote_addr`` drops the client's chain, ``""`` sends none.
* Variables (names caseless): ``$host $http_host $scheme $https
  $server_port $server_addr $proxy_host $remote_addr $remote_port
  $request_method $request_uri $args $query_string $is_args
  $server_protocol $proxy_add_x_forwarded_for`` and ``$http_NAME``
  (``prexy.headervars``).

Deviations from nginx, on purpose, each refused at load with file, line
and reason:

* A name must be a header name (RFC 9110 ``tchar``), a value may not hold
  CR, LF or NUL (nginx would send a broken head).
* Names that frame the message or belong to one connection
  (``Content-Length``, ``Transfer-Encoding``, ``Connection``, ``Upgrade``,
  ``TE``, ``Trailer``, ``Keep-Alive``, ``Content-Encoding``,
  ``Content-Range``, ``Proxy-*``) are Prexy's to set, in all three; so is
  ``Expect`` upstream.  nginx's WebSocket idiom (``proxy_set_header Upgrade
  $http_upgrade``) is the site's ``upgrade`` setting here.
* ``Via``, ``Cache-Status`` and ``Server-Timing``, which Prexy adds to the
  client's answer itself, cannot be hidden.
* ``proxy_set_header Host`` twice (two Host fields are no request) or with
  an empty value; a value that expands to nothing keeps Prexy's Host.
* Regex captures (``$1``, named groups) do not exist here: Prexy has no
  location regexes, and the header rules' captures are of a later phase.
* Levels and inheritance do not exist: one rules set per site, combined
  rules files act as one file.
* Without a Host header ``$host`` is the address the client reached (nginx:
  the server_name), as in ``prexy.headerrules``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from prexy.headervars import (
    FRAMING_HEADERS,
    TCHAR,
    HeaderRulesConflict,
    RequestVars,
    TemplateError,
    Token,
    compile_value,
    edit_variable,
)

__all__ = ["EDIT_DIRECTIVES", "OWN_RESPONSE_HEADERS", "SAFE_STATUSES", "HeaderEdits", "HeaderEditsBuilder",
           "is_edit"]

#: The directives this module takes.
EDIT_DIRECTIVES = frozenset({b"add_header", b"proxy_hide_header", b"proxy_set_header"})

#: Statuses ``add_header`` applies to without ``always`` (nginx 1.22).
SAFE_STATUSES = frozenset({200, 201, 204, 206, 301, 302, 303, 304, 307, 308})

#: Response headers Prexy adds to every answer itself: not hidden.
OWN_RESPONSE_HEADERS = frozenset({b"via", b"cache-status", b"server-timing"})

#: ``add_header`` of these replaces the last one there is (nginx 1.22).
_REPLACING = frozenset({b"etag", b"last-modified"})

#: Request headers Prexy handles itself besides the framing ones.
_REQUEST_OWN = frozenset({b"expect"})

#: A compiled edit value: literal bytes and variable readers.
_Value = tuple[bytes | Callable[[RequestVars], bytes], ...]


def is_edit(name: bytes) -> bool:
    """Whether ``name`` is one of this module's directives."""
    return name in EDIT_DIRECTIVES


def _expand(value: _Value, vars: RequestVars) -> bytes:
    if len(value) == 1 and isinstance(value[0], bytes):
        return value[0]
    return b"".join(p if isinstance(p, bytes) else p(vars) for p in value)


@attrs.frozen
class _Edit:
    """One ``add_header`` or ``proxy_set_header``: its name as written and in
    lower case, its value as written and compiled, and ``always``."""

    name: bytes
    lname: bytes
    source: bytes
    value: _Value = attrs.field(eq=False)
    always: bool = False


@attrs.frozen
class HeaderEdits:
    """The ``add_header`` / ``proxy_hide_header`` / ``proxy_set_header`` of
    a site: immutable, shared by every request."""

    added: tuple[_Edit, ...] = ()
    hidden: frozenset[bytes] = frozenset()  # lower case
    sets: tuple[_Edit, ...] = ()

    @property
    def responds(self) -> bool:
        """Whether :meth:`respond` can change an answer from the upstream or
        the cache."""
        return bool(self.added or self.hidden)

    @property
    def always(self) -> bool:
        """Whether :meth:`respond` can change Prexy's own error answers."""
        return any(a.always for a in self.added)

    @property
    def digest(self) -> str:
        """Short stable hex hash of the directives ("" for none)."""
        if not (self.added or self.hidden or self.sets):
            return ""
        text = b"\2".join((
            b"\1".join(b"%s\0%s\0%d" % (a.name, a.source, a.always) for a in self.added),
            b",".join(sorted(self.hidden)),
            b"\1".join(b"%s\0%s" % (s.name, s.source) for s in self.sets),
        ))
        return hashlib.sha256(text).hexdigest()[:16]

    @classmethod
    def combine(cls, parts: Sequence[HeaderEdits]) -> HeaderEdits:
        """Several rules files in order, as if they were one file."""
        sets = tuple(s for p in parts for s in p.sets)
        if sum(s.lname == b"host" for s in sets) > 1:
            raise HeaderRulesConflict('"proxy_set_header Host" in more than one rules file: an upstream '
                                      "request has one Host")
        return cls(tuple(a for p in parts for a in p.added), frozenset().union(*(p.hidden for p in parts)), sets)

    def respond(
        self, headers: list[tuple[bytes, bytes]], status: int, vars: RequestVars, own: bool,
    ) -> list[tuple[bytes, bytes]]:
        """A response head's header pairs (order and repeats kept) with the
        hidden ones removed, then the ``add_header`` ones for ``status``
        added.  ``own``: Prexy's own error answer (only ``always`` applies,
        nothing is hidden).  A new list; ``headers`` is not changed."""
        hidden = self.hidden
        if hidden and not own:
            out = [(n, v) for n, v in headers if n.lower() not in hidden]
        else:
            out = list(headers)
        safe = status in SAFE_STATUSES and not own
        for add in self.added:
            if not (safe or add.always):
                continue
            value = _expand(add.value, vars)
            if add.lname in _REPLACING:
                at = next((i for i in range(len(out) - 1, -1, -1) if out[i][0].lower() == add.lname), None)
                if at is None:
                    if value:
                        out.append((add.name, value))
                elif value:
                    out[at] = (add.name, value)
                else:
                    del out[at]
            elif value:
                out.append((add.name, value))
        return out

    def request_headers(self, pairs: list[tuple[bytes, bytes]], vars: RequestVars) -> list[tuple[bytes, bytes]]:
        """The header pairs of a request going upstream with the
        ``proxy_set_header`` ones in place of those of the same names (any
        case), at the end in the order written; an empty value sends none,
        except that Host then stays as it was.  A new list."""
        sets = self.sets
        if not sets:
            return list(pairs)
        values = [(s, _expand(s.value, vars)) for s in sets]
        names = {s.lname for s, value in values if value or s.lname != b"host"}
        out = [(n, v) for n, v in pairs if n.lower() not in names]
        out += [(s.name, value) for s, value in values if value]
        return out


class HeaderEditsBuilder:
    """Collects the edit directives of one rules file, in order."""

    def __init__(self) -> None:
        self._added: list[_Edit] = []
        self._hidden: dict[bytes, None] = {}
        self._sets: list[_Edit] = []

    def directive(self, name: Token, args: Sequence[Token], fail: Callable[[Any, str], Exception]) -> bool:
        """Take one directive; False if it is not one of ours.  A bad one
        raises ``fail(token, reason)``, in nginx's words where nginx has them."""
        key = name.value
        if key not in EDIT_DIRECTIVES:
            return False
        directive = key.decode()
        counts = {b"add_header": (2, 3), b"proxy_hide_header": (1,), b"proxy_set_header": (2,)}[key]
        if len(args) not in counts:
            raise fail(name, f'invalid number of arguments in "{directive}" directive')
        header = self._name(args[0], directive, fail)
        if key == b"proxy_hide_header":
            if header in OWN_RESPONSE_HEADERS:
                raise fail(args[0], f'"{args[0].value.decode("latin-1")}" cannot be hidden: Prexy adds it '
                                    "to every answer itself")
            self._hidden[header] = None
            return True
        if header in _REQUEST_OWN and key == b"proxy_set_header":
            raise fail(args[0], f'"{args[0].value.decode("latin-1")}" cannot be set: Prexy handles it itself')
        value = self._value(args[1], directive, fail)
        edit = _Edit(args[0].value, header, args[1].value, value)
        if key == b"proxy_set_header":
            if header == b"host":
                if not args[1].value:
                    raise fail(args[1], "an empty Host cannot be sent upstream: an HTTP/1.1 request has one")
                if any(s.lname == b"host" for s in self._sets):
                    raise fail(args[0], '"proxy_set_header Host" is duplicate: an upstream request has one Host')
            self._sets.append(edit)
            return True
        if len(args) == 3:
            if args[2].value != b"always":
                raise fail(args[2], f'invalid parameter "{args[2].value.decode("latin-1")}"')
            edit = attrs.evolve(edit, always=True)
        self._added.append(edit)
        return True

    @staticmethod
    def _name(tok: Token, directive: str, fail: Callable[[Any, str], Exception]) -> bytes:
        header = tok.value.lower()
        text = tok.value.decode("latin-1")
        if not header or any(c not in TCHAR for c in header):
            raise fail(tok, f'invalid header name "{text}"')
        if header in FRAMING_HEADERS:
            raise fail(tok, f'"{text}" cannot be used in "{directive}": it frames the message or belongs to '
                            "one connection, and Prexy sets it itself")
        return header

    @staticmethod
    def _value(tok: Token, directive: str, fail: Callable[[Any, str], Exception]) -> _Value:
        text = tok.value
        if any(c in text for c in b"\r\n\0"):
            raise fail(tok, "a header value cannot hold CR, LF or NUL")
        names: list[bytes] = []
        try:
            template = compile_value(text, names)
        except TemplateError as exc:
            raise fail(tok, str(exc)) from None
        parts: list[bytes | Callable[[RequestVars], bytes]] = []
        for part in template:
            if isinstance(part, int):
                raise fail(tok, f'regex captures such as "${part}" do not exist in "{directive}" (Prexy has '
                                "no location regexes)")
            if isinstance(part, bytes):
                parts.append(part)
                continue
            getter = edit_variable(part[0])
            if getter is None:
                raise fail(tok, f'unknown "{part[0].decode("latin-1")}" variable')
            parts.append(getter)
        return tuple(parts) or (b"",)

    def build(self) -> HeaderEdits:
        """The directives taken so far."""
        return HeaderEdits(tuple(self._added), frozenset(self._hidden), tuple(self._sets))
