"""Prexy's substitution core: replace-filter rules applied to a byte stream.

Pure code (no Twisted): the rules-file parser (:mod:`.rules`), the sregex
dialect (:mod:`.dialect`), replacement templates (:mod:`.template`), compiled
rule sets (:mod:`.ruleset`), the scanner interface (:mod:`.scanner`) and the
streaming transducer (:mod:`.transducer`).  Typical use::

    ruleset = load_rules(["site.rules"])          # once, at configuration time
    if ruleset.applies_to(content_type):
        t = ruleset.new_transducer()              # once per response
        write(t.feed(chunk)) ...; write(t.finish())
"""

from prexy.substitution.dialect import DialectError
from prexy.substitution.rules import RulesError, load_rules, parse_rules
from prexy.substitution.ruleset import Rule, RuleSet
from prexy.substitution.transducer import State, Transducer

__all__ = [
    "DialectError",
    "Rule",
    "RuleSet",
    "RulesError",
    "State",
    "Transducer",
    "load_rules",
    "parse_rules",
]
