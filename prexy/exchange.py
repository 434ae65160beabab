"""One proxied exchange, without I/O: its named states, the decisions on the
response head, the upstream request's headers, and the body pipeline.

The Twisted side (``prexy.proxy.forward``) feeds it what happens (the
upstream's head, body pieces, the end, a failure, the client leaving) and
carries out what it decides; everything here is plain values and functions,
tested without a network (``tests/test_exchange.py``).

Lifecycle (``State``, moved by ``Event``s along ``TRANSITIONS``; any
other pair is refused)::

    SENT --HEAD--> STREAMING --BODY_END--> DRAINING --COMPLETE--> DONE
      |                |                      |
      +-- COMPLETE / ANSWERED ----------------+--> DONE  (whole body, error page, stale, 304, tunnel)
      +-- UNWANTED --> GONE      +-- RESET --> ABORTED
      +-- CLIENT_LEFT: same state, detached (the fetch goes on for others)

``SENT``: the request is upstream, no head yet.  ``STREAMING``: the head
went to the client and the body flows through the pipeline.  ``DRAINING``:
the upstream body ended and what was received is still being rewritten.
``DONE``, ``GONE`` (the client went away and nobody else wants the fetch;
one that followers or the cache still want goes on through the same states
without a client, ``prexy.cache.flow.wanted``) and ``ABORTED`` (the client
connection was reset: the upstream broke mid-body or the rewrite failed
after the head went out) are final.  ``STREAMING`` and ``DRAINING`` say the
head is decided, not that it was sent: the client's request holds it back
until the first body bytes, so while a rewrite holds those back a failure
is still answered with an error status (``DONE``).

The body pipeline is decode -> transduce -> encode (``BodyPipeline``): a
compressed upstream body is decoded before the transducer sees it and
compressed again for clients that take gzip.  Every coding of
``prexy.codec.DECODABLE`` is decoded, stacked ones too; a body with any
other passes untouched.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import attrs

from prexy.cache.ranges import range_of_stream
from prexy.codec import (
    ENCODERS,
    BodyDecoder,
    Compression,
    DecodeError,
    Encoder,
    coding_etag,
    negotiate,
    parse_codings,
    unknown_coding,
)
from prexy.forwarding import HOP_BY_HOP, VIA, append_forwarded_for, append_via, forwardable
from prexy.substitution.applicability import ResourceKey

__all__ = [
    "Backlog",
    "BodyPipeline",
    "ClientCoding",
    "Event",
    "HeadPlan",
    "Lifecycle",
    "Mode",
    "PipelineError",
    "ResponsePlan",
    "State",
    "choose_client_coding",
    "coding_etag",
    "derived_etag",
    "plan_head",
    "passes_as_it_came",
    "plan_passed",
    "plan_response",
    "rewrite_timing",
    "server_timing",
    "upstream_if_none_match",
    "upstream_request_headers",
]


class State(enum.Enum):
    """Where an exchange is (``Lifecycle.state``)."""

    # Members are singletons compared by identity: hashed by it too, in C
    # (Enum's own __hash__ is a Python call, and the transition table and
    # FINAL hash a state on every move and every ``over``).
    __hash__ = object.__hash__

    SENT = "sent"
    STREAMING = "streaming"
    DRAINING = "draining"
    DONE = "done"
    GONE = "gone"
    ABORTED = "aborted"


class Event(enum.Enum):
    """What moves an exchange (``Lifecycle.on``)."""

    __hash__ = object.__hash__  # as State's

    #: The head is decided and the body streams to the client.
    HEAD = "head"
    #: The upstream body ended while received bytes still wait to be rewritten.
    BODY_END = "body-end"
    #: The last bytes of the answer went out (or into the cache, detached).
    COMPLETE = "complete"
    #: Answered otherwise: an error page, a stale copy, a 304 refresh, a tunnel.
    ANSWERED = "answered"
    #: Nobody wants the fetch any more: it is cancelled.
    UNWANTED = "unwanted"
    #: The client's connection (or HTTP/2 stream) is reset.
    RESET = "reset"
    #: The client left while others (followers, the cache) want the fetch.
    CLIENT_LEFT = "client-left"


_LIVE = (State.SENT, State.STREAMING, State.DRAINING)
# Read on every exchange, as globals: Python 3.11 reads a member off an
# Enum class through EnumType's __getattr__ hook, about 100 ns a read
# against 10 for a global (timeit).
_SENT, _CLIENT_LEFT = State.SENT, Event.CLIENT_LEFT

#: ``(state, event) -> next state``; a pair not in the table is refused.
#: CLIENT_LEFT keeps the state (the fetch goes on through the same states)
#: and makes the exchange detached (``Lifecycle.detached``).
TRANSITIONS: Mapping[tuple[State, Event], State] = {
    (State.SENT, Event.HEAD): State.STREAMING,
    (State.STREAMING, Event.BODY_END): State.DRAINING,
    **{(s, Event.COMPLETE): State.DONE for s in _LIVE},
    **{(s, Event.ANSWERED): State.DONE for s in _LIVE},
    **{(s, Event.UNWANTED): State.GONE for s in _LIVE},
    **{(s, Event.RESET): State.ABORTED for s in _LIVE},
    **{(s, Event.CLIENT_LEFT): s for s in _LIVE},
}
FINAL = frozenset({State.DONE, State.GONE, State.ABORTED})


class IllegalTransition(Exception):
    """An event arrived that the exchange's state does not allow."""


