"""A rule change tried before it is loaded: the pure core of the dry run.

``prexy rules diff --site NAME draft.rules`` and the admin endpoint's
``POST /sites/NAME/dry-run`` fetch a site's most requested pages from its
upstream and hand them here with the site's current rule set and the draft:

* :func:`load_draft` reads the draft (bytes, not a path) with the rules
  loader itself, and refuses it as ``--check`` does: a
  :class:`~prexy.substitution.rules.RulesError` reading
  ``draft.rules:3:7: reason``, also for a pattern the dialect accepts but
  its engine will not compile;
* :func:`compare` rewrites every page with each rule set, the whole body at
  once (``Transducer.finish(body)``, as for a body whose end is known: no
  bail-out), and reports the pages whose output differs, each rule's
  occurrences (the transducer's own ``rule_counts``) and pages, the rules
  that matched nothing, and the first differing lines of a few pages.

The report (the admin endpoint adds ``"site"``, ``"pages"``, ``"fetched"``
and ``"failed"``)::

    {"changed": 12,
     "rules": {"current": [{"number", "file", "line", "pattern", "flags",
                            "occurrences", "pages"}], "draft": [...]},
     "never_matching": {"current": [numbers], "draft": [numbers]},
     "timed_out": {"current": [urls], "draft": [urls]},
     "diffs": [{"url": "/a", "lines": ["- old line", "+ new line"]}],
     "encoding": "utf-8, backslashreplace"}

Rules are numbered 1, 2, ... in each set's order.  Diff lines are the
output's bytes decoded as UTF-8, the bytes that are not UTF-8 written as
``\\xNN`` (``"encoding"`` says so); a line longer than
:data:`LINE_WIDTH` characters is cut to a window around its first
difference, ``...`` marking each cut.  A page that one rule set gives up
on (its scan timed out: the rest of the page passed unchanged) is listed
in ``"timed_out"``; its counts are what was made before.

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prexy.substitution.rules import RulesError, parse_rules, tokenize
from prexy.substitution.transducer import Transducer

if TYPE_CHECKING:
    from prexy.substitution.ruleset import RuleSet

__all__ = ["ENCODING", "LINE_WIDTH", "compare", "load_draft"]

#: Characters of a diff line kept (a longer line is cut around its change).
LINE_WIDTH = 200

#: Characters kept before a long line's first difference.
LEAD = 60

#: Lines on each side compared at once, from the first that differs: the
#: diff of a page costs this much whatever its length.
WINDOW = 400

#: How the diff lines are decoded.
ENCODING = "utf-8, backslashreplace"


def load_draft(text: bytes, name: str = "draft.rules") -> RuleSet:
    """The draft rules file ``text`` (called ``name`` in errors and rule
    origins) as a rule set, compiled on first use; RulesError
    (``name:line:column: reason``) when it does not load, as ``--check``
    refuses it: syntax, unknown directives, bad regexes and templates,
    and patterns the dialect takes but their engine will not compile."""
    from prexy.substitution.ruleset import CompileError

    ruleset = parse_rules(text, name, lazy=True)
    try:
        ruleset.check_compiles()
    except CompileError as exc:
        rule = exc.rule
        line = rule.line or 0
        pattern = rule.pattern.decode("latin-1")
        raise RulesError(
            name, line, _pattern_column(text, name, line), pattern, f"pattern '{pattern}': {exc.reason}"
        ) from None
    return ruleset


def _pattern_column(text: bytes, name: str, line: int) -> int:
    """The column of the pattern of the ``replace_filter`` on ``line`` (1 if not found)."""
    for tokens in tokenize(text, name):
        if tokens[0].value == b"replace_filter" and tokens[0].line == line and len(tokens) > 1:
            return tokens[1].column_of(0)
    return 1


class _Side:
    """One rule set's run over the pages: per rule, occurrences and pages."""

    def __init__(self, ruleset: RuleSet | None) -> None:
        self.ruleset = ruleset
        n = len(ruleset.rules) if ruleset is not None else 0
        self.occurrences = [0] * n
        self.pages = [0] * n
        self.timed_out: list[str] = []

    def rewrite(self, url: str, body: bytes, content_type: str | None) -> bytes:
        ruleset = self.ruleset
        if ruleset is None or not ruleset.rules:
            return body
        if content_type is not None and not ruleset.applies_to(content_type):
            return body
        t = Transducer(ruleset)
        out = t.finish(body)
        for k in t.rules_matched:
            self.occurrences[k] += t.rule_counts[k]
            self.pages[k] += 1
        if t.timed_out:
            self.timed_out.append(url)
        return out

    def rules(self) -> list[dict[str, Any]]:
        if self.ruleset is None:
            return []
        return [
            {
                "number": k + 1,
                "file": rule.file,
                "line": rule.line,
                "pattern": rule.pattern.decode("latin-1"),
                "flags": rule.flags,
                "occurrences": self.occurrences[k],
                "pages": self.pages[k],
            }
            for k, rule in enumerate(self.ruleset.rules)
        ]

    def never(self) -> list[int]:
        return [k + 1 for k, count in enumerate(self.occurrences) if not count]


