"""The listeners' side of the challenges: HTTP-01 answered by a
twisted.web resource (or :func:`http01_response`, for a caller that looks
at the path before any routing), TLS-ALPN-01 by an ALPN selection callback
for pyOpenSSL contexts."""

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


def alpn_selector(registry: ChallengeRegistry, protocols: Sequence[bytes]) -> AlpnCallback:
    """An ALPN select callback (``Context.set_alpn_select_callback``) for
    a listener that speaks ``protocols`` (server preference first).

    A client that offers ``acme-tls/1`` for a name with a TLS-ALPN-01
    answer in the registry gets that answer's certificate alone (OpenSSL
    picks the certificate after ALPN) and ``acme-tls/1``; offering it for any
    other name gets no protocol.  Any other client gets the first of
    ``protocols`` it offers, or no ALPN at all."""
    ours = list(protocols)

    def select(connection: SSL.Connection, offered: list[bytes]) -> bytes:
        if ACME_TLS_ALPN in offered:
            answer = registry.tls_alpn01(connection.get_servername() or b"")
            if answer is None:
                return SSL.NO_OVERLAPPING_PROTOCOLS  # type: ignore[return-value]
            # A context of its own, so that the answer is the only
            # certificate on offer (use_certificate would add it beside
            # the listener's, in the slot of its key type).
            context = SSL.Context(SSL.TLS_SERVER_METHOD)
            context.use_certificate(x509.load_pem_x509_certificate(answer.cert_pem))
            context.use_privatekey(serialization.load_pem_private_key(answer.key_pem, password=None))  # type: ignore[arg-type]
            connection.set_context(context)
            return ACME_TLS_ALPN
        for protocol in ours:
            if protocol in offered:
                return protocol
        return SSL.NO_OVERLAPPING_PROTOCOLS  # type: ignore[return-value]

    return select