class Lifecycle:
    """The state of one exchange; the one place it moves is :meth:`on`,
    along ``TRANSITIONS``.  ``detached``: the exchange has no client of its
    own (a background refresh from the start, or since CLIENT_LEFT); its
    fetch goes on for the followers and the cache."""

    __slots__ = ("state", "detached")

    def __init__(self, detached: bool = False) -> None:
        self.state = _SENT
        self.detached = detached

    def on(self, event: Event) -> State:
        """Take ``event``; returns the new state.  Raises
        :class:`IllegalTransition` (the state unchanged) for a pair the
        table does not have, and for CLIENT_LEFT once detached."""
        to = TRANSITIONS.get((self.state, event))
        if to is None or (event is _CLIENT_LEFT and self.detached):
            raise IllegalTransition(f"{self.state.value} on {event.value}")
        if event is _CLIENT_LEFT:
            self.detached = True
        self.state = to
        return to

    @property
    def over(self) -> bool:
        """Nothing more goes to the client."""
        return self.state in FINAL

    @property
    def head_sent(self) -> bool:
        return self.state in (State.STREAMING, State.DRAINING)


# -- the upstream request -------------------------------------------------------

#: Request headers never forwarded besides hop-by-hop ones: the proxy frames
#: the body itself, and sets Host and forwarding headers itself.
REQUEST_DROP = HOP_BY_HOP | frozenset(
    {b"host", b"content-length", b"expect", b"x-forwarded-for", b"x-forwarded-host",
     b"x-forwarded-proto", b"via"}
)
#: When rewriting: the body must come as identity, a client's validators
#: name rewritten bytes (they go up translated, below), and a range of the
#: original bytes is no range of the rewritten ones (the whole body comes).
REQUEST_DROP_REWRITING = REQUEST_DROP | {b"accept-encoding", b"if-none-match", b"range", b"if-range"}
#: Response headers the proxy sets itself.
RESPONSE_DROP = HOP_BY_HOP | {b"content-length", b"via"}


@attrs.frozen
class Revalidation:
    """A stale cached copy's validators, for a conditional fetch."""

    etag: bytes | None
    last_modified: bytes | None

    @property
    def conditional(self) -> bool:
        return self.etag is not None or self.last_modified is not None


def upstream_request_headers(
    raw: Mapping[bytes, Sequence[bytes]],
    *,
    host_header: bytes,
    client_host: bytes | None,
    client_ip: bytes,
    secure: bool,
    rules_digest: str | None,
    for_cache: bool = False,
    revalidate: Revalidation | None = None,
) -> list[tuple[bytes, bytes]]:
    """The header pairs of the request sent upstream.

    ``raw``: the client's headers by lower-case name.  ``rules_digest``: the
    site's rule set when it rewrites (the body is asked for as identity and
    derived validators are translated back).  ``for_cache``: the fetch fills
    the cache, so the client's own conditionals are not forwarded (a full
    answer is needed); ``revalidate`` then adds the stale copy's."""
    rewriting = rules_digest is not None
    out = forwardable(raw, REQUEST_DROP_REWRITING if rewriting else REQUEST_DROP)
    out.append((b"Host", host_header))
    if rules_digest is not None:
        out += [(b"if-none-match", upstream_if_none_match(v, rules_digest)) for v in raw.get(b"if-none-match", ())]
        out.append((b"Accept-Encoding", b"identity"))
    if for_cache:
        # A full answer is needed: no conditionals of the client's, and the
        # whole object (a Range is answered from it, prexy.cache.ranges).
        out = [(n, v) for n, v in out if n.lower() not in (b"if-none-match", b"if-modified-since", b"range", b"if-range")]
        if revalidate is not None:
            etag = revalidate.etag
            if etag is not None and rules_digest is not None:
                etag = upstream_if_none_match(etag, rules_digest)
            if etag is not None:
                out.append((b"If-None-Match", etag))
            if revalidate.last_modified is not None:
                out.append((b"If-Modified-Since", revalidate.last_modified))
    out.append((b"X-Forwarded-For", append_forwarded_for(raw.get(b"x-forwarded-for"), client_ip)))
    out.append((b"X-Forwarded-Proto", b"https" if secure else b"http"))
    if client_host:
        out.append((b"X-Forwarded-Host", client_host))
    out.append((b"Via", append_via(raw.get(b"via"))))
    return out


# -- validators ------------------------------------------------------------------

def etag_suffix(digest: str) -> bytes:
    return b"-px" + digest[:8].encode("ascii")


def derived_etag(etag: bytes, digest: str) -> bytes:
    """A validator for the rewritten bytes: the upstream's entity tag with the
    rule set's hash appended inside the quotes, weak or strong as it was, so
    a changed rule set changes every validator and the original can be
    recovered for conditional requests upstream."""
    etag = etag.strip()
    if etag.endswith(b'"') and len(etag) >= 2:
        return etag[:-1] + etag_suffix(digest) + b'"'
    return etag


