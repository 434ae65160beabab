"""What nodes tell each other through Redis, as bytes.

An :class:`Invalidation` is what happened on one node (a PURGE of one URL,
a ban by regex and host, a reload); a :class:`Message` is one with its
origin (node name, wall time) as kept in the Redis stream: a flat list of
field names and values (``XADD``'s form).  The doorbell rung on the
channel after an entry is added, and the acknowledgement a node sends once
it applied entries up to an id, are one short line each.

A ban's entry says how its regex is matched (field ``match``): ``target``,
against the path and query of a stored URL, as ``POST /ban`` means it, with
the host in fields of its own (``host``, a name compared whole;
``host_regex``, searched in the host).  Entries written by older nodes
have no ``match``: their regex was searched in the stored URL as a whole,
host included (:attr:`BanScope.KEY_URL`), and a node replaying one applies
it so, as the node that wrote it did.  An older node reading a ``target``
entry ignores the fields it does not know and searches the regex in the
whole URL: an unanchored regex (``css$``) bans the same objects there,
one anchored at ``^/`` none; a ban by host alone it skips (no subject), a
ban by regex and host it applies to every host.

Pure: no Twisted, no sockets.  Decoding never trusts its input: anything
malformed raises :class:`MessageError`, and the node skips that entry.
"""

from __future__ import annotations

import enum
import math
import re

import attrs

__all__ = [
    "BanScope", "Kind", "Invalidation", "Message", "MessageError", "StreamId", "parse_id", "format_id",
    "doorbell", "ack", "parse_event",
]

#: A stream entry id, ``(milliseconds, sequence)``, ordered as Redis orders them.
StreamId = tuple[int, int]

_ID = re.compile(rb"(\d{1,20})-(\d{1,20})")
#: What a ban's host selector never holds (white space, controls, '/').
_NOT_HOST = re.compile(r"[\x00-\x20\x7f/]")
_MAX = 2**64 - 1


class MessageError(ValueError):
    """Bytes that are not a message of this format."""


def parse_id(raw: bytes) -> StreamId:
    """``b"1700000000000-3"`` -> ``(1700000000000, 3)``."""
    m = _ID.fullmatch(raw)
    if m is None:
        raise MessageError(f"not a stream id: {raw!r}")
    ms, seq = int(m.group(1)), int(m.group(2))
    if ms > _MAX or seq > _MAX:
        raise MessageError(f"stream id out of range: {raw!r}")
    return ms, seq


def format_id(sid: StreamId) -> bytes:
    return b"%d-%d" % sid


class Kind(enum.Enum):
    PURGE = "purge"
    BAN = "ban"
    RELOAD = "reload"


class BanScope(enum.Enum):
    """What a ban's regex is searched in."""

    #: The path and query of a stored URL (Varnish's ``req.url``).
    TARGET = "target"
    #: The stored URL as a whole, host included: entries of older nodes.
    KEY_URL = "url"


@attrs.frozen
class Invalidation:
    """One PURGE (``site``, ``subject`` = the URL as the store keys it), one
    ban (``site`` or None for every site, ``subject`` = the regex, UTF-8,
    empty for a ban by host alone; ``host``, a host name, and
    ``host_regex``, a regex on the host, or None), or one reload (no site,
    no subject)."""

    kind: Kind
    site: str | None = None
    subject: bytes = b""
    host: str | None = None
    scope: BanScope = BanScope.TARGET
    host_regex: str | None = None

    @classmethod
    def purge(cls, site: str, url: bytes) -> Invalidation:
        return cls(Kind.PURGE, site, url)

    @classmethod
    def ban(
        cls, site: str | None, regex: str | None, host: str | None = None, host_regex: str | None = None
    ) -> Invalidation:
        return cls(Kind.BAN, site, (regex or "").encode("utf-8"), host, host_regex=host_regex)

    @classmethod
    def reload(cls) -> Invalidation:
        return cls(Kind.RELOAD)

    @property
    def regex(self) -> str:
        return self.subject.decode("utf-8")

    def describe(self) -> str:
        if self.kind is Kind.RELOAD:
            return "reload"
        site = self.site if self.site is not None else "*"
        out = f"{self.kind.value} {site} {self.subject.decode('latin-1')}"
        if self.kind is Kind.BAN:
            if self.host is not None:
                out += f" host={self.host}"
            if self.host_regex is not None:
                out += f" host~{self.host_regex}"
            if self.scope is BanScope.KEY_URL:
                out += " (on the whole URL)"
        return out


