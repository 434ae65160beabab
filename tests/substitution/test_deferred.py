"""Rules a worker's master validated already (``parse_rules(checked=True)``):
no pattern is parsed when the file loads, each one is parsed when its
set's scanner is built, and the set rewrites exactly as one parsed at
load."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution import dialect, parse_rules
from prexy.substitution.dialect import DeferredRegex, parse_sregex
from prexy.substitution.transducer import Transducer

RULES = b"""replace_filter_types text/plain;
replace_filter '(https?:)//www\\.origin\\.com' '$1//www.clone.nl' g;
replace_filter 'a+b' 'X' gi;
replace_filter 'once' 'ONCE';
"""
BODY = b"see https://www.origin.com and //www.origin.com, aaB once once"


class DeferredTests(SynchronousTestCase):
    def count_parses(self) -> list[bytes]:
        parsed: list[bytes] = []

        def counting(pattern: bytes, caseless: bool = False) -> object:
            parsed.append(pattern)
            return parse_sregex(pattern, caseless)

        self.patch(dialect, "parse_sregex", counting)
        return parsed

    def test_parsed_when_compiled(self) -> None:
        """Loading parses no pattern; building the scanner parses each once."""
        parsed = self.count_parses()
        rules = parse_rules(RULES, "x.rules", lazy=True, checked=True)
        assert parsed == [] and not rules.compiled
        rewrite = Transducer(rules)
        out = rewrite.feed(BODY) + rewrite.finish()
        assert sorted(parsed) == sorted(r.pattern for r in rules.rules)
        assert out == b"see https://www.clone.nl and //www.origin.com, X ONCE once"

    def test_same_as_parsed_at_load(self) -> None:
        """Equal rule sets with the same digest, header rules and output."""
        checked = parse_rules(RULES, "x.rules", lazy=True, checked=True)
        eager = parse_rules(RULES, "x.rules", lazy=True)
        assert checked == eager and checked.digest == eager.digest and checked.types == eager.types
        outputs = []
        for rules in (checked, eager):
            rewrite = Transducer(rules)
            outputs.append(rewrite.feed(BODY) + rewrite.finish())
        assert outputs[0] == outputs[1]

    def test_deferred_equals_parsed(self) -> None:
        """A ``DeferredRegex`` is equal to, and hashes as, the parse it stands for."""
        for pattern, caseless in ((rb"(https?:)//www\.x\.com", False), (rb"a+b", True)):
            deferred, parsed = DeferredRegex(pattern, caseless), parse_sregex(pattern, caseless)
            assert deferred == parsed and parsed == deferred and hash(deferred) == hash(parsed)
            assert (deferred.tree, deferred.ngroups, deferred.caseless) == (parsed.tree, parsed.ngroups, caseless)

    def test_an_unknown_linear_mode_is_still_refused_at_load(self) -> None:
        """``RuleSet.build`` refuses an unknown engine mode without parsing a rule for it."""
        from prexy.substitution.ruleset import RuleSet

        rules = parse_rules(RULES, "x.rules", lazy=True, checked=True)
        with self.assertRaises(ValueError):
            RuleSet.build(rules.rules, linear="sometimes", lazy=True)