def upstream_if_none_match(value: bytes, digest: str) -> bytes:
    """If-None-Match as the upstream knows it: derived tags of this rule set
    back to the upstream's own; other tags unchanged."""
    suffix = etag_suffix(digest)
    tags = []
    for tag in value.split(b","):
        tag = tag.strip()
        for coding in ENCODERS:
            # A compressed variant's tag (``coding_etag``) stands for the
            # identity answer it was made from.
            variant = suffix + b"-" + coding + b'"'
            if tag.endswith(variant):
                tag = tag[: -len(variant)] + suffix + b'"'
                break
        if tag.endswith(suffix + b'"'):
            tag = tag[: -len(suffix) - 1] + b'"'
        tags.append(tag)
    return b", ".join(tags)


# -- the response head ----------------------------------------------------------

class Head(Protocol):
    """What the plan reads of an upstream response head."""

    code: int
    phrase: bytes
    length: int | None
    lnames: list[bytes]

    def end_to_end(self, drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]: ...

    def header(self, lname: bytes) -> bytes | None: ...

    def values(self, lname: bytes) -> list[bytes]: ...


class Rules(Protocol):
    """What the plan reads of a site's rule set (a ``RuleSet``: frozen)."""

    @property
    def digest(self) -> str: ...

    @property
    def keep_last_modified(self) -> bool: ...

    def applies_to_header(self, content_type: bytes | None) -> bool: ...


def rewrite_coding(head: Head, rules: Rules | None) -> tuple[bool, tuple[bytes, ...], bytes | None]:
    """Whether the site's rules rewrite this response, the content codings
    to decode first (as applied, ``prexy.codec.parse_codings``; empty for
    identity), and the coding that kept the rules off a response they
    would rewrite (None if none did).  A body with a coding the proxy
    cannot decode, alone or stacked with others, passes through
    unrewritten."""
    if rules is None or head.length == 0 or head.code in (204, 304):
        return False, (), None
    codings = parse_codings(head.values(b"content-encoding")) if b"content-encoding" in head.lnames else ()
    if not rules.applies_to_header(head.header(b"content-type")):
        return False, codings, None
    unknown = unknown_coding(codings)
    if unknown is not None:
        return False, codings, unknown
    return True, codings, None


def has_own_coding(head: Head) -> bool:
    """The upstream's body has a content coding (other than identity)."""
    if b"content-encoding" not in head.lnames:
        return False
    return any(v.strip().lower() not in (b"", b"identity") for v in head.values(b"content-encoding"))


@attrs.frozen
class ClientCoding:
    """Prexy's own choice of a coding for one client: ``coding`` (None:
    identity) and whether the answer depends on Accept-Encoding at all
    (then it says ``Vary: Accept-Encoding``, compressed or not)."""

    coding: bytes | None = None
    varies: bool = False


NO_CODING = ClientCoding()
#: The choices for an answer that varies on Accept-Encoding, made once
#: (frozen values; one per compressible answer otherwise).
_NEGOTIATED: dict[bytes | None, ClientCoding] = {
    coding: ClientCoding(coding, True) for coding in (None, b"gzip", b"br", b"zstd")
}


def choose_client_coding(
    head: Head,
    *,
    method: bytes,
    compression: Compression,
    accept_encoding: Sequence[bytes] | None,
    encoded: bool,
) -> ClientCoding:
    """Whether and how to compress an answer for this client: a body (not
    1xx, 204, 304; a HEAD gets the head its GET would) of a compressible
    type (``compression.types``),
    not already ``encoded`` (a coding Prexy did not decode), without
    ``Cache-Control: no-transform``, of unknown length or at least
    ``compression.min_length``; the coding is ``negotiate``'s."""
    if head.code < 200 or head.code in (204, 304) or encoded or head.length == 0:
        return NO_CODING
    if not compression.compressible(head.header(b"content-type")):
        return NO_CODING
    if b"cache-control" in head.lnames and any(b"no-transform" in v.lower() for v in head.values(b"cache-control")):
        return NO_CODING
    if head.length is not None and b"content-encoding" not in head.lnames and head.length < compression.min_length:
        return NO_CODING
    coding = negotiate(accept_encoding)
    return _NEGOTIATED.get(coding) or ClientCoding(coding, True)


def merge_vary(headers: list[tuple[bytes, bytes]], name: bytes = b"Accept-Encoding") -> list[tuple[bytes, bytes]]:
    """``headers`` with ``name`` in their Vary: added to the first Vary
    header, or a new one; unchanged if Vary names it or ``*`` already."""
    lname = name.lower()
    first = None
    for i, (n, v) in enumerate(headers):
        if n.lower() == b"vary":
            names = [x.strip().lower() for x in v.split(b",")]
            if lname in names or b"*" in names:
                return headers
            if first is None:
                first = i
    out = list(headers)
    if first is None:
        out.append((b"Vary", name))
    else:
        n, v = out[first]
        out[first] = (n, v + b", " + name if v.strip() else name)
    return out


_VARY_AE = (b"Vary", b"Accept-Encoding")


@attrs.define
class ResponsePlan:
    """The client's response head for an upstream head: header pairs in
    order and whether they carry the length (else the body is chunked)."""

    headers: list[tuple[bytes, bytes]]
    has_length: bool


