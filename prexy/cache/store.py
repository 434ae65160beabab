"""The shared object store: one LMDB environment per machine, used by every
worker process at once, bounded in bytes with (approximate) LRU eviction.

Why LMDB and how it compares with the alternatives is written in the
package docstring (``prexy/cache/__init__.py``).  This module imports no
Twisted; every call is synchronous and short (a hit is a read-only
transaction on a memory map: no system call, no lock), so the proxy calls it
straight from the reactor thread.

Layout of the environment (a directory, e.g. ``/dev/shm/prexy-cache``):

``obj``
    object key (32 bytes, see :func:`prexy.cache.policy.cache_key`) ->
    ``u32 meta length | marshal(meta tuple) | body``.
``vary``
    primary key (16 bytes: site + URL) -> marshal(tuple of lower-case header
    names) of the last response stored for that URL, so a lookup knows which
    request headers pick the variant.
``idx``
    object key -> ``u64 tick | u64 size | f64 dead_at | f64 touched_at |
    site NUL url``: what eviction, expiry sweeps and bans need without
    reading the body.
``lru``
    ``u64 tick (big-endian) | object key`` -> empty: the recency order;
    eviction deletes from the front.
``meta``
    ``tick`` (a counter bumped on every store and touch) and ``format``.
``busy``
    object key -> ``f64 expires | holder``: fetch leases (:meth:`Store.claim`).

LRU is approximate so that a hit stays a read-only transaction: like
Varnish's ``lru_interval``, a hit moves its object to the back of the queue
(one short write transaction) only when it was last moved more than
``touch_interval`` seconds ago (default 2 s).  An object hit at least that
often is never the next victim; one that is not drifts to the front.

``max_bytes`` bounds the pages the data really occupies (LMDB's own page
counts of every table, read in O(1) inside the write transaction), not an
estimate of payload bytes: a 12-byte object with its head and index entries
costs about 1 KB of pages (random keys leave leaf pages a third full under
churn), a 20 KB one six 4 KiB pages.  Each store evicts from the LRU front
before writing (by an estimate of the new object's pages) and again after,
so every committed state is within the bound.  The free list (pages freed
but possibly still seen by a reader) comes on top; ``stats()["map_used"]``
is the high-water mark.  The map is sized ``2 * max_bytes + 64 MiB``
(virtual; on tmpfs only touched pages cost memory) so that pages held by
long readers never make a commit fail; if one does, the store evicts down to
half and retries once.

Every process must call :meth:`Store.open` itself, after forking: an LMDB
environment must not cross a ``fork()``.
"""

from __future__ import annotations

import functools
import marshal
import os
import struct
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import attrs
import lmdb
from zope.interface import Attribute, Interface, implementer

from prexy.cache.bans import Ban
from prexy.cache.memo import Memo, object_size
from prexy.cache.policy import CachePolicy, FieldTable, primary_key, variant_part, vary_key

__all__ = ["CachedObject", "ICacheStore", "LookupResult", "ObjectMeta", "Store", "StoreError", "Writer"]

#: Changes when the record layout or the marshal version changes; a store
#: written in another format is emptied on open.
FORMAT = b"prexy-cache/1 marshal/%d py/%d.%d" % (marshal.version, *sys.version_info[:2])

_PAGE = 4096
_OVERFLOW = 2000  # values above this go to overflow pages (LMDB: ~pagesize/2)
#: Per object: idx and lru entries, leaf nodes and B-tree slack (measured:
#: with random keys and constant churn, leaf pages run about a third full).
_INDEX_OVERHEAD = 800
_IDX = struct.Struct("<QQdd")
#: Bytes of decoded objects a process keeps (``Store._decoded``) when
#: it is given no part of a shared budget (``prexy.cache.memo.Memos``).
DECODED_BUDGET = 32 * 1024 * 1024
#: A decoded object's entry beside the object: its version (32 bytes and
#: a bytes header) and the (version, object) pair.
_VERSIONED = 128
_TICK = struct.Struct(">Q")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_BATCH = 1000