@attrs.frozen
class Message:
    """An invalidation with where and when it started."""

    invalidation: Invalidation
    node: str
    at: float

    def fields(self) -> list[bytes]:
        """The stream entry's field/value list."""
        inv = self.invalidation
        out = [b"kind", inv.kind.value.encode("ascii"), b"node", self.node.encode("utf-8"),
               b"at", repr(self.at).encode("ascii")]
        if inv.site is not None:
            out += [b"site", inv.site.encode("utf-8")]
        if inv.kind is not Kind.RELOAD:
            out += [b"subject", inv.subject]
        if inv.kind is Kind.BAN:
            out += [b"match", inv.scope.value.encode("ascii")]
            if inv.host is not None:
                out += [b"host", inv.host.encode("utf-8")]
            if inv.host_regex is not None:
                out += [b"host_regex", inv.host_regex.encode("utf-8")]
        return out

    @classmethod
    def from_fields(cls, fields: list[bytes] | tuple[bytes, ...]) -> Message:
        """The inverse of :meth:`fields`; unknown fields are ignored (a newer
        node may add some), a repeated one is an error."""
        if not isinstance(fields, (list, tuple)) or len(fields) % 2:
            raise MessageError("fields must come in name/value pairs")
        table: dict[bytes, bytes] = {}
        for i in range(0, len(fields), 2):
            name, value = fields[i], fields[i + 1]
            if not isinstance(name, bytes) or not isinstance(value, bytes):
                raise MessageError("fields must be bytes")
            if name in table:
                raise MessageError(f"field {name!r} repeated")
            table[name] = value
        try:
            kind = Kind(table[b"kind"].decode("ascii"))
            node = table[b"node"].decode("utf-8")
            at = float(table[b"at"].decode("ascii"))
            site = table[b"site"].decode("utf-8") if b"site" in table else None
        except KeyError as exc:
            raise MessageError(f"field {exc.args[0]!r} missing") from None
        except ValueError as exc:  # UnicodeDecodeError too
            raise MessageError(f"bad field: {exc}") from None
        if not node or not math.isfinite(at):
            raise MessageError("empty node or non-finite time")
        subject = table.get(b"subject", b"")
        if kind is Kind.RELOAD:
            if site is not None or b"subject" in table:
                raise MessageError("a reload has no site and no subject")
            return cls(Invalidation(kind), node, at)
        if b"subject" not in table:
            raise MessageError(f"a {kind.value} needs a subject")
        if kind is Kind.PURGE:
            if not subject:
                raise MessageError("a purge needs a subject")
            if site is None:
                raise MessageError("a purge needs a site")
            return cls(Invalidation(kind, site, subject), node, at)
        try:
            # No ``match``: an older node's ban, on the whole stored URL.
            scope = BanScope(table[b"match"].decode("ascii")) if b"match" in table else BanScope.KEY_URL
            host = table[b"host"].decode("utf-8") if b"host" in table else None
            host_regex = table[b"host_regex"].decode("utf-8") if b"host_regex" in table else None
            re.compile(subject.decode("utf-8"))
            if host_regex is not None:
                re.compile(host_regex)
        except (ValueError, re.error) as exc:  # UnicodeDecodeError too
            raise MessageError(f"bad ban: {exc}") from None
        if host is not None and (scope is BanScope.KEY_URL or not host or _NOT_HOST.search(host)):
            raise MessageError(f"bad ban host: {host!r}")
        if host_regex is not None and (scope is BanScope.KEY_URL or not host_regex):
            raise MessageError(f"bad ban host_regex: {host_regex!r}")
        if not subject and host is None and host_regex is None:
            raise MessageError("a ban needs a regex or a host")
        return cls(Invalidation(kind, site, subject, host, scope, host_regex), node, at)


def doorbell(entry: StreamId) -> bytes:
    """The channel payload saying entry ``entry`` was added."""
    return b"entry " + format_id(entry)


def ack(node: str, position: StreamId) -> bytes:
    """The channel payload saying ``node`` applied everything up to ``position``."""
    return b"ack " + node.encode("utf-8") + b" " + format_id(position)


def parse_event(payload: bytes) -> tuple[str, str, StreamId]:
    """``("entry", "", id)`` or ``("ack", node, id)``; MessageError otherwise."""
    words = payload.split(b" ")
    if len(words) == 2 and words[0] == b"entry":
        return "entry", "", parse_id(words[1])
    if len(words) == 3 and words[0] == b"ack" and words[1]:
        try:
            node = words[1].decode("utf-8")
        except UnicodeDecodeError:
            raise MessageError("node name not UTF-8") from None
        return "ack", node, parse_id(words[2])
    raise MessageError(f"not an event: {payload[:80]!r}")