def plan_response(
    head: Head,
    *,
    rules: Rules | None,
    rewrite: bool,
    decode: bool,
    out_coding: bytes | None,
    transduce: bool,
    skipped: bool,
    timing_in_trailer: bool,
    negotiated: bool = False,
) -> ResponsePlan:
    """Header rules of a proxied response.

    ``rewrite``: the site's rules apply to this response; ``transduce``:
    its body goes through the transducer; ``skipped``: this version is
    known to match no rule, so it passes unscanned with its length (a HEAD
    is neither: it gets a GET's head without the length).  ``decode``: its
    content coding is decoded first; ``out_coding``: and encoded again in
    this coding for this client (None: sent as identity).  ``negotiated``:
    the answer depends on the client's Accept-Encoding (``ClientCoding.varies``):
    it carries ``Vary: Accept-Encoding``, and a compressed one a variant of
    its ETag (``coding_etag``) and no length.  Rewritten bytes
    get derived validators (and no Last-Modified unless the rule set keeps
    it); the rewrite's Server-Timing goes in a trailer when it is known
    only at the end (``timing_in_trailer``).  Cache-Status, Via and
    Server-Timing are added by the caller."""
    if not rewrite or rules is None:
        return ResponsePlan(*_passed_fields(head, out_coding, negotiated))
    headers = head.end_to_end(RESPONSE_DROP)
    has_length = False
    length = head.length
    if decode or negotiated:
        headers = [(n, v) for n, v in headers if n.lower() != b"content-encoding"]
        if out_coding is not None:
            headers.append((b"Content-Encoding", out_coding))
        headers = merge_vary(headers) if b"vary" in head.lnames else [*headers, _VARY_AE]
    drop_modified = not rules.keep_last_modified and head.header(b"last-modified") is not None
    if drop_modified or head.header(b"etag") is not None:
        digest = rules.digest
        kept = []
        for name, value in headers:
            lname = name.lower()
            if lname == b"etag":
                value = derived_etag(value, digest)
                if negotiated and out_coding is not None:
                    value = coding_etag(value, out_coding)
            elif drop_modified and lname == b"last-modified":
                continue
            kept.append((name, value))
        headers = kept
    if transduce and timing_in_trailer:
        headers.append((b"Trailer", b"Server-Timing"))
    elif skipped and length is not None and out_coding is None:
        headers.append((b"Content-Length", b"%d" % length))
        has_length = True
    return ResponsePlan(headers, has_length)


def _passed_fields(
    head: Head, out_coding: bytes | None, negotiated: bool,
) -> tuple[list[tuple[bytes, bytes]], bool]:
    """``plan_response``'s fields and has_length for an answer passed as
    it came (not rewritten): perhaps compressed for this client."""
    headers = head.end_to_end(RESPONSE_DROP)
    length = head.length
    if negotiated:
        has_length = False
        if out_coding is not None:
            headers = [(n, coding_etag(v, out_coding) if n.lower() == b"etag" else v) for n, v in headers]
            headers.append((b"Content-Encoding", out_coding))
        elif length is not None:
            headers.append((b"Content-Length", b"%d" % length))
            has_length = True
        if b"vary" in head.lnames:
            headers = merge_vary(headers)
        else:
            headers.append(_VARY_AE)  # the common case: nothing to merge
        return headers, has_length
    if length is not None and head.code not in (204, 304):
        headers.append((b"Content-Length", b"%d" % length))
        return headers, True
    return headers, False


#: Upstream statuses for which a stale copy is served instead (RFC 5861 4).
STALE_IF_ERROR_STATUSES = frozenset({500, 502, 503, 504})


class Mode(enum.Enum):
    """How an upstream answer reaches the client (``plan_head``)."""

    __hash__ = object.__hash__  # as State's

    #: A 101: the client's connection and the upstream's are spliced.
    TUNNEL = "tunnel"
    #: A 304 to the cache's revalidation: the stored copy is refreshed and served.
    REFRESH = "refresh"
    #: An upstream error while stale-if-error (or grace) lets a stale copy serve.
    STALE = "stale"
    #: The head alone: a HEAD request, a 204 or 304, an empty body.
    NO_BODY = "no-body"
    #: The body passes as the upstream sent it.
    PASS = "pass"
    #: The body passes whole to the cache; the client gets its Range cut from it.
    RANGE = "range"
    #: The body passes unrewritten, compressed for this client.
    COMPRESS = "compress"
    #: A version known to match no rule: unscanned, with its length (or
    #: compressed for this client).
    SKIP = "skip"
    #: Rewritten in slices as it arrives.
    STREAM = "stream"
    #: It came whole with its head: rewritten in one piece before the head,
    #: whose Server-Timing then carries the rewrite.
    WHOLE_FIRST = "whole-first"
    #: It came whole with its head, and the answer can end with trailers:
    #: the head leaves first, the body is rewritten in one piece after it.
    HEAD_FIRST = "head-first"


# The modes the plan of a passed answer reads, as globals (see _SENT).
_TUNNEL, _NO_BODY, _COMPRESS, _PASS = Mode.TUNNEL, Mode.NO_BODY, Mode.COMPRESS, Mode.PASS

#: The modes whose body goes through the transducer.
REWRITTEN = frozenset({Mode.STREAM, Mode.WHOLE_FIRST, Mode.HEAD_FIRST})


