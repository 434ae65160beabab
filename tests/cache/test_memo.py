"""The bounded memo (``prexy.cache.memo``): its budget, what goes first."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.memo import Memo


class MemoTests(SynchronousTestCase):
    def test_budget_and_order(self) -> None:
        """Past the budget, the entries used least recently go first; a
        replaced entry's size is given back; an entry over an eighth of
        the budget is not kept (and drops what it replaces)."""
        memo: Memo[str, int] = Memo(800)
        for name in "abcdefgh":
            memo.put(name, ord(name), 100)
        self.assertEqual((len(memo), memo.used), (8, 800))
        self.assertEqual(memo.get("a"), ord("a"))  # now the most recent
        memo.put("i", 0, 100)
        self.assertIsNone(memo.get("b"))
        self.assertEqual(memo.get("a"), ord("a"))
        memo.put("a", 1, 50)
        self.assertEqual((memo.get("a"), memo.used), (1, 750))
        memo.put("a", 2, 101)
        self.assertEqual((memo.get("a"), memo.used, len(memo)), (None, 700, 7))
        memo.clear()
        self.assertEqual((len(memo), memo.used), (0, 0))
