"""Which site serves a host name: one table for a request's ``Host`` and a
TLS handshake's server name (SNI).

A site's ``hosts`` hold exact names (``shop.example.com``) and leading
wildcards (``*.example.com``).  A name is looked up as nginx's
``server_name`` picks: the exact name first, then the longest leading
wildcard that matches it (``*.example.com`` matches ``a.example.com`` and
``a.b.example.com``, not ``example.com``).  Names are compared lower-case,
one trailing dot ignored.  No Twisted here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")

#: A DNS-ish label: letters, digits, '-' and '_' (seen in real hosts), or
#: an IPv6 literal in brackets (a Host header's form).
_NAME = re.compile(r"(?:[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")
_IPV6 = re.compile(r"\[[0-9a-f:.]+\]")


def normalise(name: str) -> str:
    """``name`` as tables hold it: lower-case, one trailing dot dropped."""
    name = name.lower()
    return name[:-1] if name.endswith(".") else name


def host_problem(host: str) -> str | None:
    """Why ``host`` (normalised) cannot be one of a site's ``hosts``, or
    None.  A wildcard is ``*.`` and a name of two labels or more."""
    if host.startswith("*."):
        rest = host[2:]
        if "*" in rest or not _NAME.fullmatch(rest):
            return f"{host!r}: a wildcard is '*.' then a name (such as '*.example.com')"
        if "." not in rest:
            return f"{host!r}: a wildcard needs a name of two labels or more after '*.'"
        return None
    if "*" in host:
        return f"{host!r}: '*' may only be the whole first label ('*.example.com')"
    if not host.isascii():
        return f"{host!r}: write an international name in its ASCII form (xn--...), as clients send it"
    if not (_NAME.fullmatch(host) or _IPV6.fullmatch(host)):
        return f"{host!r} is not a host name"
    return None


class HostTable(Generic[T]):
    """Host names and wildcards -> values; :meth:`get` picks as nginx does."""

    def __init__(self, entries: Iterable[tuple[str, T]] = ()) -> None:
        #: Exact names.
        self.exact: dict[str, T] = {}
        #: Wildcards by the suffix they match, dot included (".example.com").
        self.wildcards: dict[str, T] = {}
        for host, value in entries:
            host = normalise(host)
            if host.startswith("*."):
                self.wildcards.setdefault(host[1:], value)
            else:
                self.exact.setdefault(host, value)

    def __len__(self) -> int:
        return len(self.exact) + len(self.wildcards)

    def get(self, name: str) -> T | None:
        """The value of ``name`` (normalised here): its exact entry, else
        the longest wildcard matching it, else None."""
        name = normalise(name)
        found = self.exact.get(name)
        if found is not None or not self.wildcards:
            return found
        dot = name.find(".")
        # Left to right: the first suffix found is the longest.
        while dot > 0:
            found = self.wildcards.get(name[dot:])
            if found is not None:
                return found
            dot = name.find(".", dot + 1)
        return None
