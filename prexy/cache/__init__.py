"""Prexy's cache: the policy (what may be stored, under which key, for how
long: :mod:`prexy.cache.policy`, pure) and the machine-wide store shared by
every worker (:mod:`prexy.cache.store`, LMDB).  Nothing here imports Twisted.

How the proxy uses it
=====================

Per request (``raw`` is the request's headers as ``(name, value)`` pairs,
``now = reactor.seconds()``, one ``Store.open(path, max_bytes,
clock=reactor.seconds)`` per worker process, after it started)::

    d = request_decision(policy, request.method, target, raw)
    INVALIDATE -> store.purge_url(site, key_url(policy, host, target)), then forward.
    PASS       -> forward; never store the answer.
                  Cache-Status: cache_status_header(fwd="bypass", detail=d.reason)
    LOOKUP     -> url = key_url(policy, host, target)
                  found = store.lookup(site, d.method_class, url, rules_digest, raw, policy=policy)
                  obj = found.obj

    obj.hit_for_miss        -> forward at once, no coalescing, do not store
                               (fwd="miss", detail="hit-for-miss").
    obj.fresh(now)          -> hit: 304 when not_modified(raw, obj.header(b"etag"),
                               obj.header(b"last-modified")), else obj.status /
                               obj.headers / obj.body (HEAD: the head only);
                               Age: age_header(obj.stored_at, now),
                               Cache-Status: cache_status_header(hit=True, ttl=obj.remaining(now)).
    obj.in_grace(now)       -> serve it the same way (ttl is negative) and start
                               one background refresh for the key.
    otherwise (miss, or stale past grace) -> coalesce on ``found.key``; one
                               upstream request, with ``Accept-Encoding:
                               accept_encoding_bucket(...)`` instead of the
                               client's; if ``obj`` (stale) has validators, make it
                               conditional and on 304 ``store.refresh(key, meta)``;
                               if upstream fails and
                               ``obj.stale_usable_on_error(now)``, serve ``obj``.
                               fwd = "uri-miss" if not found.url_known else
                               "vary-miss" if no obj else "stale".

On the upstream head of a looked-up request::

    sd = response_decision(policy, status, upstream_headers, now, response.length)
    key = cache_key(site, d.method_class, url, vary_key(sd.vary, raw, policy), rules_digest)
    sd.store  -> w = store.writer(key, ObjectMeta(status, client_headers, sd.stored_at,
                     sd.ttl, sd.grace, sd.keep, sd.stale_if_error, site, url, sd.vary, phrase),
                     limit=policy.max_object_size)
                 w.write(chunk) with every chunk sent to the client (the rewritten,
                 possibly gzipped bytes: a hit costs no rules); w.commit() at the end,
                 w.abort() on any failure.  write() returning False means too large:
                 stream on, and store.put_hit_for_miss(key, meta with ttl=policy.hit_for_miss_ttl).
    else      -> store.put_hit_for_miss(key, ObjectMeta(status, (), now, sd.ttl,
                     site=site, url=url, vary=sd.vary))

Across workers, the miss leader takes ``store.claim(found.key, holder,
lease)`` first (released with ``store.release`` after commit or abort); a
worker whose claim fails polls ``store.get`` every few tens of milliseconds
while ``store.claimed(found.key)``, then serves the object or fetches
itself.  So 100 concurrent misses spread over 2 workers make 1 upstream
request; only the waiters in the leader's own worker are served as the body
streams in, the others once it is stored.

Coalescing on ``found.key`` groups requests that agree on the Vary
*known at lookup time* (none for a URL never seen): a waiter may share the
leader's stream only when ``vary_key(sd.vary, waiter_headers, policy)``
equals the leader's; the others look up again (and most then hit).

``client_headers`` are the headers sent to the client less what is per
response: hop-by-hop ones, ``Content-Length`` (the body gives it),
``Trailer``/``Server-Timing``, ``Age``, ``Cache-Status``.  A HEAD miss must
not store its (empty) body as the GET object: fetch GET upstream and send the
head only, or pass.  PURGE: ``store.purge_url(site, key_url(policy, host,
target))``; admin ban: ``store.ban(Ban(site, target=regex, host=host))``
(``prexy.cache.bans``: the regex on the path and query, as Varnish's
``req.url``).  Both are immediate and,
the store being shared, reach every worker at once.  A ban scans every object
(about 5 µs each): run a large one in a thread
(``deferToThread``), not on the reactor.

Why LMDB
========

``bench/bench_cache_store.py`` compares the three designs below (put and
get latency, hits per second and CPU per hit with two reader processes);
its figures are in bench/README.md.  CPU per hit is the steadier figure on
a shared machine.

* **LMDB (chosen).**  A hit is a read transaction on a shared memory map:
  no system call, no lock, no copy but the final ``bytes`` of the body; the
  lowest CPU per hit at both sizes (7 and 11 µs including decoding the head
  into a ``CachedObject``; the raw LMDB read is 1-2 µs).  Writes are ACID
  transactions serialised across processes by LMDB's robust mutex, so the
  object, its index entry, its LRU position and the byte bound change
  together, a worker killed mid-write leaves nothing half-done, and LRU
  eviction by real page counts is exact.  Puts cost more (40-60 µs: one
  write transaction over five tables) but happen once per miss.  The data
  outlives worker restarts and reloads; on /dev/shm there is no disk I/O.
* **File per object on /dev/shm.**  As fast for tiny hits (``open/read/
  close``), slower and costlier for 20 KB, and the numbers are a lower
  bound: LRU needs a write (``utime`` or an index update) per hit, byte
  accounting needs a shared index under ``flock`` on every put (counted
  in its put figures), eviction needs a scan or that index, and a crash
  between the file and the index leaves them disagreeing.
* **Cache process over a unix socket.**  Every hit is a round trip: 3-4x
  the latency, 2-3x the CPU (the body crosses the socket twice), one
  Python process caps the throughput of all workers, its p99 is in
  milliseconds when the machine is busy, and with a Twisted client each
  lookup also costs a reactor turn.  It is also one more process to
  supervise, and its cache dies with it.

**Dependency:** the PyPI package ``lmdb`` (a manylinux wheel that bundles
liblmdb) is a hard dependency of Prexy (``install_requires`` in
``setup.cfg``), but only :mod:`prexy.cache.store` imports it.  This package
re-exports the names of :mod:`prexy.cache.policy` and :mod:`prexy.cache.store`
lazily (each submodule is imported on first use of one of its names), so
importing ``prexy.cache`` or a pure submodule (``policy``, ``flow``,
``ranges``, ``codings``, ``bans``) loads no LMDB binding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prexy.lazy import exporter

if TYPE_CHECKING:
    from prexy.cache.policy import (
        Action,
        CachePolicy,
        RequestDecision,
        StoreAction,
        StoreDecision,
        accept_encoding_bucket,
        age_header,
        cache_key,
        cache_status_header,
        current_age,
        key_url,
        not_modified,
        primary_key,
        request_decision,
        response_decision,
        targeted_field_names,
        update_headers,
        vary_key,
        vary_names,
    )
    from prexy.cache.store import (
        CachedObject,
        ICacheStore,
        LookupResult,
        ObjectMeta,
        Store,
        StoreError,
        Writer,
    )

#: Each re-exported name -> the submodule that defines it.
_SOURCES = {
    **dict.fromkeys(
        (
            "Action",
            "CachePolicy",
            "RequestDecision",
            "StoreAction",
            "StoreDecision",
            "accept_encoding_bucket",
            "age_header",
            "cache_key",
            "cache_status_header",
            "current_age",
            "key_url",
            "not_modified",
            "primary_key",
            "request_decision",
            "response_decision",
            "targeted_field_names",
            "update_headers",
            "vary_key",
            "vary_names",
        ),
        "prexy.cache.policy",
    ),
    **dict.fromkeys(
        ("CachedObject", "ICacheStore", "LookupResult", "ObjectMeta", "Store", "StoreError", "Writer"),
        "prexy.cache.store",
    ),
}

__all__ = [
    "Action",
    "CachePolicy",
    "CachedObject",
    "ICacheStore",
    "LookupResult",
    "ObjectMeta",
    "RequestDecision",
    "Store",
    "StoreAction",
    "StoreDecision",
    "StoreError",
    "Writer",
    "accept_encoding_bucket",
    "age_header",
    "cache_key",
    "cache_status_header",
    "current_age",
    "key_url",
    "not_modified",
    "primary_key",
    "request_decision",
    "response_decision",
    "targeted_field_names",
    "update_headers",
    "vary_key",
    "vary_names",
]


#: A re-exported name, its submodule imported on first use (PEP 562).
__getattr__ = exporter(__name__, _SOURCES, globals())
