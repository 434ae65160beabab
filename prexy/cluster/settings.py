"""The ``[cluster]`` table: where Redis is and what this node is called.

Pure: no Twisted, no sockets.  ``prexy.config`` calls :func:`parse_cluster`
with its error callback, so a bad value is refused with the file and line
like every other key.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from typing import Any, NoReturn
from urllib.parse import parse_qs, unquote, urlsplit

import attrs

#: What a node name may hold: it travels in Redis payloads split on spaces.
NODE_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")

KEYS = ("redis", "node", "key", "keep", "max_entries", "start_wait", "confirm_timeout")


@attrs.frozen
class RedisAddress:
    """A Redis server: TCP host and port, or a UNIX socket path; database
    number and optional credentials (sent with AUTH)."""

    host: str = ""
    port: int = 6379
    path: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)

    @classmethod
    def parse(cls, text: str) -> RedisAddress:
        """``redis://[[user]:password@]host[:port][/db]`` or
        ``unix://[[user]:password@]/path[?db=N]``; ValueError otherwise."""
        parts = urlsplit(text)
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        if parts.scheme == "redis":
            if not parts.hostname:
                raise ValueError(f"has no host: {text!r}")
            try:
                port = parts.port or 6379
            except ValueError as exc:
                raise ValueError(f"bad port in {text!r}: {exc}") from None
            db_text = parts.path.strip("/") or "0"
            if parts.query or parts.fragment:
                raise ValueError(f"must not have a query or fragment: {text!r}")
            return cls(host=parts.hostname, port=port, db=_db(db_text, text), username=user, password=password)
        if parts.scheme == "unix":
            if not parts.path.startswith("/"):
                raise ValueError(f"needs an absolute socket path: {text!r} (unix:///run/redis.sock)")
            query = parse_qs(parts.query, keep_blank_values=True)
            unknown = set(query) - {"db"}
            if unknown or parts.fragment or parts.hostname:
                raise ValueError(f"only ?db=N may follow the socket path: {text!r}")
            db_text = query.get("db", ["0"])[-1]
            return cls(path=parts.path, db=_db(db_text, text), username=user, password=password)
        raise ValueError(f"must be a redis:// or unix:// URL, got {text!r}")

    def __str__(self) -> str:
        where = f"unix://{self.path}" if self.path else f"redis://{self.host}:{self.port}"
        return f"{where}/{self.db}" if not self.path else f"{where}?db={self.db}"


def _db(text: str, url: str) -> int:
    if not text.isdigit():
        raise ValueError(f"the database must be a number: {url!r}")
    return int(text)


@attrs.frozen
class ClusterConfig:
    """One node's view of the fleet it belongs to."""

    redis: RedisAddress
    #: This node's name; unique in the fleet (its own messages are skipped).
    node: str
    #: Prefix of the Redis keys: ``KEY:log`` (the stream), ``KEY:events``
    #: (the channel), ``KEY:nodes`` (positions); fleets sharing one Redis
    #: need different keys.
    key: str = "prexy"
    #: Seconds invalidations are kept for nodes that were away.
    keep: float = 7 * 24 * 3600.0
    #: At most this many invalidations are kept (the oldest go first).
    max_entries: int = 100_000
    #: Seconds a starting node waits for Redis (to catch up) before serving.
    start_wait: float = 5.0
    #: Seconds a PURGE or ban waits for every live node to confirm.
    confirm_timeout: float = 1.0

    @property
    def stream(self) -> str:
        return f"{self.key}:log"

    @property
    def channel(self) -> str:
        return f"{self.key}:events"

    @property
    def nodes_key(self) -> str:
        return f"{self.key}:nodes"


def parse_cluster(table: Any, err: Callable[[str, str], NoReturn | None]) -> ClusterConfig:
    """The ``[cluster]`` table -> ``ClusterConfig``; ``err(key, reason)``
    raises (``prexy.config``'s ConfigError with file and line)."""

    def fail(key: str, reason: str) -> NoReturn:
        err(f"cluster.{key}" if key else "cluster", reason)
        raise AssertionError("err must raise")  # pragma: no cover

    if not isinstance(table, Mapping):
        fail("", "must be a table")
    for key in table:
        if key not in KEYS:
            fail(key, f"unknown key (allowed: {', '.join(KEYS)})")
    if "redis" not in table:
        fail("", 'needs redis = "redis://host:port/db" (or "unix:///path/redis.sock")')
    if not isinstance(table["redis"], str):
        fail("redis", f"must be a str, got {table['redis']!r}")
    try:
        address = RedisAddress.parse(table["redis"])
    except ValueError as exc:
        fail("redis", str(exc))
    node = table.get("node", socket.gethostname())
    if not isinstance(node, str) or not NODE_NAME.fullmatch(node):
        fail("node", f"must be 1-64 letters, digits or . _ : -, got {node!r}")
    key = table.get("key", "prexy")
    if not isinstance(key, str) or not NODE_NAME.fullmatch(key):
        fail("key", f"must be 1-64 letters, digits or . _ : -, got {key!r}")
    numbers: dict[str, float] = {}
    for name, low in (("keep", 1.0), ("start_wait", 0.0), ("confirm_timeout", 0.0)):
        if name in table:
            value = table[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
                fail(name, f"must be a number of seconds, at least {low:g}, got {value!r}")
            numbers[name] = float(value)
    max_entries = table.get("max_entries", 100_000)
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 100:
        fail("max_entries", f"must be a whole number, at least 100, got {max_entries!r}")
    return ClusterConfig(redis=address, node=node, key=key, max_entries=max_entries, **numbers)


__all__ = ["ClusterConfig", "RedisAddress", "parse_cluster"]

