"""The rule-applicability memory never changes a response's bytes.

The central property: for any rules and body, once a full rewrite of the
body is recorded, running only the remembered rules on the same body (fed
whole, in pieces or byte by byte) gives exactly the full output, and an
empty remembered set means the body comes out unchanged.  Around it: only
complete scans are remembered, a response without a validator never is, a
new version or a new rule set starts from nothing, partial runs keep the
rules they did not try, and the LRU stays within its bound.
"""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution.applicability import ENTRY, ApplicabilityMemory, ResourceKey
from prexy.substitution.rules import compile_rule
from prexy.substitution.ruleset import RuleSet
from prexy.substitution.transducer import Transducer
from tests.substitution.test_prefilter import bodies, compile_all, specs

KEY = ResourceKey.of("site", "/page.html", etag='"abc"')


def full(ruleset: RuleSet, body: bytes, only: frozenset[int] | None = None) -> bytes:
    return Transducer(ruleset, timeout=None, only=only).finish(body)


def pieces(ruleset: RuleSet, parts: list[bytes], only: frozenset[int] | None) -> bytes:
    t = Transducer(ruleset, timeout=None, only=only)
    return b"".join(t.feed(p) for p in parts) + t.finish()


def two_rules() -> RuleSet:
    return RuleSet.build(
        [compile_rule(b"foo", b"F", b"g"), compile_rule(b"bar[0-9]+", b"B", b"g")],
        max_buffered_size=64,
    )