class HeadPlan(NamedTuple):
    """What ``plan_head`` decided for one upstream head.  A NamedTuple:
    one is made per proxied response, and it builds in 0.4 us where a
    frozen attrs class of as many fields takes 1.1 us (timeit, 9 fields,
    this machine)."""

    mode: Mode
    #: The status and phrase the client gets (a 206 or 416 in RANGE mode).
    code: int
    phrase: bytes | None
    #: The site's rules apply to this response; its content codings (as
    #: applied) and whether they are decoded before the transducer.
    rewrite: bool = False
    codings: tuple[bytes, ...] = ()
    decode: bool = False
    #: The coding that kept the rules off a response they would rewrite.
    unknown_coding: bytes | None = None
    #: The rules to run (None: all of them) and how many that is.
    only: Any = None
    rules_run: int = 0
    #: This version matched no rule before: it passes unscanned.
    skipped: bool = False
    #: Prexy's coding for this client (``coding.coding`` None: identity).
    coding: ClientCoding = NO_CODING
    #: The cache gets the bytes before they are compressed for the client.
    tap: bool = False
    #: The client's header fields, before the delivery step adds Age, Via,
    #: Cache-Status and Server-Timing.
    headers: Sequence[tuple[bytes, bytes]] = ()
    #: The fields the cache keeps with the object (None: no cache).
    stored: Sequence[tuple[bytes, bytes]] | None = None
    #: The client's part of the body in RANGE mode: (first, last).
    span: tuple[int, int] | None = None
    #: Server-Timing entries known at the head (a skipped rewrite).
    timing_extra: bytes = b""
    #: The rewrite's Server-Timing goes in a trailer.
    timing_in_trailer: bool = False

    @property
    def transduce(self) -> bool:
        return self.mode in REWRITTEN

    @property
    def encodes(self) -> bool:
        """The body is compressed here for this client."""
        return self.coding.coding is not None and self.mode is not _NO_BODY


def plan_head(
    head: Head,
    *,
    method: bytes,
    trailers: bool,
    accept_encoding: Sequence[bytes] | None,
    rules: Rules | None,
    compression: Compression,
    applicable: Callable[[], Any],
    cached: bool = False,
    revalidating: bool = False,
    stale_usable: Callable[[], bool] = lambda: False,
    whole_max: int = 0,
    body_in_hand: bool = False,
    range_pairs: Sequence[tuple[bytes, bytes]] = (),
    targeted: frozenset[bytes] = frozenset(),
    header_names: frozenset[bytes] = frozenset(),
    rewrite_headers: Callable[[list[tuple[bytes, bytes]]], list[tuple[bytes, bytes]]] | None = None,
    rules_count: int = 0,
) -> HeadPlan:
    """Every decision on an upstream response head, in one place.

    ``trailers``: the client's answer can end with trailer fields (and get
    1xx heads).  ``applicable()``: the rules to run on this version of the
    resource (None: all; empty: it matched none before), asked only when
    the rules would rewrite it.  ``cached``: the exchange has a cache
    context (the body may be stored, or followers wait for it);
    ``revalidating``: the fetch asked the upstream to revalidate a stale
    copy; ``stale_usable()``: a stale copy may answer an upstream error.
    ``whole_max``: the largest body rewritten in one piece when it came
    with its head (``body_in_hand``), 0 when the process's rewriting is
    busy.  ``range_pairs``: the client's request header pairs when its
    Range is cut from a body the cache fetches whole.  ``targeted``: fields
    meant for this proxy alone; ``header_names`` and ``rewrite_headers``:
    the site's header rules and the fields they may change.
    ``rules_count``: the rule set's size, for Server-Timing."""
    code = head.code
    if code == 101:
        return HeadPlan(Mode.TUNNEL, code, None)
    if revalidating and code == 304:
        return HeadPlan(Mode.REFRESH, code, None)
    if code in STALE_IF_ERROR_STATUSES and stale_usable():
        return HeadPlan(Mode.STALE, code, None)
    codings: tuple[bytes, ...]
    if rules is None:
        rewrite, codings, unknown = False, (), None
    else:
        rewrite, codings, unknown = rewrite_coding(head, rules)
    transduce = skipped = False
    only = None
    rules_run = 0
    if rewrite and method != b"HEAD":
        only = applicable()
        if only is not None and not only and not codings:
            skipped = True
        else:
            transduce = True
            rules_run = rules_count if only is None else len(only)
    decode = rewrite and bool(codings)
    # A rewritten answer is compressed for this client in the coding it
    # prefers; a passed one when the upstream sent it as identity.  What
    # the cache stores (and followers get) stays identity: each hit gets
    # its coding from the store.
    choice = choose_client_coding(
        head, method=method, compression=compression, accept_encoding=accept_encoding,
        encoded=(bool(codings) and not decode) if rewrite else (
            b"content-encoding" in head.lnames and has_own_coding(head)
        ),
    )
    out_coding = choice.coding
    encodes = out_coding is not None and method != b"HEAD"
    length = head.length
    no_body = method == b"HEAD" or length == 0 or code in (204, 304)
    whole = (
        transduce and not codings and not cached and body_in_hand
        and length is not None and 0 < length <= whole_max
    )
    if no_body:
        mode = Mode.NO_BODY
    elif whole:
        mode = Mode.HEAD_FIRST if trailers else Mode.WHOLE_FIRST
    elif transduce:
        mode = Mode.STREAM
    elif encodes:
        mode = Mode.SKIP if skipped else Mode.COMPRESS
    else:
        mode = Mode.SKIP if skipped else Mode.PASS
    # The cache keeps identity bytes: it is given them before they are
    # compressed for this client.
    tap = cached and encodes and not no_body
    headers = plan_response(
        head, rules=rules, rewrite=rewrite, decode=decode, out_coding=out_coding,
        transduce=transduce, skipped=skipped,
        timing_in_trailer=mode is not Mode.WHOLE_FIRST and trailers,
        negotiated=choice.varies,
    ).headers
    lnames = head.lnames
    if targeted and not targeted.isdisjoint(lnames):
        headers = [(n, v) for n, v in headers if n.lower() not in targeted]
    rewrites = rewrite_headers is not None and bool(header_names) and not header_names.isdisjoint(lnames)
    if rewrites:
        assert rewrite_headers is not None
        headers = rewrite_headers(headers)
    stored = None
    if cached:
        stored = headers
        if tap:  # the cache keeps the identity answer
            stored = plan_response(
                head, rules=rules, rewrite=rewrite, decode=decode, out_coding=None,
                transduce=transduce, skipped=False, timing_in_trailer=True, negotiated=True,
            ).headers
            if targeted:
                stored = [(n, v) for n, v in stored if n.lower() not in targeted]
            if rewrites:
                assert rewrite_headers is not None
                stored = rewrite_headers(stored)
    phrase: bytes | None = head.phrase
    span = None
    if (
        range_pairs and not transduce and not encodes and not no_body and code == 200
        and method == b"GET" and length is not None
    ):
        # A cacheable GET with a Range: the whole object is fetched and
        # stored; its client gets its range as the body streams by.
        part = range_of_stream(range_pairs, length, head.header, headers)
        if part is not None:
            code, phrase, headers, span = part
            mode = Mode.RANGE
    if not rewrite:  # the rewrite's fields keep their defaults
        return HeadPlan(
            mode, code, phrase, codings=codings, unknown_coding=unknown, coding=choice, tap=tap,
            headers=headers, stored=stored, span=span,
        )
    return HeadPlan(
        mode, code, phrase, rewrite=rewrite, codings=codings, decode=decode, unknown_coding=unknown,
        only=only, rules_run=rules_run, skipped=skipped, coding=choice, tap=tap,
        headers=headers, stored=stored, span=span,
        timing_extra=SKIPPED_TIMING if skipped else b"",
        timing_in_trailer=mode is not Mode.WHOLE_FIRST and trailers and transduce,
    )


