"""Property tests: the index answers exactly like a naive nginx-order walk, and the
PCRE translation means what Python's ``re`` means on their common syntax."""

from __future__ import annotations

import re
from unittest import mock

import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.urlmap import parse_map
from prexy.urlmap.index import REGEX_FLAGS
from prexy.urlmap.pcre import ascii_lower, translate

ALPHABET = "abAB/.?1"
TAILS = ["", "$", r"\b", r"(\?[^/]*)*/?$", r"(\w*)", "[ab]", "(b|a)", ".*1", "/?$", "(A)?b+", "(?=a)"]


def _lit(text: str) -> str:
    """A literal written as PCRE (metacharacters escaped)."""
    return "".join("\\" + c if c in ".?" else c for c in text)


literals = st.text(alphabet=ALPHABET, min_size=1, max_size=5)


@st.composite
def regex_sources(draw: st.DrawFn) -> str:
    """A map regex (with its ``~``/``~*``) of one of the shapes the index handles differently."""
    lit = _lit(draw(literals))
    tail = draw(st.sampled_from(TAILS))
    shape = draw(st.sampled_from(["prefix", "prefix", "free", "group", "opaque", "alt", "class"]))
    if shape == "prefix":
        body = "^" + lit + tail
    elif shape == "free":
        body = lit + tail
    elif shape == "group":
        body = "^(" + lit + ")" + tail
    elif shape == "opaque":
        body = "(?i)" + lit + tail
    elif shape == "alt":
        body = "^" + lit + "|" + _lit(draw(literals))
    else:
        body = "[ab]" + tail
    return ("~*" if draw(st.booleans()) else "~") + body


entries = st.lists(
    st.one_of(
        st.tuples(st.just("exact"), literals),
        st.tuples(st.just("regex"), regex_sources()),
    ),
    max_size=25,
)


def _naive(spec: list[tuple[str, str, str]], default: str, key: str) -> str:
    """nginx's algorithm done the slow way: exact keys, then every regex in file order."""
    for kind, source, value in spec:
        if kind == "exact" and ascii_lower(source) == ascii_lower(key):
            return value
    if key:
        for kind, source, value in spec:
            if kind != "regex":
                continue
            caseless = source.startswith("~*")
            body = source[2:] if caseless else source[1:]
            flags = REGEX_FLAGS | (regex.IGNORECASE if caseless else 0)
            m = regex.compile(translate(body, caseless).pattern, flags).search(key)
            if m is not None:
                group = m.group(1) if m.re.groups >= 1 else None
                return value.replace("$1", group or "")
    return default


atoms = st.one_of(
    st.sampled_from([
        "a", "b", "/", r"\.", ".", "[ab]", "[^a]", r"\d", r"\w", r"\b", "1", "(?:a|b)", "(?=a)",
        "(?!b)", "[a-c]", r"\W", r"\S", r"\B", "[.]", r"\/", "(?<=a)", "(?>a|ab)", r"[\d_]",
    ]),
)


@st.composite
def simple_patterns(draw: st.DrawFn, depth: int = 0) -> str:
    """Patterns in the PCRE subset Python's ``re`` reads identically."""
    parts: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        if depth < 2 and draw(st.integers(0, 5)) == 0:
            inner = [draw(simple_patterns(depth + 1)) for _ in range(draw(st.integers(1, 2)))]
            atom = "(" + "|".join(inner) + ")"
        else:
            atom = draw(atoms)
        if atom not in (r"\b", r"\B", "(?=a)", "(?!b)", "(?<=a)"):
            atom += draw(st.sampled_from(["", "", "*", "+", "?", "{1,2}", "*?", "++", "{2}"]))
        parts.append(atom)
    pattern = "".join(parts)
    if depth == 0:
        pattern = draw(st.sampled_from(["", "^"])) + pattern + draw(st.sampled_from(["", "$"]))
    return pattern