class ApplicabilityTests(SynchronousTestCase):
    @settings(max_examples=150, deadline=None)
    @given(specs, bodies, st.lists(st.integers(0, 60), max_size=6))
    def test_remembered_rules_give_the_same_output(
        self,
        rule_specs: list[tuple[str, str, str]], body: bytes, cuts: list[int]
    ) -> None:
        """Only the remembered rules, fed any way, give the full output."""
        ruleset = RuleSet.build(compile_all(rule_specs), max_buffered_size=10**9)
        memory = ApplicabilityMemory(8)
        assert memory.rules_for(ruleset, KEY) is None
        t = Transducer(ruleset, timeout=None)
        expected = t.finish(body)
        assert memory.record(ruleset, KEY, t)
        only = memory.rules_for(ruleset, KEY)
        assert only is not None
        assert only == frozenset(t.rules_matched)
        points = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
        ways = [
            [body],
            [body[i : i + 1] for i in range(len(body))],
            [body[a:b] for a, b in zip(points, points[1:], strict=False)],
        ]
        for parts in ways:
            assert pieces(ruleset, parts, only) == expected
        if not only:
            assert expected == body
        # A run with only those rules learns nothing new and loses nothing.
        u = Transducer(ruleset, timeout=None, only=only)
        u.finish(body)
        memory.record(ruleset, KEY, u)
        assert memory.rules_for(ruleset, KEY) == only

    def test_no_validator_is_never_remembered(self) -> None:
        """Without ETag or Last-Modified there is no key, so nothing is kept."""
        assert ResourceKey.of("site", "/x") is None
        rs = two_rules()
        memory = ApplicabilityMemory()
        t = Transducer(rs)
        t.finish(b"foo")
        assert not memory.record(rs, None, t)
        assert memory.rules_for(rs, None) is None
        assert len(memory) == 0

    def test_validators_name_versions(self) -> None:
        """A different ETag, Last-Modified, length or variant is another version."""
        base = ResourceKey.of("s", "/u", etag='"1"', last_modified="Mon", length=5)
        others = [
            ResourceKey.of("s", "/u", etag='"2"', last_modified="Mon", length=5),
            ResourceKey.of("s", "/u", etag='"1"', last_modified="Tue", length=5),
            ResourceKey.of("s", "/u", etag='"1"', last_modified="Mon", length=6),
            ResourceKey.of("s", "/u", etag='"1"', last_modified="Mon", length=5, variant="fr"),
            ResourceKey.of("t", "/u", etag='"1"', last_modified="Mon", length=5),
            ResourceKey.of("s", "/v", etag='"1"', last_modified="Mon", length=5),
        ]
        rs = two_rules()
        memory = ApplicabilityMemory()
        assert base is not None
        memory.remember(rs, base, [])
        assert memory.rules_for(rs, base) == frozenset()
        for other in others:
            assert memory.rules_for(rs, other) is None

    def test_incomplete_scans_are_not_remembered(self) -> None:
        """Unfinished, bailed-out or timed-out bodies teach nothing."""
        rs = two_rules()
        memory = ApplicabilityMemory()
        t = Transducer(rs)
        t.feed(b"foo and more")
        assert not memory.record(rs, KEY, t)  # finish() not called
        tags = RuleSet.build(
            [compile_rule(b"foo", b"F", b"g"), compile_rule(b"<[^>]*>", b"T", b"g")],
            max_buffered_size=64,
        )
        t = Transducer(tags)
        t.feed(b"<" + b"a" * 200)  # held past the 64-byte limit: bail-out
        t.finish(b"> foo")
        assert t.bailed_out
        assert not memory.record(tags, KEY, t)
        t = Transducer(rs)
        t.finish(b"plain")
        t.timed_out = True
        assert not memory.record(rs, KEY, t)
        assert memory.rules_for(rs, KEY) is None

    def test_untried_rules_stay_possible(self) -> None:
        """A run restricted to some rules says nothing about the others."""
        rs = two_rules()
        memory = ApplicabilityMemory()
        t = Transducer(rs, only=[0])
        t.finish(b"nothing here")
        assert memory.record(rs, KEY, t)
        assert memory.rules_for(rs, KEY) == frozenset({1})
        t = Transducer(rs)
        t.finish(b"nothing here")
        memory.record(rs, KEY, t)
        assert memory.rules_for(rs, KEY) == frozenset()
        # Passing through with no rule keeps what is known.
        t = Transducer(rs, only=frozenset())
        assert t.finish(b"nothing here") == b"nothing here"
        memory.record(rs, KEY, t)
        assert memory.rules_for(rs, KEY) == frozenset()

    def test_new_rule_set_forgets(self) -> None:
        """Entries belong to the rule set's digest; a changed set starts afresh."""
        rs = two_rules()
        memory = ApplicabilityMemory()
        t = Transducer(rs)
        t.finish(b"foo")
        memory.record(rs, KEY, t)
        assert memory.rules_for(rs, KEY) == frozenset({0})
        changed = RuleSet.build(
            [compile_rule(b"foo", b"G", b"g"), compile_rule(b"bar[0-9]+", b"B", b"g")]
        )
        assert changed.digest != rs.digest
        assert memory.rules_for(changed, KEY) is None

    def test_lru_bound(self) -> None:
        """At most max_entries versions are kept; the least recently used go."""
        rs = two_rules()
        memory = ApplicabilityMemory(3)
        keys = [ResourceKey.of("s", f"/{i}", etag=f'"{i}"') for i in range(5)]
        for key in keys[:3]:
            assert key is not None
            memory.remember(rs, key, [0])
        assert memory.rules_for(rs, keys[0]) == frozenset({0})  # now most recent
        for key in keys[3:]:
            assert key is not None
            memory.remember(rs, key, [1])
        assert len(memory) == 3
        assert memory.rules_for(rs, keys[1]) is None
        assert memory.rules_for(rs, keys[2]) is None
        assert memory.rules_for(rs, keys[0]) == frozenset({0})
        assert memory.rules_for(rs, keys[4]) == frozenset({1})
        with self.assertRaises(ValueError):
            ApplicabilityMemory(0)

    def test_byte_bound(self) -> None:
        """The memory holds at most ``max_bytes``: each version is charged
        its entry and its mask (more for a rule far down a long set); the
        least recently used go first, whatever their size; a smaller
        bound (a reload) drops the oldest until the rest fits."""
        rs = RuleSet.build([compile_rule(f"w{i}x".encode(), b"R", b"g") for i in range(300)])
        small, large = ENTRY + sys.getsizeof(1), ENTRY + sys.getsizeof(1 << 299)
        self.assertGreater(large, small)
        memory = ApplicabilityMemory(max_bytes=4 * small + large)
        keys = [ResourceKey.of("s", f"/{i}", etag=f'"{i}"') for i in range(8)]
        for key in keys[:5]:
            assert key is not None
            memory.remember(rs, key, [0])
        self.assertEqual((len(memory), memory.used), (5, 5 * small))
        assert keys[5] is not None and keys[0] is not None
        memory.remember(rs, keys[5], [299])  # pushes out the oldest small one
        self.assertEqual((len(memory), memory.used), (5, 4 * small + large))
        self.assertIsNone(memory.rules_for(rs, keys[0]))
        self.assertEqual(memory.rules_for(rs, keys[5]), frozenset({299}))
        memory.forget(rs, keys[5])
        self.assertEqual(memory.used, 4 * small)
        memory.resize(small)
        self.assertEqual((len(memory), memory.used), (1, small))
        self.assertEqual(memory.rules_for(rs, keys[4]), frozenset({0}))
        memory.resize(0)
        self.assertEqual((len(memory), memory.used), (0, 0))
        memory.remember(rs, keys[4], [0])  # nothing fits: nothing kept
        self.assertEqual((len(memory), memory.used), (0, 0))

    def test_the_charge_covers_the_memory(self) -> None:
        """What an entry is charged covers what it takes (traced while
        20,000 versions are remembered, their keys made before: the map's
        slot and node, the 16-byte name, the mask), within a third above
        it."""
        rs = RuleSet.build([compile_rule(f"w{i}x".encode(), b"R", b"g") for i in range(40)])
        memory = ApplicabilityMemory(max_bytes=10**9)
        keys = [ResourceKey.of_bytes(b"s", b"/%d" % i, etag=os.urandom(8).hex().encode()) for i in range(20_000)]
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i, key in enumerate(keys):
                assert key is not None
                memory.remember(rs, key, [i % 40])
            taken = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        self.assertGreaterEqual(memory.used, taken)
        self.assertLessEqual(memory.used, taken * 1.33)

    def test_many_rules_bitmask_round_trip(self) -> None:
        """Rule indexes far apart survive the bitmask."""
        rules = [compile_rule(f"w{i}x".encode(), b"R", b"g") for i in range(1000)]
        rs = RuleSet.build(rules)
        memory = ApplicabilityMemory()
        assert KEY is not None
        memory.remember(rs, KEY, [0, 63, 64, 999])
        assert memory.rules_for(rs, KEY) == frozenset({0, 63, 64, 999})
        memory.forget(rs, KEY)
        assert memory.rules_for(rs, KEY) is None

    def test_key_parts_are_framed(self) -> None:
        """Moving bytes from one part to the next makes another key: each part
        is framed by its length before the key is hashed."""
        a = ResourceKey.of_bytes(b"s", b"/ab", etag=b'"c"')
        b = ResourceKey.of_bytes(b"s", b"/a", etag=b'b"c"')
        c = ResourceKey.of_bytes(b"s/", b"ab", etag=b'"c"')
        assert a is not None and b is not None and c is not None
        assert len({a, b, c}) == 3
        assert len({a.hashed("d"), b.hashed("d"), c.hashed("d")}) == 3
        assert a == ResourceKey.of_bytes(b"s", b"/ab", etag=b'"c"')
        # No length and length 0 differ; so do an empty and a missing variant's neighbours.
        assert ResourceKey.of_bytes(b"s", b"/", etag=b"e") != ResourceKey.of_bytes(b"s", b"/", etag=b"e", length=0)
        # The text constructor is the bytes one over UTF-8.
        assert ResourceKey.of("s", "/é", etag="e") == ResourceKey.of_bytes(b"s", "/é".encode(), etag=b"e")

    def test_key_hash_follows_the_rule_set(self) -> None:
        """The same version under another rule set digest is another name."""
        key = ResourceKey.of_bytes(b"s", b"/", etag=b"e")
        assert key is not None
        first = key.hashed("one")
        assert key.hashed("two") != first
        assert key.hashed("one") == first