def passes_as_it_came(
    rules: object | None, cached: bool, targeted: frozenset[bytes], header_names: frozenset[bytes],
    lnames: Sequence[bytes],
) -> bool:
    """Whether ``plan_passed`` makes an answer's plan: a site without
    rules and without fields targeted at it, an exchange without a cache
    context, and no field of the answer (``lnames``) a header rule of the
    site changes (``header_names``)."""
    return rules is None and not cached and not targeted and header_names.isdisjoint(lnames)


def plan_passed(
    head: Head, *, method: bytes, accept_encoding: Sequence[bytes] | None, compression: Compression,
) -> HeadPlan:
    """``plan_head``'s plan for a site with no rules and no fields
    targeted at it, an exchange without a cache context, and an answer
    without a field the site's header rules change: passed as it came, or
    compressed for this client.  The same plan, without asking what only
    those features need (``tests/test_exchange_passed.py`` holds the two
    equal)."""
    code = head.code
    if code == 101:
        return HeadPlan(_TUNNEL, code, None)
    choice = choose_client_coding(
        head, method=method, compression=compression, accept_encoding=accept_encoding,
        encoded=b"content-encoding" in head.lnames and has_own_coding(head),
    )
    out_coding = choice.coding
    if method == b"HEAD" or head.length == 0 or code in (204, 304):
        mode = _NO_BODY
    elif out_coding is not None:
        mode = _COMPRESS
    else:
        mode = _PASS
    headers, _ = _passed_fields(head, out_coding, choice.varies)
    return HeadPlan(mode, code, head.phrase, coding=choice, headers=headers)


def finish_head(
    headers: Sequence[tuple[bytes, bytes]],
    *,
    via: Sequence[bytes] = (),
    age: bytes | None = None,
    cache_status: bytes | None = None,
    timing: bytes | None = None,
) -> list[tuple[bytes, bytes]]:
    """The delivery step's fields, the same for every answer (a miss, a
    hit, a follower, a refreshed or stale copy): ``headers`` (the answer's
    own), then Age (a stored copy's), Via (``via``: the upstream's values,
    this proxy appended; a stored copy keeps none, its answer is this
    proxy's), Cache-Status and Server-Timing."""
    out = list(headers)
    if age is not None:
        out.append((b"Age", age))
    out.append((b"Via", append_via(via) if via else VIA))
    if cache_status is not None:
        out.append((b"Cache-Status", cache_status))
    if timing is not None:
        out.append((b"Server-Timing", timing))
    return out


def server_timing(connect: float, first_byte: float, own: float, extra: bytes = b"") -> bytes:
    """The head's Server-Timing: the upstream's connect and first-byte
    times and the proxy's own (seconds in, milliseconds out)."""
    timing = b"upstream-connect;dur=%.3f, upstream-first-byte;dur=%.3f, prexy;dur=%.3f" % (
        connect * 1000, first_byte * 1000, max(0.0, own) * 1000
    )
    return timing + b", " + extra if extra else timing