class IndexPropertyTests(SynchronousTestCase):
    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(entries=entries, keys=st.lists(st.text(alphabet=ALPHABET, max_size=9), min_size=1, max_size=8))
    def test_index_agrees_with_linear_walk(self, entries: list[tuple[str, str]], keys: list[str]) -> None:
        """For random maps of prefix, literal, grouped, unindexable and caseless regexes and
        exact keys, every lookup equals the naive first-match-in-file-order walk."""
        spec: list[tuple[str, str, str]] = []
        seen: set[str] = set()
        lines = ["default none;"]
        for i, (kind, source) in enumerate(entries):
            if kind == "exact":
                if ascii_lower(source) in seen:
                    continue
                seen.add(ascii_lower(source))
            value = f"v{i}:$1" if kind == "regex" else f"v{i}"
            spec.append((kind, source, value))
            lines.append(f'"{source}" "{value}";')
        derived = [e[1].lstrip("~*^(") + k for e in entries[:3] for k in keys[:2]]
        # literal regexes scanned or found by their pieces; candidates sorted or merged lazily
        for scan_max, sort_max in ((48, 256), (0, 0)):
            with mock.patch.multiple("prexy.urlmap.index", _SCAN_MAX=scan_max, _SORT_MAX=sort_max):
                urlmap = parse_map("\n".join(lines))
                for key in keys + derived:
                    assert urlmap.lookup(key) == _naive(spec, "none", key), (key, scan_max)

    @settings(max_examples=300, deadline=None)
    @given(
        pattern=simple_patterns(),
        caseless=st.booleans(),
        subjects=st.lists(st.text(alphabet="abAB/.1_ \n", max_size=8), min_size=1, max_size=6),
    )
    def test_translation_matches_re_semantics(self, pattern: str, caseless: bool, subjects: list[str]) -> None:
        """On the syntax PCRE and Python share, the translated pattern finds the same
        match (span and groups) as the original compiled by ``re`` with ASCII rules."""
        reference = re.compile(pattern, re.ASCII | (re.IGNORECASE if caseless else 0))
        flags = REGEX_FLAGS | (regex.IGNORECASE if caseless else 0)
        translated = regex.compile(translate(pattern, caseless).pattern, flags)
        for subject in subjects:
            if not subject:
                continue  # never tried on empty keys (and re's \B differs from PCRE's there)
            want = reference.search(subject)
            got = translated.search(subject)
            assert (want is None) == (got is None), (pattern, subject)
            if want is not None and got is not None:
                assert want.span() == got.span()
                assert want.groups() == got.groups()

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        slugs=st.lists(st.text(alphabet="ab-1", min_size=0, max_size=5), min_size=9, max_size=40),
        keys=st.lists(st.text(alphabet="ab-1", max_size=7), min_size=1, max_size=6),
        caseless=st.booleans(),
    )
    def test_crowded_prefix_agrees_with_linear_walk(self, slugs: list[str], keys: list[str], caseless: bool) -> None:
        """Many regexes sharing one prefix (moved to the piece index by their other literal,
        or kept when they have none) still answer like the naive walk."""
        tilde = "~*" if caseless else "~"
        spec = [("regex", f"{tilde}^/p/(\\d+){slug}$", f"v{i}:$1") for i, slug in enumerate(slugs)]
        text = "default none;\n" + "\n".join(f'"{s}" "{v}";' for _k, s, v in spec)
        for scan_max in (48, 0):
            with mock.patch("prexy.urlmap.index._SCAN_MAX", scan_max):
                urlmap = parse_map(text)
            for key in keys:
                for candidate in (f"/p/12{key}", f"/P/7{key.upper()}", key):
                    assert urlmap.lookup(candidate) == _naive(spec, "none", candidate), candidate

    @settings(max_examples=200, deadline=None)
    @given(
        prefixes=st.lists(st.tuples(literals, st.sampled_from(TAILS)), min_size=1, max_size=20),
        keys=st.lists(st.text(alphabet=ALPHABET, max_size=9), min_size=1, max_size=8),
    )
    def test_prefix_only_map_agrees_with_linear_walk(
        self,
        prefixes: list[tuple[str, str]], keys: list[str]
    ) -> None:
        """Maps of only case-sensitive ``^literal`` regexes (the inline fast path, with
        prefixes of several lengths hitting one key) answer like the naive walk."""
        spec = [("regex", f"~^{_lit(lit)}{tail}", f"v{i}:$1") for i, (lit, tail) in enumerate(prefixes)]
        urlmap = parse_map("default none;\n" + "\n".join(f'"{s}" "{v}";' for _k, s, v in spec))
        derived = [lit + key for lit, _t in prefixes[:4] for key in keys[:2]]
        for key in keys + derived:
            assert urlmap.lookup(key) == _naive(spec, "none", key), key

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        tails=st.lists(st.text(alphabet="ab", min_size=6, max_size=11), min_size=10, max_size=60),
        shared=st.sampled_from(["/p/", "x.", "/p?q="]),
        caseless=st.booleans(),
        keys=st.lists(st.text(alphabet="abAB/.?=1", max_size=6), min_size=1, max_size=5),
    )
    def test_unanchored_literals_agree_with_linear_walk(
        self,
        tails: list[str], shared: str, caseless: bool, keys: list[str]
    ) -> None:
        """Many unanchored literal-first regexes (keyed by shared words, word starts or
        pieces; matched from each occurrence of their literal) answer like the naive walk."""
        tilde = "~*" if caseless else "~"
        spec = [
            ("regex", f"{tilde}{_lit(shared + tail)}(\\w*)", f"v{i}:$1") for i, tail in enumerate(tails)
        ]
        text = "default none;\n" + "\n".join(f'"{s}" "{v}";' for _k, s, v in spec)
        for scan_max in (48, 0):
            with mock.patch("prexy.urlmap.index._SCAN_MAX", scan_max):
                urlmap = parse_map(text)
            for key in keys:
                for candidate in (key, shared + tails[0] + key, "z" + shared + tails[-1].upper() + key):
                    assert urlmap.lookup(candidate) == _naive(spec, "none", candidate), candidate
