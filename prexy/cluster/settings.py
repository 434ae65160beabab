"""The ``[cluster]`` table: where Redis is and what this node is called.

Pure: no Twisted, no sockets.  Its keys are declared in :data:`CLUSTER`
(``prexy.configschema``), which ``prexy.config`` reads like its other
tables, so a bad value is refused with the file and line like every other
key; :func:`parse_cluster` reads it with an error callback.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from typing import Any, NoReturn
from urllib.parse import parse_qs, unquote, urlsplit

import attrs

from prexy.configschema import Converter, Invalid, Key, Table, parsed

#: What a node name may hold: it travels in Redis payloads split on spaces.
NODE_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")


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


_redis = parsed(RedisAddress.parse)


def _name(value: Any) -> str:
    if not isinstance(value, str) or not NODE_NAME.fullmatch(value):
        raise Invalid(f"must be 1-64 letters, digits or . _ : -, got {value!r}")
    return value


def _seconds(low: float) -> Converter:
    def convert(value: Any, ctx: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
            raise Invalid(f"must be a number of seconds, at least {low:g}, got {value!r}")
        return float(value)

    return convert


def _entries(value: Any, ctx: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 100:
        raise Invalid(f"must be a whole number, at least 100, got {value!r}")
    return value


#: The ``[cluster]`` table's keys (``prexy.configschema``).
CLUSTER = Table("cluster", (
    Key("redis", _redis, required='needs redis = "redis://host:port/db" (or "unix:///path/redis.sock")'),
    Key("node", lambda value, ctx, key: _name(value), default_from=lambda ctx: _name(socket.gethostname())),
    Key("key", lambda value, ctx, key: _name(value)),
    Key("keep", _seconds(1.0)),
    Key("max_entries", _entries),
    Key("start_wait", _seconds(0.0)),
    Key("confirm_timeout", _seconds(0.0)),
), target=ClusterConfig)

KEYS = tuple(key.name for key in CLUSTER.keys)


class _Errors:
    def __init__(self, err: Callable[[str, str], NoReturn | None]) -> None:
        self._err = err

    def err(self, key: str, reason: str) -> NoReturn:
        self._err(key, reason)
        raise AssertionError("err must raise")  # pragma: no cover


def parse_cluster(table: Any, err: Callable[[str, str], NoReturn | None]) -> ClusterConfig:
    """The ``[cluster]`` table -> ``ClusterConfig``; ``err(key, reason)``
    raises (``prexy.config``'s ConfigError with file and line)."""
    return ClusterConfig(**CLUSTER.read(table, _Errors(err), "cluster"))


__all__ = ["CLUSTER", "ClusterConfig", "RedisAddress", "parse_cluster"]

