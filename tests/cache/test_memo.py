"""The bounded memos (``prexy.cache.memo``): one byte budget for the
parts a worker keeps (decoded objects, compressed variants, hit
answers), one order across them, and entries charged what they hold."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.memo import ENTRY, Memo, Memos, key_size, object_size
from prexy.cache.store import CachedObject


def deep_size(value: Any, seen: set[int] | None = None) -> int:
    """The bytes ``value`` and what it refers to take (types, modules and
    functions are shared and not counted; each object once)."""
    if seen is None:
        seen = set()
    if id(value) in seen or isinstance(value, type) or value is None or isinstance(value, bool):
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    for ref in gc.get_referents(value):
        size += deep_size(ref, seen)
    return size


def an_object(body: bytes, fields: int = 8) -> CachedObject:
    headers = [(b"X-Field-%d" % i, b"value %d of a typical length" % i) for i in range(fields)]
    return CachedObject(
        200, headers, 1.5e9 + 0.25, 300.5, 10.5, 300.5, 0.5, "shop", b"shop.test/some/path.html", (b"accept-encoding",),
        b"", False, body, 4096 + len(body),
    )


class MemoTests(SynchronousTestCase):
    def test_budget_and_order(self) -> None:
        """Past the budget, the entries used least recently go first; a
        replaced entry's size is given back; an entry over an eighth of
        the budget is not kept (and drops what it replaces)."""
        each = 1000 + ENTRY + key_size("a")
        memo: Memo[str, int] = Memo(8 * each)
        for name in "abcdefgh":
            memo.put(name, ord(name), 1000)
        self.assertEqual((len(memo), memo.used), (8, 8 * each))
        self.assertEqual(memo.get("a"), ord("a"))  # now the most recent
        memo.put("i", 0, 1000)
        self.assertIsNone(memo.get("b"))
        self.assertEqual(memo.get("a"), ord("a"))
        memo.put("a", 1, 500)
        self.assertEqual((memo.get("a"), memo.used), (1, 8 * each - 500))
        memo.put("a", 2, 1001)
        self.assertEqual((memo.get("a"), memo.used, len(memo)), (None, 7 * each, 7))
        memo.clear()
        self.assertEqual((len(memo), memo.used, memo.memos.used), (0, 0, 0))

    def test_one_budget_for_every_part(self) -> None:
        """Parts of one budget are bounded together: what one part adds
        pushes out what was used least recently, in any part; each part's
        bytes and the whole's stay the sum of what is kept."""
        memos = Memos(10 * (1000 + ENTRY + key_size(b"k0")))
        objects, answers = memos.part("objects"), memos.part("answers")
        self.assertIs(memos.part("objects"), objects)
        for i in range(6):
            objects.put(b"k%d" % i, i, 1000)
        for i in range(4):
            answers.put(b"k%d" % i, -i, 1000)  # the same keys, another part
        self.assertEqual((len(objects), len(answers), len(memos)), (6, 4, 10))
        self.assertEqual(objects.get(b"k0"), 0)  # used again: now the most recent
        self.assertEqual(answers.get(b"k0"), 0)
        for i in range(4, 7):
            answers.put(b"k%d" % i, -i, 1000)
        # The three used least recently went, from the objects' part: k1, k2, k3.
        self.assertEqual([objects.get(b"k%d" % i) for i in range(6)], [0, None, None, None, 4, 5])
        self.assertEqual(len(answers), 7)
        self.assertEqual(memos.used, objects.used + answers.used)
        self.assertEqual(memos.used_by(), {"objects": objects.used, "answers": answers.used})
        self.assertLessEqual(memos.used, memos.budget)
        # Clearing one part leaves the other.
        objects.clear()
        self.assertEqual((len(objects), objects.used, len(answers), memos.used), (0, 0, 7, answers.used))

    def test_parts_with_their_own_keys(self) -> None:
        """Parts whose keys differ in shape (a worker's: bytes, pairs,
        6-tuples) keep them as they are, in the same order and budget;
        clearing one leaves the others."""
        memos = Memos(8 * 1000 + 500)  # eight entries of 1,000 bytes
        objects = memos.part("objects", own_keys=True)
        answers = memos.part("answers", own_keys=True)
        for i in range(5):
            objects.put(b"k%d" % i, i, 1000 - ENTRY - key_size(b"k%d" % i))
        for i in range(4):
            key = (b"k%d" % i, b"GET", b"HTTP/1.1", False, (), ())
            answers.put(key, -i, 1000 - ENTRY - key_size(key))
        self.assertEqual((len(objects), len(answers), memos.used), (4, 4, 8000))  # k0, the oldest, went
        self.assertIsNone(objects.get(b"k0"))
        self.assertEqual(answers.get((b"k0", b"GET", b"HTTP/1.1", False, (), ())), 0)
        self.assertEqual(memos.used, objects.used + answers.used)
        objects.clear()
        self.assertEqual((len(objects), objects.used, len(answers), memos.used), (0, 0, 4, answers.used))

    def test_an_oversized_entry_is_refused_whatever_the_part(self) -> None:
        """An entry over an eighth of the whole budget is kept by no part,
        and pushes nothing out."""
        memos = Memos(80_000)
        small, big = memos.part("objects"), memos.part("variants")
        small.put(b"a", "a", 1000)
        big.put(b"b", "b", 10_000 - ENTRY)  # just over an eighth with its bookkeeping
        self.assertEqual((small.get(b"a"), big.get(b"b"), len(memos)), ("a", None, 1))
        big.put(b"b", "b", 9_000)
        self.assertEqual(big.get(b"b"), "b")

    def test_resize(self) -> None:
        """A smaller budget (a reload) drops the least recently used
        entries until the rest fits, and those over its eighth."""
        memos = Memos(1_000_000)
        part = memos.part("objects")
        for i in range(10):
            part.put(i, i, 10_000)
        part.put(10, 10, 100_000)
        part.get(0)
        memos.resize(85_000)  # room for 8 of the 10,000-byte entries and their bookkeeping
        self.assertIsNone(part.get(10))  # over an eighth now
        self.assertEqual([i for i in range(10) if part.get(i) is not None], [0, 3, 4, 5, 6, 7, 8, 9])
        self.assertEqual(memos.used, part.used)
        self.assertLessEqual(memos.used, memos.budget)
        memos.resize(0)
        self.assertEqual((len(memos), memos.used, part.used, len(part)), (0, 0, 0, 0))

    def test_a_number_makes_a_budget_of_its_own(self) -> None:
        one, two = Memo(10_000), Memo(10_000)
        one.put(b"k", 1, 10)
        self.assertEqual((two.get(b"k"), len(two.memos), one.memos.budget), (None, 0, 10_000))