def compare(
    current: RuleSet | None,
    draft: RuleSet,
    pages: Sequence[tuple[str, bytes]],
    diff_pages: int = 5,
    diff_lines: int = 6,
    content_types: Sequence[str | None] | None = None,
) -> dict[str, Any]:
    """Rewrite each ``(url, body)`` of ``pages`` with ``current`` (None: the
    site has no rules) and with ``draft``; return the report (see the
    module docstring).  ``content_types``, one per page when given (None
    for unknown), lets a rule set rewrite only the pages its
    ``replace_filter_types`` take, as the proxy does; without it every
    page is rewritten.  ``diff_pages`` changed pages get up to
    ``diff_lines`` differing lines each."""
    if content_types is not None and len(content_types) != len(pages):
        raise ValueError("content_types must give one type per page")
    before, after = _Side(current), _Side(draft)
    changed = 0
    diffs: list[dict[str, Any]] = []
    for i, (url, body) in enumerate(pages):
        content_type = content_types[i] if content_types is not None else None
        old = before.rewrite(url, body, content_type)
        new = after.rewrite(url, body, content_type)
        if old == new:
            continue
        changed += 1
        if len(diffs) < diff_pages:
            diffs.append({"url": url, "lines": first_differences(old, new, diff_lines)})
    return {
        "changed": changed,
        "rules": {"current": before.rules(), "draft": after.rules()},
        "never_matching": {"current": before.never(), "draft": after.never()},
        "timed_out": {"current": before.timed_out, "draft": after.timed_out},
        "diffs": diffs,
        "encoding": ENCODING,
    }


def first_differences(old: bytes, new: bytes, limit: int = 6) -> list[str]:
    """The first differing lines of two outputs, unified-diff style
    (``"- old"``, ``"+ new"``), at most ``limit`` of them."""
    a = old.split(b"\n")
    b = new.split(b"\n")
    # Skip the common head at C speed, then diff a bounded window.
    start = 0
    while start < len(a) and start < len(b) and a[start] == b[start]:
        start += 1
    wa, wb = a[start : start + WINDOW], b[start : start + WINDOW]
    out: list[str] = []
    matcher = difflib.SequenceMatcher(None, wa, wb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        removed, added = wa[i1:i2], wb[j1:j2]
        # Each removed line beside the one that replaces it, so that a cut
        # at ``limit`` keeps both sides of the first changes.
        for k in range(max(len(removed), len(added))):
            if k < len(removed):
                out.append("- " + _cut(removed[k], added[k] if k < len(added) else None))
            if k < len(added):
                out.append("+ " + _cut(added[k], removed[k] if k < len(removed) else None))
        if len(out) >= limit:
            break
    return out[:limit]


def _cut(line: bytes, other: bytes | None) -> str:
    """``line`` decoded, cut to LINE_WIDTH characters around its first
    difference from ``other`` (the line it replaces or is replaced by)."""
    text = line.decode("utf-8", "backslashreplace")
    if len(text) <= LINE_WIDTH:
        return text
    at = 0
    if other is not None:
        other_text = other.decode("utf-8", "backslashreplace")
        limit = min(len(text), len(other_text))
        while at < limit and text[at] == other_text[at]:
            at += 1
    begin = max(0, min(at - LEAD, len(text) - LINE_WIDTH))
    piece = text[begin : begin + LINE_WIDTH]
    return ("..." if begin else "") + piece + ("..." if begin + LINE_WIDTH < len(text) else "")
