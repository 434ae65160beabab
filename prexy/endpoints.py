"""Twisted endpoint strings taken apart without Twisted, so that the
configuration (``prexy.config``, pure) and the listeners (``prexy.listen``)
read them alike, and the options Prexy's own ``ssl:`` listener honours."""

from __future__ import annotations

__all__ = ["SSL_OPTIONS", "split_endpoint", "unsupported_options"]

#: The options of an ``ssl:`` endpoint that Prexy's TLS listener reads
#: (SNI, ALPN and the chain come from the configuration and the PEM files).
SSL_OPTIONS = frozenset({"interface", "backlog", "privateKey", "certKey"})


def split_endpoint(desc: str) -> tuple[str, list[str], dict[str, str]]:
    """``tcp:8080:interface=127.0.0.1`` -> ("tcp", ["8080"], {"interface": "127.0.0.1"}),
    honouring backslash escapes as Twisted's endpoint parser does."""
    parts: list[str] = []
    current = []
    escaped = False
    for ch in desc:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ":":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    kind, rest = parts[0], parts[1:]
    args: list[str] = []
    kwargs: dict[str, str] = {}
    for item in rest:
        if "=" in item:
            k, v = item.split("=", 1)
            kwargs[k] = v
        else:
            args.append(item)
    return kind, args, kwargs


def unsupported_options(desc: str) -> list[str]:
    """The options of an ``ssl:`` endpoint string that Prexy's listener
    would not honour (Twisted's ``extraCertChain``, ``dhParameters``...),
    sorted; none for other kinds."""
    kind, _args, kw = split_endpoint(desc)
    if kind != "ssl":
        return []
    return sorted(k for k in kw if k not in SSL_OPTIONS)
