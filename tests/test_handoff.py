"""``prexy.handoff``: the configuration a master hands its workers, parsed.

A handoff decodes to a configuration equal to the one validated, whatever
it holds (cache policies with their patterns, compression, error pages,
maps, rules, a cluster); one encoded against the configuration a worker
holds carries the sites that changed only and gives the worker's own
objects back for the others (which is what lets its reload keep their
runtimes); and a worker built from it never reads the disk."""

from __future__ import annotations

import os
import shutil
from typing import Any

import attrs
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from prexy import handoff
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.files import DiskFiles, Snapshot
from prexy.service import ConfigLoader, ProxyService
from prexy.worker import Handed, build


def write(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


class HandoffTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.tmp = os.path.abspath(self.mktemp())
        write(f"{self.tmp}/page.html", "<p>sorry</p>\n")
        self.main = write(f"{self.tmp}/prexy.toml", "\n".join([
            'include = "sites.d/*.toml"',
            "[server]",
            'listen = ["tcp:0"]',
            'error_pages = { 502 = "page.html" }',
            "[cache]",
            'size = "64M"',
            "[compression]",
            "gzip_level = 4",
            "",
        ]))
        for name in ("a", "b", "c"):
            write(f"{self.tmp}/{name}.rules", f"replace_filter 'x' '{name}' g;\nreplace_filter_types text/plain;\n")
            write(f"{self.tmp}/sites.d/{name}.toml", "\n".join([
                f"[sites.{name}]",
                f'hosts = ["{name}.test", "*.{name}.test"]',
                f'upstream = "http://{name}.origin"',
                f'rules = "../{name}.rules"',
                'map = "../x.map"',
                'cache_ignore_cookies = ["_ga*", "utm_*"]',
                'cache_pass = ["/admin*"]',
                "",
            ]))
        write(f"{self.tmp}/x.map", "/old /new;\n")
        self.argv = ["--config", self.main]
        self.loader = ConfigLoader()

    def forbid_the_disk(self) -> None:
        """Any use of the disk (``prexy.files.DiskFiles``) fails the test."""
        def used(*args: Any) -> Any:
            self.fail(f"the worker used the disk: {args[1:]}")

        for name in ("read", "status", "is_file", "glob", "listdir"):
            self.patch(DiskFiles, name, used)

    def test_round_trip(self) -> None:
        """Everything a validated configuration holds comes back equal
        (cache policies with their compiled patterns, compression, error
        pages, maps), with the files the runtime needs and not the
        configuration's own files."""
        validated = self.loader(self.argv)
        handed = handoff.decode(handoff.encode(handoff.Handoff(validated.config, validated.snapshot)))
        assert handed.config == validated.config
        assert handed.files == validated.snapshot
        assert f"{self.tmp}/a.rules" in handed.files.contents
        assert self.main not in handed.files.contents
        assert not any(path.endswith(".toml") for path in handed.files.contents)
        site = handed.config.site("a")
        assert site.cache is not None and site.cache.ignore_cookies == ("_ga*", "utm_*")

    def test_a_reload_carries_the_changed_sites_only(self) -> None:
        """One site file changed: the handoff against the configuration the
        worker holds is small, and decodes to the new configuration whose
        unchanged sites are the worker's own objects."""
        first = self.loader(self.argv)
        whole = handoff.encode(handoff.Handoff(first.config, first.snapshot))
        held = Handed()
        held.take(whole)
        write(f"{self.tmp}/sites.d/b.toml", '[sites.b]\nhosts = ["b.test"]\nupstream = "http://b2.origin"\n')
        second = self.loader(self.argv)
        assert second.config.site("a") is first.config.site("a")  # (the master's memo kept it)
        delta = handoff.encode(handoff.Handoff(second.config, second.snapshot), first.config)
        base = held.base
        assert base is not None
        new = held.take(delta)
        assert new.config == second.config
        assert new.config.site("a") is base.site("a") and new.config.site("c") is base.site("c")
        assert new.config.site("b") is not base.site("b")
        assert str(new.config.site("b").upstream) == "http://b2.origin"
        assert held.base is new.config

    def test_a_reference_to_a_site_not_held_is_refused(self) -> None:
        """A handoff encoded against a configuration the worker does not
        hold (out of step) is refused with a clear error, not misread."""
        one = Config(listen=("tcp:0",), sites=(SiteConfig("a", UpstreamURL.parse("http://a")),), default_site="a")
        two = attrs.evolve(one, sites=(*one.sites, SiteConfig("b", UpstreamURL.parse("http://b"))))
        delta = handoff.encode(handoff.Handoff(two, Snapshot({})), two)
        with self.assertRaises(handoff.HandoffError) as caught:
            handoff.decode(delta, one)
        assert "does not hold" in str(caught.exception)
        with self.assertRaises(handoff.HandoffError):
            handoff.decode(b"garbage")
        with self.assertRaises(handoff.HandoffError):
            handoff.decode(handoff.encode(handoff.Handoff(two, Snapshot({})))[:-5])

    def test_a_worker_never_reads_the_disk(self) -> None:
        """A worker's runtime, built from a handoff with every file on disk
        gone and the disk forbidden, serves the validated rules and map;
        its in-place reload from the next handoff swaps in the changed
        rules and keeps the unchanged sites' runtimes."""
        validated = self.loader(self.argv)
        held = Handed()
        first = held.take(handoff.encode(handoff.Handoff(validated.config, validated.snapshot)))
        write(f"{self.tmp}/b.rules", "replace_filter 'x' 'B' g;\nreplace_filter_types text/plain;\n")
        second = self.loader(self.argv)
        delta = handoff.encode(handoff.Handoff(second.config, second.snapshot), validated.config)
        shutil.rmtree(self.tmp)
        self.forbid_the_disk()
        runtime, _tls = build(first)
        assert runtime.select(b"x.a.test").urlmap.lookup("/old") == "/new"
        service = ProxyService(MemoryReactorClock(), first.config, runtime, check_rules=False,
                               files=Snapshot({}))
        before = {s.name: s for s in service.runtime.sites}
        new = held.take(delta)
        assert service.reload(new.files, new.config)
        after = {s.name: s for s in service.runtime.sites}
        assert after["a"] is before["a"] and after["c"] is before["c"]
        assert after["b"].rules is not before["b"].rules
        assert after["b"].rules_version != before["b"].rules_version

    def test_a_broken_file_keeps_the_configuration_in_force(self) -> None:
        """A site file broken on disk: the master refuses the load (with the
        file and line) and has nothing new to hand; the handoff in force
        still decodes and builds, with the disk gone."""
        validated = self.loader(self.argv)
        write(f"{self.tmp}/sites.d/c.toml", '[sites.c]\nupstream = "ftp://c"\n')
        with self.assertRaises(SystemExit) as caught:
            self.loader(self.argv)
        assert "sites.d/c.toml:2: sites.c.upstream" in str(caught.exception)
        shutil.rmtree(self.tmp)
        self.forbid_the_disk()
        handed = handoff.decode(handoff.encode(handoff.Handoff(validated.config, validated.snapshot)))
        runtime, _tls = build(handed)
        assert str(runtime.select(b"c.test").config.upstream) == "http://c.origin"

    def test_a_new_worker_parses_no_rules_file(self) -> None:
        """A handoff for a worker with no configuration yet carries the
        rules files' rule sets as the master parsed them: the worker parses
        none again, and builds the same rule sets (their origins too);
        one against a base carries none (the worker has its own)."""
        from prexy.substitution import rules as rules_module

        validated = self.loader(self.argv)
        assert validated.rulesets is not None
        parsed = validated.rulesets.portable()
        assert sorted(parsed) == [f"{self.tmp}/{name}.rules" for name in ("a", "b", "c")]
        whole = handoff.decode(handoff.encode(handoff.Handoff(validated.config, validated.snapshot, parsed)))
        assert sorted(whole.rulesets) == sorted(parsed)
        delta = handoff.decode(handoff.encode(handoff.Handoff(validated.config, validated.snapshot, parsed),
                                              validated.config), validated.config)
        assert delta.rulesets == {}
        plain, _ = build(handoff.decode(handoff.encode(handoff.Handoff(validated.config, validated.snapshot))))
        calls: list[str] = []
        real = rules_module.parse_rules
        self.patch(rules_module, "parse_rules", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
        from prexy import substitution

        self.patch(substitution, "parse_rules", rules_module.parse_rules)
        runtime, _tls = build(whole)
        assert calls == []
        for site, other in zip(runtime.sites, plain.sites, strict=True):
            assert site.rules == other.rules and site.rules is not None and other.rules is not None
            assert [r.origin for r in site.rules.rules] == [r.origin for r in other.rules.rules]
            assert site.rules_version == other.rules_version
        select = runtime.select(b"x.a.test")
        assert select.rules is not None and select.rules.compiled  # (its patterns parsed now)
        # Bytes other than those the rule set was parsed from: parsed here.
        changed = dict(whole.files.contents)
        changed[f"{self.tmp}/b.rules"] = b"replace_filter 'x' 'B2' g;\n"
        build(handoff.Handoff(whole.config, Snapshot(changed), whole.rulesets))
        assert calls == [f"{self.tmp}/b.rules"]