@attrs.frozen
class ObjectMeta:
    """Everything about a cached response except its body.

    Times are wall-clock seconds (``reactor.seconds()``), the same in every
    process.  ``stored_at`` is when the response was generated (now minus
    the upstream's ``Age``), so ``age(now)`` is what the ``Age`` header says.
    """

    status: int
    #: (name, value) pairs as they go to the client (a list is fine too).
    headers: Sequence[tuple[bytes, bytes]] = ()
    stored_at: float = 0.0
    ttl: float = 0.0
    grace: float = 0.0
    keep: float = 0.0
    stale_if_error: float = 0.0
    #: Site name and URL (as given to ``cache_key``): for bans and debugging.
    site: str = ""
    url: bytes = b""
    #: Lower-case names of the headers the response varies on (``vary_names``).
    vary: tuple[bytes, ...] = ()
    #: Reason phrase, b"" for the default one.
    phrase: bytes = b""
    #: A hit-for-miss marker: no body; lookups that find it go straight
    #: upstream without coalescing, until it expires.
    hit_for_miss: bool = False

    def header(self, lname: bytes) -> bytes | None:
        """The first value of a header, by lower-case name (e.g. ``b"etag"``)."""
        for name, value in self.headers:
            if name.lower() == lname:
                return value
        return None

    def age(self, now: float) -> float:
        """Seconds since the response was generated (>= 0)."""
        return max(0.0, now - self.stored_at)

    def remaining(self, now: float) -> float:
        """Freshness left in seconds; negative once stale (RFC 9211 ``ttl``)."""
        return self.stored_at + self.ttl - now

    def fresh(self, now: float) -> bool:
        return now < self.stored_at + self.ttl

    def in_grace(self, now: float) -> bool:
        """Stale but may be served while one background fetch refreshes it."""
        return self.stored_at + self.ttl <= now < self.stored_at + self.ttl + self.grace

    def stale_usable_on_error(self, now: float) -> bool:
        """May be served instead of an error when upstream fails."""
        window = max(self.grace, self.stale_if_error)
        return now < self.stored_at + self.ttl + window

    def dead_at(self) -> float:
        """After this, nothing may use the object (not even to revalidate)."""
        return self.stored_at + self.ttl + max(self.grace, self.stale_if_error) + self.keep

    def _pack(self) -> bytes:
        return marshal.dumps(
            (
                self.status, tuple((bytes(n), bytes(v)) for n, v in self.headers), self.stored_at, self.ttl, self.grace, self.keep,
                self.stale_if_error, self.site, self.url, self.vary, self.phrase, self.hit_for_miss,
            )
        )


@attrs.frozen
class CachedObject(ObjectMeta):
    """A stored response: its meta data, its body and its accounted size."""

    body: bytes = b""
    #: Bytes charged against ``max_bytes`` (pages, not just payload).
    size: int = 0


@attrs.frozen
class LookupResult:
    """What :meth:`Store.lookup` found.

    ``primary`` (16 bytes) names the URL whatever its variants: the natural
    key to coalesce concurrent misses on.  ``key`` is the variant the request
    selects given the ``Vary`` of the last response stored for the URL (no
    vary when none is known).  ``obj`` is ``None`` on a miss;
    ``url_known`` tells a variant miss (``fwd=vary-miss``) from a URL never
    seen (``fwd=uri-miss``).
    """

    primary: bytes
    key: bytes
    obj: CachedObject | None
    url_known: bool


def footprint(key_len: int, record_len: int) -> int:
    """Bytes charged for one object: what it costs in LMDB pages."""
    if record_len > _OVERFLOW:
        pages = (record_len + 16 + _PAGE - 1) // _PAGE
        return pages * _PAGE + key_len + _INDEX_OVERHEAD
    # A leaf node (8-byte header) in pages about a third full.
    return (key_len + record_len + 8) * 3 + _INDEX_OVERHEAD // 2


def _decode(key: bytes, record: Any, size: int) -> CachedObject:
    (meta_len,) = _U32.unpack_from(record, 0)
    (status, headers, stored_at, ttl, grace, keep, sie, site, url, vary, phrase, hfm) = marshal.loads(
        record[4 : 4 + meta_len]
    )
    return CachedObject(
        status, headers, stored_at, ttl, grace, keep, sie, site, url, vary, phrase, hfm,
        bytes(record[4 + meta_len :]), size,
    )


