"""The certificate of a TLS handshake, chosen by its server name (SNI).

Every ``ssl:`` listener of a process starts each handshake on its default
context (the ``[server]`` certificate, or the endpoint's ``privateKey=``).
OpenSSL calls back with the server name the client sent; the runtime's
host table (:meth:`prexy.runtime.Runtime.serving`, the same lookup as a
request's Host) says which site serves it, and the connection switches to
the context of that site's certificate.  A site without a certificate of
its own, a name no site serves and a handshake without a name stay on the
default context, or, with ``[server] tls_unknown = "refuse"``, the last
two are refused with an ``unrecognized_name`` alert.

:class:`ServerCertificates` keeps one OpenSSL context per distinct
certificate, made when a configuration is loaded (never per handshake),
each offering ALPN (h2, http/1.1) when the process serves HTTP/2.  A
reload (:meth:`ServerCertificates.update`) keeps the contexts of the
certificates it still uses, makes the new ones and drops the rest:
connections open keep the context they shook hands with.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.internet.interfaces import IOpenSSLContextFactory
from twisted.logger import Logger
from zope.interface import implementer

from prexy.certs import Certificate, load_certificate

log = Logger()


class UnknownServerName(Exception):
    """Raised in the server-name callback to refuse a handshake: pyOpenSSL
    answers it with a fatal alert, OpenSSL's default for this callback
    being ``unrecognized_name``."""


def _quiet_refusals() -> None:
    """pyOpenSSL hands an exception raised in the server-name callback to
    ``sys.excepthook`` (a traceback on stderr) before it refuses the
    handshake: a refusal is no error, so that hook lets ours pass silently
    (installed once, everything else goes on to the hook before it)."""
    previous = sys.excepthook
    if getattr(previous, "prexy_sni", False):
        return

    def hook(kind: Any, value: Any, traceback: Any) -> None:
        if not isinstance(value, UnknownServerName):
            previous(kind, value, traceback)

    hook.prexy_sni = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def alpn_choice(connection: Any, offered: list[bytes]) -> bytes:
    """The application protocol of a TLS connection: h2 when the client
    offers it, else HTTP/1.1 (also when it offers neither)."""
    return b"h2" if b"h2" in offered else b"http/1.1"


class ServerCertificates:
    """The contexts of a process's ``ssl:`` listeners, by certificate, and
    the choice among them by server name.

    ``alpn``: offer h2 beside http/1.1.  ``count``: called with a metric
    name for each handshake refused (``Metrics.count``)."""

    def __init__(self, alpn: bool = False, count: Any = None) -> None:
        self.alpn = alpn
        self._count = count
        #: The ``tls = "acme"`` sites' certificates from storage, by name
        #: (:class:`prexy.acme.contexts.AcmeContexts`); None: no [acme].
        self.acme: Any = None
        #: The challenge answers (:class:`prexy.acme.challenges.ChallengeRegistry`)
        #: when TLS-ALPN-01 is answered here.
        self.challenges: Any = None
        #: The waits of handshakes for on-demand certificates
        #: (:class:`prexy.ondemand.OnDemand`); None: none.
        self.on_demand: Any = None
        self._runtime: Any = None
        self._refuse = False
        #: Contexts by certificate (the sites' and the listeners' defaults).
        self._contexts: dict[Certificate, Any] = {}
        #: The listeners, by the name they were made with.
        self._listeners: dict[Any, ListenerContexts] = {}

    def context(self, certificate: Certificate) -> Any:
        """The context of ``certificate``, made once."""
        found = self._contexts.get(certificate)
        if found is None:
            found = self._contexts[certificate] = self._make(certificate)
        return found

    def _make(self, certificate: Certificate) -> Any:
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
        from OpenSSL import SSL

        # As DefaultOpenSSLContextFactory makes it, with the whole chain.
        context = SSL.Context(SSL.SSLv23_METHOD)
        context.set_options(SSL.OP_NO_SSLv2)
        leaf, *chain = x509.load_pem_x509_certificates(certificate.chain_pem)
        context.use_certificate(leaf)
        for extra in chain:
            context.add_extra_chain_cert(extra)
        key = load_pem_private_key(certificate.key_pem, None, unsafe_skip_rsa_key_validation=True)
        context.use_privatekey(key)  # type: ignore[arg-type]
        context.check_privatekey()
        if self.alpn:
            context.set_alpn_select_callback(alpn_choice)
        context.set_tlsext_servername_callback(self._choose)
        return context

    def use_acme(self, storage: Any, challenges: Any = None, size: int = 1000) -> None:
        """Serve the ``tls = "acme"`` sites' certificates stored under
        ``storage``; with ``challenges``, answer TLS-ALPN-01 from it."""
        from prexy.acme.contexts import AcmeContexts

        self.acme = AcmeContexts(storage, self._make, size)
        self.challenges = challenges

    def update(self, runtime: Any, refuse: bool = False) -> None:
        """Choose among ``runtime``'s sites from now on (its sites'
        certificates get their contexts now); ``refuse``: refuse handshakes
        without a name or for a name no site serves."""
        wanted = {s.config.certificate for s in runtime.sites if s.config.certificate is not None}
        wanted |= {listener.certificate for listener in self._listeners.values()}
        made = len(wanted - set(self._contexts))
        contexts = {certificate: self.context(certificate) for certificate in wanted}
        self._contexts = contexts
        self._runtime = runtime
        if self.acme is not None:
            self.acme.clear()  # (which sites are on ACME may have changed)
        if refuse and not self._refuse:
            _quiet_refusals()
        self._refuse = refuse
        if made:
            log.info("TLS: {n} certificate(s) ready, {made} new", n=len(contexts), made=made)

    @property
    def runtime(self) -> Any:
        """The runtime whose sites are chosen among (None before :meth:`update`)."""
        return self._runtime

    def listener(self, chain_pem: bytes, key_pem: bytes, name: Any = None) -> ListenerContexts:
        """The context factory of a listener whose default certificate is
        this chain and key (PEM); ``name`` (its endpoint) is what
        :meth:`renew_default` knows it by."""
        certificate = load_certificate(chain_pem, key_pem)
        listener = ListenerContexts(certificate, self.context(certificate))
        self._listeners[object() if name is None else name] = listener
        return listener

    def renew_default(self, name: Any, chain_pem: bytes, key_pem: bytes) -> bool:
        """Make this chain and key the default certificate of the listener
        called ``name`` (for the handshakes from now on); whether it
        changed (False for a name no listener has)."""
        listener = self._listeners.get(name)
        if listener is None:
            return False
        certificate = load_certificate(chain_pem, key_pem)
        if certificate == listener.certificate:
            return False
        listener.default = self.context(certificate)
        listener.certificate = certificate
        return True

    def _choose(self, connection: Any) -> None:
        """OpenSSL's server-name callback: switch ``connection`` to its
        site's certificate; refuse it (:class:`UnknownServerName`) when
        so configured and no site serves the name."""
        raw = connection.get_servername()
        runtime = self._runtime
        site = None
        if raw and runtime is not None:
            site = runtime.serving(raw.decode("ascii", "replace"))
        if site is None:
            if self._refuse:
                if self._count is not None:
                    self._count("prexy_tls_refused_total")
                raise UnknownServerName(raw)
            return
        if site.config.acme:
            self._choose_acme(connection, raw)
            return
        certificate = site.config.certificate
        if certificate is not None:
            context = self._contexts.get(certificate)
            if context is not None:
                connection.set_context(context)


    def _choose_acme(self, connection: Any, raw: bytes) -> None:
        """A name of a ``tls = "acme"`` site: a TLS-ALPN-01 validation
        handshake gets the answer's context (:mod:`prexy.acme.web`), any
        other the stored certificate's (read once, then from memory), else
        stays on the default."""
        if self.challenges is not None:
            from prexy.acme.web import tls_alpn01_context

            answer = tls_alpn01_context(self.challenges, raw)
            if answer is not None:
                connection.set_context(answer)
                return
        if self.acme is not None:
            context = self.acme.context(raw)
            if context is not None:
                connection.set_context(context)


@implementer(IOpenSSLContextFactory)
class ListenerContexts:
    """One listener's ``IOpenSSLContextFactory``: each handshake starts on
    its default context, whose server-name callback picks the site's."""

    def __init__(self, certificate: Certificate, default: Any) -> None:
        #: The default certificate and its context.
        self.certificate = certificate
        self.default = default

    def getContext(self) -> Any:
        return self.default
