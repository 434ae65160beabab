"""Automatic certificates from an ACME CA (RFC 8555).

``policy`` decides (which names, when to renew, how fast to retry, within
which limits) and imports neither Twisted nor the ACME library;
``storage`` keeps the account key and one certificate per name on disk;
``challenges`` answers HTTP-01 and TLS-ALPN-01; ``issuer`` speaks to the
CA through certbot's ``acme`` library off the reactor.  This ``__init__``
imports none of them, so the pure core stays light.
"""