class StoreError(Exception):
    """The store cannot be opened (a bad path, no permission, no space)."""


_T = TypeVar("_T")
_P = ParamSpec("_P")


def _adopts_resize(method: Callable[Concatenate[Store, _P], _T]) -> Callable[Concatenate[Store, _P], _T]:
    """Retries once after adopting a map another process made larger (a
    worker started with a bigger ``max_bytes`` after a reload)."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(self, *args, **kwargs)
        except lmdb.MapResizedError:
            self._env.set_mapsize(0)
            return method(self, *args, **kwargs)

    return wrapper


class Writer:
    """Collects one response body as it streams, then stores it in one
    transaction at :meth:`commit`.

    ``write`` returns ``False`` (and drops what it held) once the body
    exceeds the size limit; the caller streams on without storing, and
    ``commit`` then stores nothing and returns ``False``.  Nothing is visible
    to readers before ``commit``.  A writer that is neither committed nor
    aborted simply stores nothing.

    The body waits in this process's memory (at most ``limit`` bytes) until
    ``commit``, on purpose: an LMDB write transaction locks out every other
    writer on the machine, so none may stay open across reactor turns while
    a slow upstream trickles in.
    """

    def __init__(self, store: Store, key: bytes, meta: ObjectMeta, limit: int) -> None:
        self._store = store
        self._key = key
        self._meta = meta
        self._limit = limit
        self._chunks: list[bytes] = []
        self._length = 0
        self.refused = False
        self.closed = False

    @property
    def length(self) -> int:
        """Body bytes received so far."""
        return self._length

    def write(self, chunk: bytes) -> bool:
        """Adds ``chunk``; ``False`` when the object is (now) too large or closed."""
        if self.refused or self.closed:
            return False
        self._length += len(chunk)
        if self._length > self._limit:
            self.refused = True
            self._chunks = []
            return False
        if chunk:
            self._chunks.append(bytes(chunk))
        return True

    def commit(self) -> bool:
        """Stores the object; ``True`` when it was stored."""
        if self.refused or self.closed:
            self.closed = True
            return False
        self.closed = True
        body = b"".join(self._chunks)
        self._chunks = []
        return self._store._store(self._key, self._meta, body)

    def abort(self) -> None:
        """Forgets the body (upstream failed, client aborted...)."""
        self.closed = True
        self._chunks = []


class ICacheStore(Interface):
    """The store as the proxy's cache layer (``prexy.proxy.caching``) uses
    it: lookups, streamed and bodiless writes, fetch leases and purges.
    Lifecycle, bans, expiry and statistics are :class:`Store`'s own."""

    evicted = Attribute("int: objects this process evicted to make room (for ``/metrics``).")

    def lookup(
        site: str,
        method_class: bytes,
        url: bytes,
        ruleset_version: str | bytes,
        request_headers: Iterable[tuple[bytes, bytes]] | FieldTable,
        policy: CachePolicy | None = None,
    ) -> LookupResult:
        """The variant a request selects (see :meth:`Store.lookup`)."""

    def get(key: bytes) -> CachedObject | None:
        """The object stored under ``key`` (stale ones too, until dead)."""

    def writer(key: bytes, meta: ObjectMeta, limit: int | None = None) -> Writer:
        """A :class:`Writer` for a response streaming in."""

    def put(key: bytes, meta: ObjectMeta, body: bytes = b"") -> bool:
        """Stores a whole object at once; ``False`` when it is too large."""

    def put_hit_for_miss(key: bytes, meta: ObjectMeta) -> bool:
        """Stores a bodiless hit-for-miss marker built from ``meta``."""

    def refresh(key: bytes, meta: ObjectMeta) -> bool:
        """Replaces the meta data of a stored object, keeping its body."""

    def claim(key: bytes, holder: bytes, lease: float) -> bool:
        """Takes the right to fetch ``key`` for ``lease`` seconds."""

    def release(key: bytes, holder: bytes) -> None:
        """Gives up a lease taken with :meth:`claim`."""

    def claimed(key: bytes) -> bool:
        """Whether someone holds a running lease on ``key``."""

    def purge_url(site: str, url: bytes) -> int:
        """Removes every variant of one URL; how many objects went."""