SKIPPED_TIMING = b'rewrite-skipped;desc="no rule matched this version before"'


def rewrite_timing(transducer: Any, rules_run: int) -> bytes:
    """The Server-Timing entries of a finished rewrite."""
    timing = b"rewrite;dur=%.3f" % (transducer.scan_seconds * 1000)
    timing += b', rewrite-rules;desc="%d matched of %d run"' % (len(transducer.rules_matched), rules_run)
    if transducer.bailed_out:
        timing += b', rewrite-bailout;desc="max_buffered_size reached"'
    if transducer.timed_out:
        timing += b', rewrite-timeout;desc="scan timed out, rest passed unchanged"'
    return timing


def resource_key(
    site: bytes, head: Head, target: bytes, request_headers: Callable[[], Mapping[bytes, Sequence[bytes]]],
) -> ResourceKey | None:
    """The version of a resource, for the applicability memory: the site,
    the upstream target (not the client's URI: a URL map may point the same
    URI at another upstream file with an equal-looking ETag), the
    validators, the length, and the request headers the response varies on
    (``request_headers``: lower-case name -> values, read only then).  None
    without ETag and Last-Modified: then nothing is remembered."""
    etag = head.header(b"etag")
    last_modified = head.header(b"last-modified")
    if etag is None and last_modified is None:
        return None
    vary = head.header(b"vary")
    variant = b""
    if vary:
        raw = request_headers()
        names = [n.strip().lower() for n in vary.split(b",") if n.strip()]
        variant = b"\n".join(b",".join(raw.get(n, ())) for n in names)
    return ResourceKey.of_bytes(
        site, target, etag=etag, last_modified=last_modified, length=head.length, variant=variant
    )


# -- the body ----------------------------------------------------------------------

class PipelineError(Exception):
    """The body cannot go on: a corrupt compressed body (``decode``, with
    the ``coding`` that failed) or a failure inside the rewrite."""

    def __init__(self, message: str, decode: bool, coding: bytes | None = None) -> None:
        super().__init__(message)
        self.decode = decode
        self.coding = coding


#: Largest piece given to the transducer in one feed (decoded bytes can
#: outgrow a slice many times over).
MAX_FEED = 256 * 1024


class BodyPipeline:
    """decode -> transduce -> encode, piece by piece (``transducer`` None:
    an answer passed through, only compressed for the client).

    ``feed(data, last)``: ``last`` when these are the body's last bytes:
    the decoder, the transducer and the encoder then end with them, as the
    replace-filter module ends a body whose last buffer carries the end
    (``Transducer.finish(data)``: a match at the very end is decided with
    the data, and nothing is held against the buffer limit), and their
    output can go with the end of the response; ``finish()`` ends whatever
    is still open (the end came on its own).  ``trailing_garbage()``: what
    the decoder ignored after the end of its stream."""

    def __init__(
        self, transducer: Any, decoder: BodyDecoder | None = None, encoder: Encoder | None = None,
        tap: Callable[[bytes], None] | None = None,
    ) -> None:
        self.transducer = transducer
        self.decoder = decoder
        self.encoder = encoder
        #: The decoder was given the body's last bytes and ended.
        self.decoded_end = False
        #: The encoder was given the body's last bytes and ended its stream.
        self.encoded_end = False
        #: Given the rewritten bytes before they are encoded (what the cache
        #: stores while the client gets them compressed).
        self.tap = tap
        self.ended = False

    def feed(self, data: bytes, last: bool = False) -> bytes:
        transducer = self.transducer
        try:
            if self.decoder is not None:
                data = self.decoder.feed(data)
                if last:
                    data += self.decoder.finish()
                    self.decoded_end = True
            if transducer is None:  # compression only
                out = data
                self.ended = last
            elif last:
                out = transducer.finish(data)
                self.ended = True
            elif len(data) <= MAX_FEED:
                out = transducer.feed(data)
            else:
                out = b"".join(transducer.feed(data[i : i + MAX_FEED]) for i in range(0, len(data), MAX_FEED))
            if self.encoder is not None:
                if self.tap is not None and out:
                    self.tap(out)
                if last:
                    out = self.encoder.last(out)
                    self.encoded_end = True
                else:
                    out = self.encoder.feed(out)
        except DecodeError as exc:
            raise PipelineError(str(exc), decode=True, coding=exc.coding) from None
        except Exception as exc:
            raise PipelineError(f"substitution failed: {exc!r}", decode=False) from exc
        return out

    def finish(self) -> bytes:
        transducer = self.transducer
        try:
            tail = b""
            if self.decoder is not None and not self.decoded_end:
                tail = self.decoder.finish()
                self.decoded_end = True
            if transducer is None:
                self.ended = True
            elif not self.ended:
                tail = transducer.finish(tail)
                self.ended = True
            if self.encoder is not None and not self.encoded_end:
                if self.tap is not None and tail:
                    self.tap(tail)
                tail = self.encoder.last(tail)
                self.encoded_end = True
        except DecodeError as exc:
            raise PipelineError(str(exc), decode=True, coding=exc.coding) from None
        except Exception as exc:
            raise PipelineError(f"substitution failed at end of body: {exc!r}", decode=False) from exc
        return tail

    def trailing_garbage(self) -> tuple[tuple[bytes, int], ...]:
        """(coding, bytes) ignored after the end of each coding's stream."""
        return () if self.decoder is None else self.decoder.trailing_garbage()


