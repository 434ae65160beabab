"""An in-memory Redis for the cluster's unit tests: the commands the node
uses (streams, a hash, pub/sub), spoken in RESP over ``iosim`` connections,
so ``ClusterService`` runs unchanged on a ``Clock`` with no socket.

Commands are parsed with ``hiredis.Reader`` (a command is a RESP array) and
replies encoded by :func:`resp`; behaviour follows the Redis 7 manual for
what the node relies on (XADD ids, XREAD's exclusive start, XTRIM MINID,
``max-deleted-entry-id``, subscribed connections)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hiredis
from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.protocol import Protocol
from twisted.test import iosim

from prexy.cluster.redis import RedisConnection


class Error(str):
    """An error reply."""


def resp(value: Any) -> bytes:
    if value is None:
        return b"$-1\r\n"
    if isinstance(value, Error):
        return b"-" + value.encode() + b"\r\n"
    if isinstance(value, bool):
        raise TypeError(value)
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if isinstance(value, (list, tuple)):
        return b"*%d\r\n" % len(value) + b"".join(resp(v) for v in value)
    raise TypeError(value)


class FakeRedis:
    """The server's data, shared by all its connections."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.streams: dict[bytes, list[tuple[tuple[int, int], list[bytes]]]] = {}
        self.max_deleted: dict[bytes, tuple[int, int]] = {}
        self.hashes: dict[bytes, dict[bytes, bytes]] = {}
        self.subscribers: dict[bytes, list[FakeRedisProtocol]] = {}
        self.commands: list[list[bytes]] = []

    def next_id(self, key: bytes) -> tuple[int, int]:
        ms = int(self.clock.seconds() * 1000)
        entries = self.streams.get(key, [])
        last = entries[-1][0] if entries else self.max_deleted.get(key, (0, 0))
        return (ms, 0) if ms > last[0] else (last[0], last[1] + 1)

    def trim(self, key: bytes, keep: Callable[[tuple[int, int], int], bool]) -> None:
        """Keep the entries ``keep(id, place from the end)`` says to keep."""
        entries = self.streams.get(key, [])
        n = len(entries)
        kept = [e for i, e in enumerate(entries) if keep(e[0], n - i)]
        gone = [e[0] for e in entries if e not in kept]
        if gone:
            self.max_deleted[key] = max([*gone, self.max_deleted.get(key, (0, 0))])
        self.streams[key] = kept


def _id(raw: bytes) -> tuple[int, int]:
    ms, _, seq = raw.partition(b"-")
    return int(ms), int(seq or 0)


class FakeRedisProtocol(Protocol):
    def __init__(self, server: FakeRedis) -> None:
        self.server = server
        self.reader = hiredis.Reader()
        self.subscribed: set[bytes] = set()

    def dataReceived(self, data: bytes) -> None:
        self.reader.feed(data)
        while (command := self.reader.gets()) is not False:
            self.server.commands.append(command)
            self.transport.write(resp(self.run([bytes(c) for c in command])))

    def connectionLost(self, reason: Any = None) -> None:
        for subs in self.server.subscribers.values():
            if self in subs:
                subs.remove(self)

    def run(self, c: list[bytes]) -> Any:
        s = self.server
        name = c[0].upper()
        if self.subscribed and name not in (b"PING", b"SUBSCRIBE"):
            return Error("ERR only (P)SUBSCRIBE / (P)UNSUBSCRIBE / PING / QUIT allowed in this context")
        if name == b"PING":
            return [b"pong", b""] if self.subscribed else "PONG"
        if name in (b"AUTH", b"SELECT"):
            return "OK"
        if name == b"SUBSCRIBE":
            self.subscribed.add(c[1])
            s.subscribers.setdefault(c[1], []).append(self)
            return [b"subscribe", c[1], len(self.subscribed)]
        if name == b"PUBLISH":
            subs = s.subscribers.get(c[1], [])
            for sub in subs:
                sub.transport.write(resp([b"message", c[1], c[2]]))
            return len(subs)
        if name == b"HSET":
            s.hashes.setdefault(c[1], {})[c[2]] = c[3]
            return 1
        if name == b"HDEL":
            return 1 if s.hashes.get(c[1], {}).pop(c[2], None) is not None else 0
        if name == b"HGETALL":
            return [x for kv in s.hashes.get(c[1], {}).items() for x in kv]
        if name == b"XADD":
            key, rest = c[1], c[2:]
            maxlen = None
            if rest[0].upper() == b"MAXLEN":
                maxlen = int(rest[2])
                rest = rest[3:]
            assert rest[0] == b"*"
            sid = s.next_id(key)
            s.streams.setdefault(key, []).append((sid, rest[1:]))
            if maxlen is not None:
                s.trim(key, lambda sid, from_end: from_end <= maxlen)
            return b"%d-%d" % sid
        if name == b"XTRIM":
            assert c[2].upper() == b"MINID"
            minid = _id(c[4])
            s.trim(c[1], lambda sid, _: sid >= minid)
            return 0
        if name == b"XINFO":
            key = c[2]
            if key not in s.streams:
                return Error("ERR no such key")
            return [b"length", len(s.streams[key]), b"max-deleted-entry-id", b"%d-%d" % s.max_deleted.get(key, (0, 0))]
        if name == b"XREAD":
            count = int(c[2])
            key, after = c[4], _id(c[5])
            found = [[b"%d-%d" % sid, f] for sid, f in s.streams.get(key, []) if sid > after][:count]
            return [[key, found]] if found else None
        return Error(f"ERR unknown command '{name.decode()}'")


class FakeNet:
    """Connections between clients and one FakeRedis, pumped by hand."""

    def __init__(self, server: FakeRedis) -> None:
        self.server = server
        self.pumps: list[iosim.IOPump] = []
        self.refuse = False
        self.connections: list[tuple[RedisConnection, FakeRedisProtocol]] = []

    def connect(self, on_message: Callable[[bytes, bytes], None] | None = None) -> defer.Deferred[RedisConnection]:
        if self.refuse:
            return defer.fail(ConnectionRefusedError("fake Redis is down"))
        client = RedisConnection(on_message)
        server = FakeRedisProtocol(self.server)
        pump = iosim.connect(server, iosim.makeFakeServer(server), client, iosim.makeFakeClient(client), greet=False)
        self.pumps.append(pump)
        self.connections.append((client, server))
        return defer.succeed(client)

    def flush(self) -> None:
        """Move bytes until no connection has any to move."""
        for _ in range(1000):
            moved = False
            for pump in list(self.pumps):
                moved = pump.pump() or moved
            if not moved:
                return
        raise AssertionError("the connections never went quiet")

    def drop_all(self) -> None:
        """Redis goes away: every connection is cut."""
        for _client, server in self.connections:
            server.transport.loseConnection()
        self.connections = []
        self.flush()
        self.pumps = []
