"""The listeners' side of the challenges: HTTP-01 answered by a
twisted.web resource (or :func:`http01_response`, for a caller that looks
at the path before any routing), TLS-ALPN-01 by a server-name callback
for pyOpenSSL contexts that moves a validation handshake to a context of
its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL
from twisted.web.resource import Resource
from twisted.web.server import Request

from prexy.acme.challenges import ACME_TLS_ALPN, HTTP01_PREFIX, ChallengeRegistry


def http01_response(registry: ChallengeRegistry, path: bytes) -> tuple[int, bytes] | None:
    """For a request path: None when it is not under
    ``/.well-known/acme-challenge/`` (route it as usual), else the status
    and body to answer, 200 and the key authorization or 404."""
    if not path.startswith(HTTP01_PREFIX):
        return None
    token = path[len(HTTP01_PREFIX) :].partition(b"?")[0]
    answer = registry.http01(token)
    if answer is None:
        return 404, b"no such ACME challenge\n"
    return 200, answer.encode("ascii")


class ChallengeResource(Resource):
    """Answers ``GET /.well-known/acme-challenge/<token>`` from the
    registry, as a leaf: mount it where those paths arrive."""

    isLeaf = True

    def __init__(self, registry: ChallengeRegistry) -> None:
        super().__init__()
        self.registry = registry

    def render_GET(self, request: Request) -> bytes:
        found = http01_response(self.registry, request.path)
        status, body = found if found is not None else (404, b"not an ACME challenge path\n")
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"text/plain")
        request.setHeader(b"cache-control", b"no-store")
        return body

    render_HEAD = render_GET


AlpnCallback = Callable[[SSL.Connection, list[bytes]], bytes]
ServerNameCallback = Callable[[SSL.Connection], None]


def _select_acme_tls(connection: SSL.Connection, offered: list[bytes]) -> bytes:
    if ACME_TLS_ALPN in offered:
        return ACME_TLS_ALPN
    return SSL.NO_OVERLAPPING_PROTOCOLS  # type: ignore[return-value]


def tls_alpn01_context(registry: ChallengeRegistry, server_name: bytes | None) -> SSL.Context | None:
    """The context that answers TLS-ALPN-01 for ``server_name``, None when
    the registry holds no answer for it: the answer's certificate alone,
    and ``acme-tls/1`` as the only protocol (a client that does not offer
    it agrees on none)."""
    answer = registry.tls_alpn01(server_name or b"")
    if answer is None:
        return None
    context = SSL.Context(SSL.TLS_SERVER_METHOD)
    context.set_min_proto_version(SSL.TLS1_2_VERSION)
    context.use_certificate(x509.load_pem_x509_certificate(answer.cert_pem))
    context.use_privatekey(serialization.load_pem_private_key(answer.key_pem, password=None))  # type: ignore[arg-type]
    context.set_alpn_select_callback(_select_acme_tls)
    return context


def servername_callback(registry: ChallengeRegistry, otherwise: ServerNameCallback | None = None) -> ServerNameCallback:
    """A server-name callback (``Context.set_tlsext_servername_callback``)
    that moves a handshake for a name with a TLS-ALPN-01 answer to
    :func:`tls_alpn01_context`, and hands any other to ``otherwise`` (the
    listener's own choice of certificate by SNI).

    The switch is made here because the server-name callback is where
    OpenSSL allows a handshake's context to change: by the time the ALPN
    callback runs, OpenSSL 3 has already chosen the certificate (changing
    the context then is a use after free).  The server-name callback does
    not see the client's ALPN list, so while an answer is registered (the
    seconds of one validation), every handshake for that name gets it; the
    issuer therefore prefers HTTP-01 for a name that already has a
    certificate (:data:`prexy.acme.issuer.CHALLENGE_TYPES`)."""

    def on_server_name(connection: SSL.Connection) -> None:
        context = tls_alpn01_context(registry, connection.get_servername())
        if context is not None:
            connection.set_context(context)
        elif otherwise is not None:
            otherwise(connection)

    return on_server_name


def alpn_selector(protocols: Sequence[bytes]) -> AlpnCallback:
    """An ALPN select callback (``Context.set_alpn_select_callback``) for
    a listener's ordinary contexts: the first of ``protocols`` (server
    preference first) the client offers, else none.  ``acme-tls/1`` is
    never agreed here: a validation handshake for a name with an answer
    has moved to :func:`tls_alpn01_context` already, any other has no
    answer to get."""
    ours = [p for p in protocols if p != ACME_TLS_ALPN]

    def select(connection: SSL.Connection, offered: list[bytes]) -> bytes:
        for protocol in ours:
            if protocol in offered:
                return protocol
        return SSL.NO_OVERLAPPING_PROTOCOLS  # type: ignore[return-value]

    return select
