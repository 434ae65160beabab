"""Whether a fetch goes on once the client that made it went away
(``flow.wanted``), without I/O: followers or the store keep it going;
nobody left and nothing stored cancels it."""

from __future__ import annotations

import itertools

from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.flow import Wanted, wanted


class WantedTests(SynchronousTestCase):
    def test_followers_keep_it_going_whatever_the_store(self) -> None:
        """One client hanging up never cuts the answer of those following
        its fetch, before the head or after, stored or not."""
        for head, claimed, storing in itertools.product((False, True), repeat=3):
            for followers in (1, 2, 100):
                self.assertIs(
                    wanted(followers=followers, head=head, claimed=claimed, storing=storing), Wanted.FOLLOWERS
                )

    def test_alone_the_store_decides(self) -> None:
        """With nobody following: before the head a claimed miss goes on
        (its answer is to be stored, and other workers wait on the claim),
        an unclaimed fetch (a pass, a HEAD miss) is cancelled; from the
        head on, only a body being stored keeps it going."""
        cases = {
            # (head, claimed, storing): decision
            (False, False, False): Wanted.NOBODY,
            (False, True, False): Wanted.STORE,
            (True, True, True): Wanted.STORE,
            (True, False, True): Wanted.STORE,
            (True, True, False): Wanted.NOBODY,  # not storable, or it outgrew max_object_size
            (True, False, False): Wanted.NOBODY,
        }
        for (head, claimed, storing), expected in cases.items():
            got = wanted(followers=0, head=head, claimed=claimed, storing=storing)
            self.assertIs(got, expected, (head, claimed, storing))

    def test_every_input_is_decided(self) -> None:
        """The decision is total, and NOBODY only when no follower is left
        and nothing is (to be) stored."""
        for followers, head, claimed, storing in itertools.product((0, 1), *[(False, True)] * 3):
            got = wanted(followers=followers, head=head, claimed=claimed, storing=storing)
            stored = storing if head else claimed
            self.assertEqual(got is Wanted.NOBODY, not followers and not stored)
