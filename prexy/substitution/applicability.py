"""Rule-applicability memory: which rules can match one version of a resource.

Most responses of a site are the same files served again, and with many
rules most rules match nothing in a given file.  After a body was rewritten
to its end with every rule tried, the rules that matched are remembered for
that exact *version* of the resource; the next response of that version
runs only those rules (``Transducer(ruleset, only=...)``), and a version
no rule matches is passed through without scanning (its Content-Length can
be kept).  The output is the same: a rule that never made a match in the
body cannot change what the other rules do with the same bytes.

A version is named by :class:`ResourceKey`: site, URL, the upstream
validator (strong or weak ETag, Last-Modified, and the body length when
known) and optionally the request headers the response varies on.  A
response without ETag or Last-Modified has no version and is never
remembered: a changed file must never be judged by its old content.  Each
entry also carries the rule set's digest, so a new rule set forgets it.

Memory is bounded: an LRU of entries, each a 16-byte hash of the key and
digest plus a bitmask of rule indexes, charged what it takes in memory
(:data:`ENTRY` and the mask's size), up to ``max_bytes`` (``[server]
applicability_memory``).  Pure: no I/O, no Twisted.  Typical use in the proxy::

    key = ResourceKey.of(site, url, etag=..., last_modified=..., length=...)
    only = memory.rules_for(ruleset, key)       # None: run every rule
    t = Transducer(ruleset, only=only)
    ...feed, finish...
    memory.record(ruleset, key, t)              # after finish(), always
"""

from __future__ import annotations

import hashlib
import sys
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prexy.substitution.ruleset import RuleSet
    from prexy.substitution.transducer import Transducer

__all__ = ["DEFAULT_BYTES", "ENTRY", "ApplicabilityMemory", "ResourceKey"]

#: Bytes of one entry beside its mask: the ordered map's slot and node and
#: the 16-byte name (measured with tracemalloc on CPython 3.11: about 150).
ENTRY = 160
#: The default budget: about 50,000 versions with a few rules each.
DEFAULT_BYTES = 8 * 1024 * 1024


class ResourceKey:
    """One version of one resource of one site.

    Build it with :meth:`of` (text) or :meth:`of_bytes` (header bytes as
    received), which return None when the response has no validator (then
    nothing may be remembered about it).  Two keys are equal when every
    part is; the parts are kept only as one framed byte string, which is
    what :meth:`hashed` digests.
    """

    __slots__ = ("_framed", "_digest", "_name")

    def __init__(self, framed: bytes) -> None:
        self._framed = framed
        self._digest: str | None = None
        self._name = b""

    @classmethod
    def of(
        cls,
        site: str,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        length: int | None = None,
        variant: str = "",
    ) -> ResourceKey | None:
        """The key of a response, or None without ETag and Last-Modified.

        ``length`` is the body length when the upstream sent one (a file
        rewritten within the same second keeps its Last-Modified but
        usually not its length); ``variant`` holds the values of the request
        headers the response varies on (its ``Vary``), if any.
        """
        def raw(text: str | None) -> bytes | None:
            return None if text is None else text.encode("utf-8", "surrogateescape")

        return cls.of_bytes(
            raw(site) or b"", raw(url) or b"", etag=raw(etag), last_modified=raw(last_modified),
            length=length, variant=raw(variant) or b"",
        )

    @classmethod
    def of_bytes(
        cls,
        site: bytes,
        url: bytes,
        *,
        etag: bytes | None = None,
        last_modified: bytes | None = None,
        length: int | None = None,
        variant: bytes = b"",
    ) -> ResourceKey | None:
        """:meth:`of` for parts given as bytes (what the proxy has)."""
        if not etag and not last_modified:
            return None
        etag = etag or b""
        last_modified = last_modified or b""
        size = b"" if length is None else b"%d" % length
        # Each part with its length in front: no two keys give the same bytes.
        return cls(
            b"%d:%s%d:%s%d:%s%d:%s%d:%s%d:%s" % (
                len(site), site, len(url), url, len(etag), etag,
                len(last_modified), last_modified, len(size), size, len(variant), variant,
            )
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResourceKey):
            return NotImplemented
        return self._framed == other._framed

    def __hash__(self) -> int:
        return hash(self._framed)

    def __repr__(self) -> str:
        return f"ResourceKey({self._framed!r})"

    def hashed(self, digest: str) -> bytes:
        """16 bytes naming this version under the rule set ``digest``
        (remembered for the last digest: a response asks twice, lookup and
        record)."""
        if digest == self._digest:
            return self._name
        name = hashlib.blake2b(self._framed + digest.encode(), digest_size=16).digest()
        self._digest, self._name = digest, name
        return name