#: Slices adapt to the rule set's speed so one takes about SLICE_SECONDS,
#: but never go below MIN_SLICE: a feed has a fixed cost (with 1000
#: realistic rules about 45 us, bench/bench_transducer.py), so smaller
#: slices measure slower per byte, which shrank them further, to 1 KiB
#: (1000 rules: 262 of 280 bench requests of a 23 KB page streamed, 4.6 ms
#: each, against 0.8 ms of rewriting in one piece).
SLICE_SECONDS = 0.00025
FIRST_SLICE = 16 * 1024
MIN_SLICE, MAX_SLICE = 8 * 1024, 256 * 1024
#: A body that came whole with its head is rewritten at once, before the
#: head, when the rule set rewrites it in about this long, and nothing else
#: waits to be rewritten.  Measured with the realistic bench sets
#: (bench/realistic.py): at 0.25 ms (one slice) the 23 KB page was
#: streamed in 273-280 of 280 requests at 10 to 1000 rules, 1.2-3.0 ms per
#: request.
WHOLE_SECONDS = 0.001


def whole_limit(slice_size: int) -> int:
    """Largest body rewritten before its head, for a rule set whose slices
    are ``slice_size`` bytes."""
    return int(slice_size * WHOLE_SECONDS / SLICE_SECONDS)


def next_slice(size: int, nbytes: int, spent: float) -> int | None:
    """The next slice size after rewriting ``nbytes`` in ``spent`` seconds
    with slices of ``size``: what the rule set rewrites in ~SLICE_SECONDS,
    at most halving or doubling per step, so that one slow measurement (a
    preemption, a collection) does not shrink the slices of every later
    response to a size where fixed costs dominate.  None when the slice
    says nothing (a small one, or no measurable time)."""
    if spent <= 0 or nbytes < max(MIN_SLICE, size // 2):
        return None
    estimate = nbytes * SLICE_SECONDS / spent
    return int(min(MAX_SLICE, max(MIN_SLICE, size / 2, min(estimate, size * 2))))


def take_slice(backlog: deque[bytes], size: int) -> bytes:
    """Up to ``size`` bytes from the front of ``backlog``: a large piece is
    split, small ones are joined (each feed has a fixed cost: 20-60 us with
    the realistic bench sets, so feeding an upstream's 1 KiB chunks one by
    one multiplied it)."""
    data = backlog.popleft()
    if len(data) > size:
        backlog.appendleft(data[size:])
        return data[:size]
    if backlog and len(data) + len(backlog[0]) <= size:
        parts = [data]
        total = len(data)
        while backlog and total + len(backlog[0]) <= size:
            piece = backlog.popleft()
            parts.append(piece)
            total += len(piece)
        return b"".join(parts)
    return data


#: A response whose rewriting is behind pauses its upstream once this many
#: bytes wait (bounded memory; no pause/resume of the socket on every turn).
BACKLOG_PAUSE = 128 * 1024


class Backlog:
    """Body pieces received and not yet rewritten: taken in slices sized
    to the rule set's speed (``take_slice``, ``next_slice``), with the
    upstream paused while more than :data:`BACKLOG_PAUSE` bytes wait.  The
    exchange feeds it and carries out what it answers."""

    __slots__ = ("pieces", "size", "slice", "expect", "paused")

    def __init__(self, slice_size: int = FIRST_SLICE) -> None:
        self.pieces: deque[bytes] = deque()
        #: Bytes waiting.
        self.size = 0
        #: The next slice's size.
        self.slice = slice_size
        #: Body bytes still to come when the upstream gave a length: the
        #: last piece then ends the pipeline with its data.
        self.expect: int | None = None
        #: The upstream is paused for this backlog.
        self.paused = False

    def __bool__(self) -> bool:
        return bool(self.pieces)

    def add(self, data: bytes) -> bool:
        """Queue a piece; True when the upstream must pause now."""
        if self.expect is not None:
            self.expect -= len(data)
        self.pieces.append(data)
        self.size += len(data)
        if self.size >= BACKLOG_PAUSE and not self.paused:
            self.paused = True
            return True
        return False

    def take(self, ended: bool) -> tuple[bytes, bool]:
        """The next slice, and whether it is the body's last bytes: the body
        is known complete (its length fully read, or ``ended``: its end
        came) and nothing waits after it."""
        data = take_slice(self.pieces, self.slice)
        self.size -= len(data)
        return data, (self.expect == 0 or ended) and not self.pieces

    def clear(self) -> None:
        self.pieces.clear()
        self.size = 0

    def resume(self) -> bool:
        """Everything waiting is rewritten: True when the upstream was
        paused for it and resumes now."""
        paused, self.paused = self.paused, False
        return paused

    def measured(self, nbytes: int, seconds: float) -> int | None:
        """A slice of ``nbytes`` took ``seconds``: the next slice's size,
        when that says anything (``next_slice``)."""
        size = next_slice(self.slice, nbytes, seconds)
        if size is not None:
            self.slice = size
        return size


def budget(timer: Callable[[], float], seconds: float) -> Callable[[], bool]:
    """A termination predicate for ``task.Cooperator``: true once ``seconds``
    have passed on ``timer`` since it was made."""
    deadline = timer() + seconds

    def spent() -> bool:
        return timer() >= deadline

    return spent
