"""The runtime's rule sets at scale: one rule set per distinct
rules content, compiled on first use, reused by a reload when the bytes did
not change; and which reloads a running worker can take in place."""

from __future__ import annotations

import os

import attrs
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Config, ConfigError, Timeouts, parse_config
from prexy.runtime import RuleSets, build_runtime, reloads_in_place
from prexy.substitution import Transducer, parse_rules
from prexy.substitution.ruleset import CompileError, Rule, RuleSet
from tests.cases import tmp_dir

RULES_A = "replace_filter 'hello' 'HELLO' g;\nreplace_filter_types text/plain;\n"
RULES_B = "replace_filter 'world' 'WORLD' g;\n"
HEADERS_ONLY = "proxy_cookie_domain www.origin.test $host;\n"


class RuntimeRuleSetsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.tmp = str(tmp_dir(self))

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def config(self, sites: dict[str, list[str]], extra: str = "") -> Config:
        text = extra
        for name, rules in sites.items():
            text += f"[sites.{name}]\nhosts = ['{name}.test']\nupstream = 'http://127.0.0.1:1'\nrules = {rules!r}\n"
        return parse_config(text, os.path.join(self.tmp, "prexy.toml"))

    def test_same_content_one_object(self) -> None:
        """Sites naming the same files, or other files with the same bytes,
        share one RuleSet; other contents (or another order) get their own."""
        self.write("a.rules", RULES_A)
        self.write("copy-of-a.rules", RULES_A)
        self.write("b.rules", RULES_B)
        runtime = build_runtime(self.config({
            "s1": ["a.rules"], "s2": ["a.rules"], "s3": ["copy-of-a.rules"], "s4": ["b.rules"],
            "s5": ["a.rules", "b.rules"], "s6": ["copy-of-a.rules", "b.rules"], "s7": ["b.rules", "a.rules"],
        }))
        rules = {s.name: s.rules for s in runtime.sites}
        assert rules["s1"] is rules["s2"] is rules["s3"]
        assert rules["s4"] is not rules["s1"]
        assert rules["s5"] is rules["s6"]
        assert rules["s7"] is not rules["s5"]
        assert runtime.rulesets is not None
        assert (runtime.rulesets.parsed, runtime.rulesets.made) == (2, 4)  # files; sets a, b, a+b, b+a

    def test_lazy_compile_on_first_selection(self) -> None:
        """Loading parses only: no scanner is compiled until a request for a
        site selects it; then that site's set (and only it) is compiled and
        warmed, before any transducer is made, and rewrites as an eager
        set does."""
        self.write("a.rules", RULES_A)
        self.write("b.rules", RULES_B)
        runtime = build_runtime(self.config({"a": ["a.rules"], "b": ["b.rules"]}))
        a, b = runtime.sites
        assert not a.rules.compiled and not b.rules.compiled
        assert runtime.rulesets is not None and runtime.rulesets.compiled() == 0
        assert runtime.select(b"a.test:8080") is a
        assert a.rules.compiled and not b.rules.compiled
        assert runtime.rulesets.compiled() == 1
        t = Transducer(a.rules)
        assert t.feed(b"hello ") + t.finish(b"hello") == b"HELLO HELLO"
        eager = build_runtime(self.config({"a": ["a.rules"]}), lazy=False)
        assert eager.sites[0].rules.compiled

    def test_compile_ahead_when_few(self) -> None:
        """A worker compiles every distinct set before it serves when there
        are at most ``limit`` of them (shared sets count once), and none
        ahead when there are more; already compiled sets are not counted
        again."""
        self.write("a.rules", RULES_A)
        self.write("b.rules", RULES_B)
        few = build_runtime(self.config({"s1": ["a.rules"], "s2": ["a.rules"], "s3": ["b.rules"]}))
        self.assertEqual(few.compile_ahead(2), 2)
        assert all(s.rules.compiled for s in few.sites)
        self.assertEqual(few.compile_ahead(2), 0)
        many = build_runtime(self.config({"s1": ["a.rules"], "s3": ["b.rules"]}))
        self.assertEqual(many.compile_ahead(1), 0)
        assert not any(s.rules.compiled for s in many.sites)

    def test_compile_ahead_warms_thoroughly_and_a_first_request_does_not(self) -> None:
        """A set compiled ahead has its few-string rules' expansions
        remembered (``transducer.warm(thorough=True)``); a set compiled by
        its site's first request does not wait for that."""
        self.write("c.rules", "replace_filter '(https?://)a\\.test' '${1}b.test' g;\n")
        ahead = build_runtime(self.config({"c": ["c.rules"]}))
        self.assertEqual(ahead.compile_ahead(4), 1)
        assert ahead.sites[0].rules.expansions[1] == {
            (0, b"http://a.test"): b"http://b.test", (0, b"https://a.test"): b"https://b.test",
        }
        first = build_runtime(self.config({"c": ["c.rules"]}))
        site = first.select(b"c.test")
        assert site.rules.compiled and site.rules.expansions[1] == {}

    def test_default_site_is_compiled_too(self) -> None:
        """A request for an unknown host goes to the default site, compiled then."""
        self.write("a.rules", RULES_A)
        runtime = build_runtime(self.config({"a": ["a.rules"]}))
        site = runtime.select(b"unknown.test")
        assert site is runtime.default and site.rules.compiled

    def test_lazy_and_eager_sets_are_the_same(self) -> None:
        """A lazy set has the digest, the engines (``--check``'s lines) and
        the output of an eager one, before and after it is compiled."""
        text = RULES_A + "replace_filter '(a+)+b' 'X' g;\n"
        eager = RuleSet.build(_rules(text), types=("text/plain",))
        lazy = RuleSet.build(_rules(text), types=("text/plain",), lazy=True)
        assert lazy.digest == eager.digest
        assert [(r.pattern, e, w) for r, e, w in lazy.engines()] == [(r.pattern, e, w) for r, e, w in eager.engines()]
        assert not lazy.compiled
        body = b"hello aaab hello"
        out = []
        for rs in (eager, lazy):
            t = Transducer(rs)
            out.append(t.feed(body) + t.finish())
        assert out[0] == out[1] == b"HELLO X HELLO"
        assert lazy.compiled

    def test_reload_reuses_unchanged_and_compiles_only_the_changed(self) -> None:
        """Rebuilt from the previous runtime after one file changed: every
        other site keeps its SiteRuntime (rule set compiled and all, same
        rules_version: its cache entries and applicability memory stay
        valid); the changed site gets a new, uncompiled set with a new
        rules_version; only that file is parsed."""
        self.write("a.rules", RULES_A)
        self.write("b.rules", RULES_B)
        config = self.config({"a": ["a.rules"], "b": ["b.rules"], "c": ["a.rules", "b.rules"]})
        first = build_runtime(config)
        for host in (b"a.test", b"b.test", b"c.test"):
            first.select(host)
        self.write("b.rules", RULES_B.replace("WORLD", "EARTH"))
        second = build_runtime(config, previous=first)
        old = {s.name: s for s in first.sites}
        new = {s.name: s for s in second.sites}
        assert new["a"] is old["a"] and new["a"].rules.compiled
        assert new["b"].rules is not old["b"].rules and not new["b"].rules.compiled
        assert new["b"].rules_version != old["b"].rules_version
        assert new["c"].rules_version != old["c"].rules_version
        assert second.rulesets is not None
        assert (second.rulesets.parsed, second.rulesets.made) == (1, 2)  # b; the sets b and a+b
        # And back: the old bytes are parsed again (a store keeps only what is in use).
        self.write("b.rules", RULES_B)
        third = build_runtime(config, previous=second)
        assert {s.name: s for s in third.sites}["a"] is old["a"]
        assert third.rulesets is not None and third.rulesets.parsed == 1

    def test_reload_reuses_the_site_when_only_another_changed(self) -> None:
        """A site whose config changed gets a new SiteRuntime, with the same
        rule set object when its rules did not change."""
        self.write("a.rules", RULES_A)
        first = build_runtime(self.config({"a": ["a.rules"], "b": ["a.rules"]}))
        second = build_runtime(
            self.config({"a": ["a.rules"], "b": ["a.rules"]}, "[sites.z]\nupstream = 'http://z'\n"), previous=first,
        )
        assert second.sites[1] is first.sites[0]
        assert second.sites[2].rules is first.sites[1].rules

    def test_reload_takes_a_changed_map_by_content(self) -> None:
        """A reload loads a site's map again when its bytes changed, even
        with the same modification time (an edit within one timestamp
        tick), and reuses it when they did not, even when touched; a file
        a wildcard include finds, added later, counts as a change."""
        self.write("m.map", "/old /one;\ninclude parts/*.map;\n")
        os.mkdir(os.path.join(self.tmp, "parts"))
        path = os.path.join(self.tmp, "m.map")
        config = parse_config(
            "[sites.a]\nupstream = 'http://127.0.0.1:1'\nmap = 'm.map'\n", os.path.join(self.tmp, "prexy.toml")
        )
        first = build_runtime(config)
        os.utime(path, (5, 5))
        touched = build_runtime(config, previous=first)
        assert touched.sites[0].urlmap is first.sites[0].urlmap
        self.write("m.map", "/old /two;\ninclude parts/*.map;\n")
        os.utime(path, (5, 5))
        second = build_runtime(config, previous=touched)
        assert second.sites[0].urlmap.lookup("/old") == "/two"
        self.write("parts/x.map", "/new /three;\n")
        third = build_runtime(config, previous=second)
        assert third.sites[0].urlmap.lookup("/new") == "/three"

    def test_header_only_rules(self) -> None:
        """A file of header directives only: no body rule set, its header rules in force."""
        self.write("h.rules", HEADERS_ONLY)
        site = build_runtime(self.config({"h": ["h.rules"]})).sites[0]
        assert site.rules is None
        assert site.header_rules.active and b"set-cookie" in site.header_names

    def test_broken_file_names_file_and_line(self) -> None:
        """A broken rules file is refused with its own file and line, lazy or
        not; an unreadable one with its name."""
        path = self.write("bad.rules", RULES_A + "replace_filter 'x' 'y' gx;\n")
        with self.assertRaises(ConfigError) as caught:
            build_runtime(self.config({"a": ["bad.rules"]}))
        assert (caught.exception.path, caught.exception.line) == (path, 3)
        store = RuleSets()
        with self.assertRaises(ConfigError) as caught:
            store.load((os.path.join(self.tmp, "missing.rules"),))
        assert "cannot read rules" in caught.exception.reason

    def test_check_compiles_once_per_content(self) -> None:
        """With ``check`` (the master, ``--check``), each rules file's
        patterns are compiled alone on their engine once per content; a
        refusal names the rule's file and line."""
        calls: list[RuleSet] = []
        real = RuleSet.check_compiles

        def counting(ruleset: RuleSet) -> None:
            calls.append(ruleset)
            real(ruleset)

        self.patch(RuleSet, "check_compiles", counting)
        self.write("a.rules", RULES_A)
        self.write("copy.rules", RULES_A)
        config = self.config({"a": ["a.rules"], "b": ["copy.rules"]})
        first = build_runtime(config, check=True)
        assert len(calls) == 1
        build_runtime(config, check=True, previous=first)
        assert len(calls) == 1
        build_runtime(config)
        assert len(calls) == 1

        def refusing(ruleset: RuleSet) -> None:
            raise CompileError(ruleset.rules[0], "too big")

        self.patch(RuleSet, "check_compiles", refusing)
        path = self.write("b.rules", "\n" + RULES_B)
        with self.assertRaises(ConfigError) as caught:
            build_runtime(self.config({"b": ["b.rules"]}), check=True)
        assert (caught.exception.path, caught.exception.line) == (path, 2)
        assert caught.exception.reason == "pattern 'world': too big"

    def test_check_compiles_accepts_the_dialect(self) -> None:
        """``check_compiles`` passes every rule of a realistic set, RE2 ones included."""
        RuleSet.build(_rules(RULES_A + RULES_B + "replace_filter '(a|aa)*c' 'z' g;\n"), lazy=True).check_compiles()

    def test_linear_rules_lines_without_compiling(self) -> None:
        """``--check``'s lines about rules on RE2 come without compiling any
        set, once per rule however many sets hold it."""
        self.write("a.rules", "replace_filter '(a|aa)*c' 'z' g;\n")
        self.write("b.rules", RULES_B)
        runtime = build_runtime(self.config({"a": ["a.rules", "b.rules"], "b": ["a.rules"]}))
        lines = runtime.linear_rules()
        assert len(lines) == 1 and "a.rules:1" in lines[0] and "runs on re2" in lines[0]
        assert runtime.rulesets is not None and runtime.rulesets.compiled() == 0

    def test_check_names_rules_on_the_sregex_order_vm(self) -> None:
        """``--check`` also names a rule that runs on the sregex-order VM, and why."""
        self.write("t.rules", "replace_filter '^\\s+|\\s+$' '' g;\n")
        runtime = build_runtime(self.config({"a": ["t.rules"]}))
        lines = runtime.linear_rules()
        assert len(lines) == 1 and "t.rules:1" in lines[0] and "runs on sregex-vm: sregex's thread order" in lines[0]


class ReloadsInPlaceTests(SynchronousTestCase):
    def test_only_sites_changed(self) -> None:
        """Changed sites, default site or site files: a worker takes them in
        place; any server-level change needs a new generation."""
        tmp = str(tmp_dir(self))
        base = parse_config("[sites.a]\nupstream = 'http://a'\n", os.path.join(tmp, "p.toml"))
        more = parse_config(
            "[server]\ndefault_site = 'b'\n[sites.a]\nupstream = 'http://a2'\n[sites.b]\nupstream = 'http://b'\n",
            os.path.join(tmp, "p.toml"),
        )
        assert reloads_in_place(base, more)
        assert reloads_in_place(base, attrs.evolve(base, included=("x.toml",)))
        assert not reloads_in_place(base, attrs.evolve(base, timeouts=Timeouts(connect=1)))
        assert not reloads_in_place(base, attrs.evolve(base, listen=("tcp:1",)))
        assert not reloads_in_place(base, attrs.evolve(base, workers=3))


def _rules(text: str) -> list[Rule]:
    return list(parse_rules(text, "t.rules", lazy=True).rules)