@implementer(ICacheStore)
class Store:
    """The machine-wide cache.  Open one per process with :meth:`open`."""

    def __init__(
        self,
        env: lmdb.Environment,
        path: str,
        max_bytes: int,
        max_object_size: int,
        clock: Callable[[], float],
        touch_interval: float,
        memo: Memo[bytes, tuple[bytes, CachedObject]] | None = None,
    ) -> None:
        self._env = env
        self.path = path
        self.max_bytes = max_bytes
        self.max_object_size = max_object_size
        self._clock = clock
        self.touch_interval = touch_interval
        self._obj = env.open_db(b"obj")
        self._vary = env.open_db(b"vary")
        self._idx = env.open_db(b"idx")
        self._lru = env.open_db(b"lru")
        self._meta = env.open_db(b"meta")
        self._busy = env.open_db(b"busy")
        #: The objects this process decoded last, by key, with the index
        #: entry they were read under (``_get``): a hit on one of them
        #: reads 32 bytes of the store instead of decoding and copying the
        #: object again.  A part of the worker's memo budget
        #: (``[cache] memo_size``), or a budget of its own.
        self._decoded: Memo[bytes, tuple[bytes, CachedObject]] = (
            memo if memo is not None else Memo(DECODED_BUDGET, "objects")
        )
        #: Objects this process evicted to make room (for ``/metrics``).
        self.evicted = 0

    # -- lifecycle ---------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str,
        max_bytes: int,
        max_object_size: int | None = None,
        clock: Callable[[], float] = time.time,
        touch_interval: float = 2.0,
        memo: Memo[bytes, tuple[bytes, CachedObject]] | None = None,
    ) -> Store:
        """Opens (creating if needed) the store in directory ``path``.

        ``max_object_size`` (default and ceiling ``max_bytes // 4``) caps what
        a writer accepts.  ``clock`` gives wall-clock seconds, the same in
        every process (pass ``reactor.seconds``); it decides when an object is
        dead and when a hit refreshes its LRU position (at most once per
        ``touch_interval`` seconds).  A store left in another format is
        emptied; one holding more than ``max_bytes`` is evicted down to it.
        ``memo``: where the objects decoded last are kept (a part of the
        process's memo budget); by default a budget of its own.  Raises
        :class:`StoreError` when the directory cannot be used.
        """
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        try:
            os.makedirs(path, exist_ok=True)
            env = lmdb.open(
                path,
                map_size=2 * max_bytes + 64 * 1024 * 1024,
                max_dbs=8,
                max_readers=512,
                sync=False,
                metasync=False,
                readahead=False,
                meminit=False,
                lock=True,
            )
        except (OSError, lmdb.Error) as exc:
            raise StoreError(f"cannot open the cache store in {path}: {exc}") from exc
        env.reader_check()  # slots left by crashed processes
        limit = max_bytes // 4 if max_object_size is None else min(max_object_size, max_bytes // 4)
        store = cls(env, path, max_bytes, limit, clock, touch_interval, memo)
        with env.begin(write=True) as txn:
            if txn.get(b"format", db=store._meta) != FORMAT:
                for db in (store._obj, store._vary, store._idx, store._lru, store._meta, store._busy):
                    txn.drop(db, delete=False)
                txn.put(b"format", FORMAT, db=store._meta)
            store._evict(txn, 0)
        return store

    def close(self) -> None:
        self._env.close()

    # -- reads -------------------------------------------------------------------

    @_adopts_resize
    def get(self, key: bytes) -> CachedObject | None:
        """The object stored under ``key``, or ``None``.

        Stale objects are returned (for grace, stale-if-error and
        revalidation: check ``obj.fresh(now)``) until they are past their
        :meth:`~ObjectMeta.dead_at`.
        """
        with self._env.begin(buffers=True) as txn:
            obj, touch = self._get(txn, key)
        if touch:
            self._touch(key)
        return obj

    @_adopts_resize
    def lookup(
        self,
        site: str,
        method_class: bytes,
        url: bytes,
        ruleset_version: str | bytes,
        request_headers: Iterable[tuple[bytes, bytes]] | FieldTable,
        policy: CachePolicy | None = None,
    ) -> LookupResult:
        """Finds the variant a request selects, in one read transaction.

        Reads the URL's recorded ``Vary`` names, computes the variant key with
        :func:`~prexy.cache.policy.vary_key` and fetches it.  On a miss, store
        the response under ``cache_key(..., vary_key(response Vary, request
        headers), ...)``, which may differ from ``result.key`` when the URL's
        ``Vary`` changed or was unknown.  ``policy`` (when given) drops the
        cookies it ignores from a ``Cookie`` the response varies on.
        """
        primary = primary_key(site, url)
        with self._env.begin(buffers=True) as txn:
            raw = txn.get(primary, db=self._vary)
            names: tuple[bytes, ...] = marshal.loads(raw) if raw is not None else ()
            key = primary + variant_part(method_class, vary_key(names, request_headers, policy), ruleset_version)
            obj, touch = self._get(txn, key)
        if touch:
            self._touch(key)
        return LookupResult(primary, key, obj, raw is not None)

    def _get(self, txn: lmdb.Transaction, key: bytes) -> tuple[CachedObject | None, bool]:
        info = txn.get(key, db=self._idx)
        if info is None:
            return None, False
        _, size, dead_at, touched_at = _IDX.unpack_from(info, 0)
        now = self._clock()
        if now >= dead_at:
            return None, False
        # The index entry's tick is new at every write and touch of the
        # key, in any process: the same entry means the same object.
        version = bytes(info[: _IDX.size])
        known = self._decoded.get(key)
        if known is not None and known[0] == version:
            obj = known[1]
        else:
            record = txn.get(key, db=self._obj)
            if record is None:
                return None, False
            obj = _decode(key, record, size)
            self._decoded.put(key, (version, obj), _VERSIONED + object_size(obj))
        return obj, now - touched_at > self.touch_interval

    def _touch(self, key: bytes) -> None:
        with self._env.begin(write=True) as txn:
            info = txn.get(key, db=self._idx)
            if info is None:
                return
            tick, size, dead_at, _ = _IDX.unpack_from(info, 0)
            txn.delete(_TICK.pack(tick) + key, db=self._lru)
            new = self._next_tick(txn)
            txn.put(_TICK.pack(new) + key, b"", db=self._lru)
            txn.put(key, _IDX.pack(new, size, dead_at, self._clock()) + info[_IDX.size :], db=self._idx)

    # -- writes ------------------------------------------------------------------

    def writer(self, key: bytes, meta: ObjectMeta, limit: int | None = None) -> Writer:
        """A :class:`Writer` for a response streaming in; ``limit`` (bytes of
        body, default and ceiling the store's ``max_object_size``)."""
        cap = self.max_object_size if limit is None else min(limit, self.max_object_size)
        return Writer(self, key, meta, cap)

    def put(self, key: bytes, meta: ObjectMeta, body: bytes = b"") -> bool:
        """Stores a whole object at once; ``False`` when it is too large."""
        w = self.writer(key, meta)
        w.write(body)
        return w.commit()

    def put_hit_for_miss(self, key: bytes, meta: ObjectMeta) -> bool:
        """Stores a bodiless hit-for-miss marker built from ``meta`` (whose
        ``ttl`` is the hit-for-miss TTL)."""
        return self.put(key, attrs.evolve(meta, hit_for_miss=True, grace=0.0, keep=0.0, stale_if_error=0.0))

    @_adopts_resize
    def refresh(self, key: bytes, meta: ObjectMeta) -> bool:
        """Replaces the meta data of a stored object, keeping its body (after a
        304 from upstream revalidated it).  ``False`` when it is gone."""
        with self._env.begin(buffers=True) as txn:
            record = txn.get(key, db=self._obj)
            if record is None:
                return False
            (meta_len,) = _U32.unpack_from(record, 0)
            body = bytes(record[4 + meta_len :])
        return self._store(key, meta, body)

    @_adopts_resize
    def _store(self, key: bytes, meta: ObjectMeta, body: bytes) -> bool:
        packed = meta._pack()
        record = _U32.pack(len(packed)) + packed + body
        site_url = meta.site.encode("utf-8") + b"\0" + meta.url
        size = footprint(len(key), len(record)) + len(site_url)
        if size > self.max_bytes:
            return False
        primary = key[:16]
        vary = marshal.dumps(tuple(meta.vary))
        for attempt in (0, 1):
            try:
                with self._env.begin(write=True) as txn:
                    self._delete(txn, key)
                    self._evict(txn, size if attempt == 0 else size + self.max_bytes // 2)
                    tick = self._next_tick(txn)
                    txn.put(key, record, db=self._obj)
                    txn.put(key, _IDX.pack(tick, size, meta.dead_at(), self._clock()) + site_url, db=self._idx)
                    txn.put(_TICK.pack(tick) + key, b"", db=self._lru)
                    txn.put(primary, vary, db=self._vary)
                    self._evict(txn, 0, keep=key)
                return True
            except lmdb.MapFullError:
                continue
        return False

    # -- fetch leases: coalescing misses across worker processes -----------------

    @_adopts_resize
    def claim(self, key: bytes, holder: bytes, lease: float) -> bool:
        """Takes the right to fetch ``key`` from upstream for ``lease``
        seconds; ``False`` while another holder's lease runs.

        Coalescing inside one worker needs no store; across workers, the
        worker whose ``claim`` succeeds fetches and stores, and the others
        (``claim`` false) poll :meth:`get` every few tens of milliseconds
        until the object appears, the lease is released or it runs out
        (:meth:`claimed` false), then fetch themselves.  ``holder`` names
        the claimant (e.g. ``b"%d" % os.getpid()``); a lease outlives a
        worker that died holding it by at most ``lease`` seconds.
        """
        now = self._clock()
        with self._env.begin(write=True) as txn:
            raw = txn.get(key, db=self._busy)
            if raw is not None:
                (expires,) = _F64.unpack_from(raw, 0)
                if expires > now and raw[_F64.size :] != holder:
                    return False
            txn.put(key, _F64.pack(now + lease) + holder, db=self._busy)
        return True

    @_adopts_resize
    def release(self, key: bytes, holder: bytes) -> None:
        """Gives up a lease taken with :meth:`claim` (after commit or abort)."""
        with self._env.begin(write=True) as txn:
            raw = txn.get(key, db=self._busy)
            if raw is not None and raw[_F64.size :] == holder:
                txn.delete(key, db=self._busy)

    @_adopts_resize
    def claimed(self, key: bytes) -> bool:
        """Whether someone holds a running lease on ``key`` (a read, no lock)."""
        with self._env.begin(buffers=True) as txn:
            raw = txn.get(key, db=self._busy)
            return raw is not None and _F64.unpack_from(raw, 0)[0] > self._clock()

    @_adopts_resize
    def delete(self, key: bytes) -> bool:
        """Removes one object; ``True`` when there was one."""
        with self._env.begin(write=True) as txn:
            return self._delete(txn, key)

    @_adopts_resize
    def purge_url(self, site: str, url: bytes) -> int:
        """Removes every variant (every method class and rule-set version) of
        one URL, and its recorded ``Vary``; returns how many objects went."""
        primary = primary_key(site, url)
        with self._env.begin(write=True) as txn:
            keys = []
            cursor = txn.cursor(db=self._obj)
            if cursor.set_range(primary):
                for k in cursor.iternext(keys=True, values=False):
                    if not bytes(k).startswith(primary):
                        break
                    keys.append(bytes(k))
            for k in keys:
                self._delete(txn, k)
            txn.delete(primary, db=self._vary)
        return len(keys)

    @_adopts_resize
    def ban(self, ban: Ban) -> int:
        """Removes now every object that ``ban`` matches (of ``ban.site``,
        or of any site when that is None); returns how many.

        Immediate scan-and-delete, not a ban list: the index is scanned in a
        read transaction (writers are not blocked), then matches are deleted
        in batches of 1000.  Cost grows with the number of objects (measured:
        see the package docstring).  A response whose fetch started before
        the ban and is committed after it is not banned.
        """
        wanted = None if ban.site is None else ban.site.encode("utf-8")
        matches = ban.matches
        victims = []
        with self._env.begin(buffers=True) as txn:
            for k, v in txn.cursor(db=self._idx):
                site_url = bytes(v[_IDX.size :])
                s, _, url = site_url.partition(b"\0")
                if wanted is not None and s != wanted:
                    continue
                if matches(url):
                    victims.append(bytes(k))
        return self._delete_many(victims)

    @_adopts_resize
    def expire(self) -> int:
        """Removes every object past its ``dead_at`` (and leases that ran out
        unreleased); returns how many objects.  Optional housekeeping:
        ``get`` never returns dead objects and LRU evicts them in time anyway."""
        now = self._clock()
        victims = []
        leases = []
        with self._env.begin(buffers=True) as txn:
            for k, v in txn.cursor(db=self._idx):
                if _IDX.unpack_from(v, 0)[2] <= now:
                    victims.append(bytes(k))
            for k, v in txn.cursor(db=self._busy):
                if _F64.unpack_from(v, 0)[0] <= now:
                    leases.append(bytes(k))
        if leases:
            with self._env.begin(write=True) as wtxn:
                for lease in leases:
                    wtxn.delete(lease, db=self._busy)
        return self._delete_many(victims)

    @_adopts_resize
    def clear(self) -> None:
        """Empties the store."""
        with self._env.begin(write=True) as txn:
            for db in (self._obj, self._vary, self._idx, self._lru, self._busy):
                txn.drop(db, delete=False)

    @_adopts_resize
    def stats(self) -> dict[str, int]:
        """``bytes`` (pages in use, what ``max_bytes`` bounds), ``count``
        (objects), ``max_bytes``, ``map_used`` (bytes of the map ever
        touched: the high-water mark, free pages included)."""
        with self._env.begin() as txn:
            used = self._used(txn)
            count = txn.stat(self._obj)["entries"]
        info = self._env.info()
        return {
            "bytes": used,
            "count": count,
            "max_bytes": self.max_bytes,
            "map_used": (info["last_pgno"] + 1) * self._env.stat()["psize"],
        }

    # -- internals (inside a write transaction) -----------------------------------

    def _delete_many(self, keys: list[bytes]) -> int:
        done = 0
        for i in range(0, len(keys), _BATCH):
            with self._env.begin(write=True) as txn:
                for k in keys[i : i + _BATCH]:
                    done += self._delete(txn, k)
        return done

    def _delete(self, txn: lmdb.Transaction, key: bytes) -> bool:
        info = txn.get(key, db=self._idx)
        if info is None:
            return bool(txn.delete(key, db=self._obj))
        tick = _IDX.unpack_from(info, 0)[0]
        txn.delete(key, db=self._obj)
        txn.delete(key, db=self._idx)
        txn.delete(_TICK.pack(tick) + key, db=self._lru)
        # The URL's Vary record goes with its last object.
        primary = key[:16]
        cursor = txn.cursor(db=self._obj)
        if not (cursor.set_range(primary) and bytes(cursor.key()).startswith(primary)):
            txn.delete(primary, db=self._vary)
        return True

    def _used(self, txn: lmdb.Transaction) -> int:
        """Bytes of the pages the data really occupies now (not the free list)."""
        pages = 0
        for db in (self._obj, self._vary, self._idx, self._lru, self._meta):
            st = txn.stat(db)
            pages += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
        return pages * _PAGE

    def _evict(self, txn: lmdb.Transaction, incoming: int, keep: bytes | None = None) -> None:
        """Deletes least recently used objects until ``incoming`` more bytes fit
        (never ``keep``, the object just stored)."""
        limit = self.max_bytes - incoming
        if self._used(txn) <= limit:
            return
        cursor = txn.cursor(db=self._lru)
        while self._used(txn) > limit:
            if not cursor.first():
                return
            key = bytes(cursor.key())[_TICK.size :]
            if key == keep:
                if not cursor.next():
                    return
                key = bytes(cursor.key())[_TICK.size :]
            self._delete(txn, key)
            self.evicted += 1

    def _next_tick(self, txn: lmdb.Transaction) -> int:
        raw = txn.get(b"tick", db=self._meta)
        tick = (_U64.unpack(raw)[0] if raw else 0) + 1
        txn.put(b"tick", _U64.pack(tick), db=self._meta)
        return tick