class ChargedSizeTests(SynchronousTestCase):
    """An entry is charged what it keeps alive, not only its body."""

    def test_an_object_is_charged_its_head_and_itself(self) -> None:
        """``object_size`` covers the object's whole memory (body, head
        fields, URL, site, the instance): measured by walking what it
        refers to, within a quarter above it."""
        for body, fields in ((b"", 0), (b"x" * 100, 3), (b"y" * 20_000, 8), (b"z" * 3, 40)):
            obj = an_object(body, fields)
            real = deep_size(obj)
            self.assertGreaterEqual(object_size(obj), real, (len(body), fields))
            self.assertLessEqual(object_size(obj), real * 1.25 + 200, (len(body), fields))

    def test_the_entry_bookkeeping_is_covered(self) -> None:
        """What the shared map takes per entry (its slot and node, the
        (part, key) pair, the record, the size) is within ``ENTRY`` and
        the key's size: traced while putting 5,000 entries whose values
        were made before."""
        memos = Memos(10**9)
        part = memos.part("answers")
        keys = [(b"k" * 40 + b"%d" % i, b"GET", b"HTTP/1.1", False, (b"gzip, br",), ()) for i in range(5000)]
        values = [object() for _ in keys]
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for key, value in zip(keys, values, strict=True):
                part.put(key, value, 0)
            taken = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        keys_memory = sum(deep_size(k) for k in keys)
        self.assertGreaterEqual(memos.used, taken + keys_memory)
        self.assertLessEqual(memos.used, 2 * (taken + keys_memory))