class ApplicabilityMemory:
    """An LRU of resource versions and the rules that can match them, up
    to ``max_bytes`` of memory (and ``max_entries`` entries, when given).

    ``hits``, ``misses`` and ``recorded`` count lookups that found an
    entry, lookups that did not, and bodies remembered; ``used`` is the
    bytes the entries take.
    """

    def __init__(self, max_entries: int | None = None, max_bytes: int = DEFAULT_BYTES) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if max_bytes < 0:
            raise ValueError("max_bytes must be 0 or more")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.used = 0
        self._entries: OrderedDict[bytes, int] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.recorded = 0

    def __len__(self) -> int:
        return len(self._entries)

    def rules_for(self, ruleset: RuleSet, key: ResourceKey | None) -> frozenset[int] | None:
        """The rules to run for ``key``: None (unknown: run all) or a set.

        An empty set means no rule can match this version: pass it through.
        """
        if key is None:
            return None
        name = key.hashed(ruleset.digest)
        mask = self._entries.get(name)
        if mask is None:
            self.misses += 1
            return None
        self._entries.move_to_end(name)
        self.hits += 1
        return _indexes(mask)

    def record(self, ruleset: RuleSet, key: ResourceKey | None, transducer: Transducer) -> bool:
        """Remember what ``transducer`` learnt about ``key``; True if it did.

        Only a body scanned to its end counts: ``finish()`` was called, and
        neither the buffer limit nor a time limit stopped substitution.
        Rules the transducer did not run (``only=``) stay possible.
        """
        if key is None or not transducer.finished:
            return False
        if transducer.bailed_out or transducer.timed_out:
            return False
        everything = (1 << len(ruleset.rules)) - 1
        active = transducer.active_rules
        # All rules run (the common case): nothing untried, and no mask of
        # 1000 indexes to build (60 us with 1000 rules).
        untried = 0 if len(active) == len(ruleset.rules) else everything & ~_mask(active)
        self._store(key.hashed(ruleset.digest), _mask(transducer.rules_matched) | untried)
        return True

    def remember(self, ruleset: RuleSet, key: ResourceKey, may_match: Iterable[int]) -> None:
        """Record that only ``may_match`` rules can match version ``key``.

        What is already known of the same version is kept too (both hold,
        so only rules in both can match).
        """
        self._store(key.hashed(ruleset.digest), _mask(may_match))

    def _store(self, name: bytes, mask: int) -> None:
        entries = self._entries
        known = entries.get(name)
        if known is not None:
            mask &= known
            self.used -= _size(known)
            entries.move_to_end(name)
        size = _size(mask)
        if size > self.max_bytes:
            entries.pop(name, None)
            return
        entries[name] = mask
        self.used += size
        limit = self.max_entries
        while self.used > self.max_bytes or (limit is not None and len(entries) > limit):
            self.used -= _size(entries.popitem(last=False)[1])
        self.recorded += 1

    def resize(self, max_bytes: int) -> None:
        """Take ``max_bytes`` from now on (a reload may change it): the
        least recently used versions go until the rest fits."""
        if max_bytes < 0:
            raise ValueError("max_bytes must be 0 or more")
        self.max_bytes = max_bytes
        entries = self._entries
        while self.used > max_bytes:
            self.used -= _size(entries.popitem(last=False)[1])

    def forget(self, ruleset: RuleSet, key: ResourceKey) -> None:
        """Drop what is known of version ``key`` (e.g. after a scan error)."""
        mask = self._entries.pop(key.hashed(ruleset.digest), None)
        if mask is not None:
            self.used -= _size(mask)

    def clear(self) -> None:
        """Forget everything (e.g. on reload)."""
        self._entries.clear()
        self.used = 0


def _size(mask: int) -> int:
    """The bytes an entry with ``mask`` takes (the int's own size: 28 bytes
    up to 30 rules, 4 more for each 30 after)."""
    return ENTRY + sys.getsizeof(mask)


def _mask(indexes: Iterable[int]) -> int:
    mask = 0
    for i in indexes:
        mask |= 1 << i
    return mask


def _indexes(mask: int) -> frozenset[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return frozenset(out)
