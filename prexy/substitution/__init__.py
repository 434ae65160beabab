"""Prexy's substitution core: replace-filter rules applied to a byte stream.

Pure code (no Twisted): the rules-file parser (:mod:`.rules`), the sregex
dialect (:mod:`.dialect`), replacement templates (:mod:`.template`), compiled
rule sets (:mod:`.ruleset`), the scanner interface (:mod:`.scanner`), the
multi-pattern prefilters that keep many rules cheap (:mod:`.prefilter`;
the linear-time engine for the rules ``regex`` cannot bound (:mod:`.linear`);
Hyperscan is used when the optional ``hyperscan`` package is installed), the
rule-applicability memory (:mod:`.applicability`) and the streaming
transducer (:mod:`.transducer`).  Typical use::

    ruleset = load_rules(["site.rules", "more.rules"])   # cached by content
    if ruleset.applies_to(content_type):                 # per response
        t = Transducer(ruleset)
        for chunk in body:                               # slices of <= 64 KB
            write(t.feed(chunk))
        write(t.finish())
        # t.bailed_out, t.timed_out, t.match_count, t.rules_matched,
        # t.scan_seconds: for logs, metrics and Server-Timing; per rule
        # index t.rule_counts, t.rule_bytes, and t.stopped_by, t.max_held

``ruleset.digest`` identifies everything that decides the output (derived
ETags, cache keys); ``ruleset.keep_last_modified`` and
``ruleset.max_buffered_size`` are the file's settings.  Load errors are
:class:`RulesError` (``file:line:column: reason``).

Where Prexy knowingly differs from the module (each pinned by a test):

* inside one rule, sregex is not leftmost on ``^\\s+|\\s+$`` (the
  ``sregex_quirk`` cases); Prexy keeps leftmost-first semantics;
* none in what is accepted: patterns that a backtracking engine may not
  finish (nested unbounded repeats over overlapping alternatives, ...) run
  on RE2 (:mod:`.linear`), in linear time; the scans that stay on ``regex``
  have a time limit all the same;
* besides the module's buffer limit, at most ``max_buffered_size`` + 16 KiB
  is ever held per response.

The names below are re-exported lazily (each submodule is imported on first
use of one of its names), so importing one pure submodule, such as
:mod:`.applicability`, does not load the regex engines (``re2``, ``regex``,
``hyperscan``) the rule sets compile to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prexy.lazy import exporter

if TYPE_CHECKING:
    from prexy.substitution.applicability import ApplicabilityMemory, ResourceKey
    from prexy.substitution.dialect import DialectError
    from prexy.substitution.rules import RulesError, load_rules, parse_rules
    from prexy.substitution.ruleset import Rule, RuleSet
    from prexy.substitution.transducer import State, Transducer

#: Each re-exported name -> the submodule that defines it.
_SOURCES = {
    "ApplicabilityMemory": "prexy.substitution.applicability",
    "DialectError": "prexy.substitution.dialect",
    "ResourceKey": "prexy.substitution.applicability",
    "Rule": "prexy.substitution.ruleset",
    "RuleSet": "prexy.substitution.ruleset",
    "RulesError": "prexy.substitution.rules",
    "State": "prexy.substitution.transducer",
    "Transducer": "prexy.substitution.transducer",
    "load_rules": "prexy.substitution.rules",
    "parse_rules": "prexy.substitution.rules",
}

__all__ = [
    "ApplicabilityMemory",
    "DialectError",
    "ResourceKey",
    "Rule",
    "RuleSet",
    "RulesError",
    "State",
    "Transducer",
    "load_rules",
    "parse_rules",
]


#: A re-exported name, its submodule imported on first use (PEP 562).
__getattr__ = exporter(__name__, _SOURCES, globals())
