"""What a running proxy serves with: a validated Config plus the rule sets
and loaded maps of each site, and the Host-header router.

Built once per (re)load, before anything is swapped in: a rules or map file
that does not load makes ``build_runtime`` raise ``ConfigError`` naming the
file and line, so ``--check``, start-up and reload share one code path and a
broken file never replaces a working runtime.  No Twisted here.

Rule sets are kept by content (:class:`RuleSets`): one per distinct list of
rules-file contents, however many sites name those files, and reused by a
reload when the bytes did not change.  Loading a rules file parses and
checks it (every directive, pattern and replacement, with file and line);
its scanner, the expensive part, is compiled when a request for a site
using it first arrives in a process (:meth:`Runtime.select`, before
anything is timed), so start-up and memory follow the sites that get
traffic, not the sites configured.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

from prexy.config import Config, ConfigError, OriginKey, SiteConfig, UpstreamURL
from prexy.files import DISK, IFiles
from prexy.hostnames import HostTable

if TYPE_CHECKING:
    from prexy.cache.policy import CachePolicy
    from prexy.headerrules import HeaderRules
    from prexy.substitution.rules import RulesError
    from prexy.substitution.ruleset import RuleSet
    from prexy.urlmap.index import UrlMap


@attrs.frozen
class SiteRuntime:
    """One site, ready to serve: config plus compiled rules and map."""

    config: SiteConfig
    #: The site's body rules; None when it rewrites no body.
    rules: RuleSet | None = None
    #: The site's URL map; None without one.
    urlmap: UrlMap | None = None
    #: The upstream connection pool's key for this site.
    origin_key: OriginKey = attrs.field(
        default=attrs.Factory(lambda self: _origin_key(self.config), takes_self=True), eq=False
    )
    #: The site's cache settings (its config's ``CachePolicy``) when it is
    #: cached, else None.
    cache_policy: CachePolicy | None = attrs.field(
        default=attrs.Factory(lambda self: self.config.cache, takes_self=True), eq=False
    )
    #: Response fields meant for this proxy alone (its targeted
    #: Cache-Control field): never sent to clients nor stored.
    targeted: frozenset[bytes] = attrs.field(
        default=attrs.Factory(lambda self: _targeted(self.config), takes_self=True), eq=False
    )
    #: The site's name (read on every request: a field, not a property).
    name: str = attrs.field(default=attrs.Factory(lambda self: self.config.name, takes_self=True), eq=False)
    #: The site's name as bytes (part of every rule-applicability key).
    name_bytes: bytes = attrs.field(
        default=attrs.Factory(lambda self: self.config.name.encode("utf-8", "surrogateescape"), takes_self=True),
        eq=False,
    )

    #: The site's response-header rules (``prexy.headerrules``), ``default``
    #: bound to its upstream: from its rules files, else nginx's default.
    header_rules: HeaderRules = attrs.field(
        default=attrs.Factory(lambda self: _header_rules(self.config, self.rules), takes_self=True), eq=False
    )
    #: Lower-case names of the response headers ``header_rules`` may change.
    header_names: frozenset[bytes] = attrs.field(
        default=attrs.Factory(lambda self: _header_names(self.header_rules), takes_self=True), eq=False
    )

    #: Part of every cache key: a changed rule set (body or header rules)
    #: never serves old rewrites.  Computed once (a hit reads it; the
    #: header rules' digest hashes their text).
    rules_version: str = attrs.field(
        default=attrs.Factory(lambda self: _rules_version(self.rules, self.header_rules), takes_self=True), eq=False
    )
    #: The rule set its rules files loaded as (``rules`` is None when it
    #: has header directives only): what a reload compares to reuse the site.
    loaded: RuleSet | None = attrs.field(default=None, eq=False)


def _rules_version(rules: RuleSet | None, header_rules: HeaderRules) -> str:
    version: str = rules.digest if rules is not None else ""
    headers: str = header_rules.digest
    return f"{version}+{headers}" if headers else version


def _targeted(config: SiteConfig) -> frozenset[bytes]:
    if config.cache is None:
        return frozenset()
    from prexy.cache.policy import targeted_field_names

    return targeted_field_names(config.cache)


def _header_rules(config: SiteConfig, rules: RuleSet | None) -> HeaderRules:
    from prexy.headerrules import HeaderRules

    up = config.upstream
    prefix = f"{up.scheme}://{up.host_header}{up.path}/".encode("latin-1")
    found = rules.headers if rules is not None else HeaderRules.default()
    return found.bind(prefix)


def _header_names(rules: HeaderRules) -> frozenset[bytes]:
    if not rules.active:
        return frozenset()
    names = set(rules.filter_headers)
    if not rules.redirect_off and rules.redirects:
        names |= {b"location", b"content-location", b"refresh"}
    if rules.cookie_domains or rules.cookie_paths:
        names.add(b"set-cookie")
    return frozenset(names)


def _origin_key(config: SiteConfig, ca_pem: bytes | None = None) -> OriginKey:
    up = config.upstream
    return OriginKey(up.scheme, up.host, up.port, config.upstream_ca, ca_pem)


def _load_ca(path: str, files: IFiles) -> bytes:
    """A site's ``upstream_ca`` file, read once and checked to hold PEM CA
    certificates; ConfigError when it does not."""
    import ssl

    try:
        data = files.read(path)
    except OSError as exc:
        raise ConfigError(path, None, None, f"cannot read CA file: {exc.strerror}") from None
    try:
        ssl.create_default_context(cadata=data.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(path, None, None, f"not PEM CA certificates: {exc}") from None
    return data


@attrs.frozen
class Runtime:
    """Everything one generation of the proxy serves with."""

    config: Config
    sites: tuple[SiteRuntime, ...]
    by_host: dict[str, SiteRuntime] = attrs.field(hash=False)
    default: SiteRuntime
    #: The rule sets by content this runtime's sites use (reused by the
    #: next reload); None when built with an injected rules loader.
    rulesets: RuleSets | None = attrs.field(default=None, eq=False)
    #: Every site's hosts, exact names and wildcards (:mod:`prexy.hostnames`):
    #: where a request's Host and a TLS handshake's server name are looked up.
    hosts: HostTable[SiteRuntime] = attrs.field(
        default=attrs.Factory(lambda self: HostTable((h, s) for s in self.sites for h in s.config.hosts),
                              takes_self=True),
        eq=False, hash=False,
    )

    def linear_rules(self) -> list[str]:
        """One line per rule that runs on RE2 or the sregex-order VM rather than ``regex`` (for
        ``--check``): its file and line, pattern and why, once per rules
        file even when several sites share it."""
        lines: list[str] = []
        seen: set[int] = set()
        for site in self.sites:
            rules = site.rules
            if rules is None or id(rules) in seen:
                continue
            seen.add(id(rules))
            for rule, engine, why in rules.engines():
                line = f"{rule.origin}: '{rule.pattern.decode('latin-1')}' runs on {engine}: {why}"
                if (engine in ("re2", "sregex-vm") or "RE2 refused" in why) and line not in lines:
                    lines.append(line)
        return lines

    def compile_ahead(self, limit: int) -> int:
        """Compile now every rule set the sites use that is not compiled
        yet, when there are at most ``limit`` of them (all of them: a few
        sites), so no request pays for it; with more (thousands of sites)
        each is compiled on its first request (:meth:`select`).  Returns
        how many were compiled here."""
        pending = {id(s.rules): s.rules for s in self.sites if s.rules is not None and not s.rules.compiled}
        distinct = {id(s.rules) for s in self.sites if s.rules is not None}
        if len(distinct) > limit:
            return 0
        for rules in pending.values():
            compile_ruleset(rules, ahead=True)
        return len(pending)

    def lookup(self, host: bytes | None) -> SiteRuntime:
        """The site for a Host header (port and one trailing dot ignored;
        the exact name, else the longest wildcard, else the default site),
        as it is: its rule set perhaps not compiled yet."""
        if host:
            name = host.decode("latin-1").lower()
            if name.startswith("["):
                name = name[: name.find("]") + 1]
            else:
                name = name.rsplit(":", 1)[0] if ":" in name else name
            site = self.hosts.get(name)
            if site is not None:
                return site
        return self.default

    def serving(self, name: str) -> SiteRuntime | None:
        """The site whose hosts hold ``name`` (a TLS server name), or None:
        no default site here."""
        return self.hosts.get(name)

    def select(self, host: bytes | None) -> SiteRuntime:
        """The site for a Host header (port and one trailing dot ignored),
        its rule set compiled: the first request for it in this process
        compiles it here, before the request's scans are timed."""
        site = self.lookup(host)
        rules = site.rules
        if rules is not None and not rules.compiled:
            compile_ruleset(rules)
        return site

    def site_named(self, name: str) -> SiteRuntime | None:
        """The site called ``name`` (its rule set compiled), or None."""
        for site in self.sites:
            if site.name == name:
                if site.rules is not None and not site.rules.compiled:
                    compile_ruleset(site.rules)
                return site
        return None


RuleLoader = Callable[[tuple[str, ...]], "RuleSet"]
MapLoader = Callable[[str], "UrlMap"]


def _rules_error(exc: RulesError) -> ConfigError:
    """A ``RulesError`` as the ``ConfigError`` naming its file and line."""
    if not exc.line:  # the file itself (unreadable, not UTF-8, ...)
        return ConfigError(exc.filename, None, None, exc.reason)
    reason = f"column {exc.column}: {exc.reason}"
    if exc.text and exc.text not in exc.reason:
        reason += f" (at {exc.text!r})"
    return ConfigError(exc.filename, exc.line, None, reason)


def _load_rules(paths: tuple[str, ...]) -> RuleSet:
    from prexy.substitution import RulesError, load_rules

    try:
        return load_rules(paths)
    except RulesError as exc:
        raise _rules_error(exc) from None
    except OSError as exc:
        raise ConfigError(getattr(exc, "filename", None), None, None, f"cannot read rules: {exc.strerror}") from None


def compile_ruleset(rules: RuleSet, ahead: bool = False) -> None:
    """Compile a lazily built rule set's scanner now and warm it (one
    rewrite of a sample made of its own rules: ``transducer.warm``); when
    compiled ``ahead`` of any request, thoroughly (its expansions and the
    interpreter's paths too), which a site's first request would wait for."""
    from prexy.substitution.transducer import warm

    warm(rules, thorough=ahead)


class RuleSets:
    """The rule sets of one process, by content.

    A rules file is read and hashed (SHA-256 of its bytes) each time a
    configuration is built, and parsed only when those bytes are new; a
    site's rule set is keyed by the hashes of its files in order and the
    prefilter engine (what else decides compilation), so every site naming
    the same contents shares one ``RuleSet``, compiled at most once.  Built
    from a ``previous`` store (a reload), entries whose key is unchanged
    are taken over, compiled scanner and all; the rest are dropped with
    the old runtime.

    ``lazy`` (the default) leaves compilation to first use
    (:meth:`Runtime.select`); otherwise every set is compiled as it loads.
    ``check`` also compiles each rule's pattern alone on its engine
    (``RuleSet.check_compiles``) once per file content: what the master
    and ``--check`` do, so a pattern the dialect parses but the engine
    refuses is still refused at load, with its file and line.
    ``validated``: the files' bytes were parsed and checked already (a
    worker's master did), so each pattern is parsed when its set's scanner
    is built (``prexy.substitution.dialect.DeferredRegex``), not at load.
    ``given``: rule sets loaded elsewhere, by the path of their file, with
    the digest of the bytes they were loaded from: a master's forked
    children checked them (:func:`precheck_rules`), or a worker's master
    hands them over (:meth:`portable`).  A file read here with those very
    bytes takes its given rule set (checked, with ``check``); any other is
    parsed (and checked) here.
    """

    def __init__(
        self, *, lazy: bool = True, check: bool = False, previous: RuleSets | None = None, files: IFiles = DISK,
        validated: bool = False, given: Mapping[str, tuple[bytes, RuleSet]] | None = None,
    ) -> None:
        #: Where rules files are read (:mod:`prexy.files`).
        self.files = files
        self.lazy = lazy
        self.check = check
        self.validated = validated and not check
        self.given = given if given is not None else {}
        self._files: dict[tuple[str, bytes], RuleSet] = {}
        self._sets: dict[tuple[str, tuple[bytes, ...]], RuleSet] = {}
        self._old_files = previous._files if previous is not None else {}
        self._old_sets = previous._sets if previous is not None else {}
        self._checked: set[tuple[str, bytes]] = set(previous._checked) if previous is not None else set()
        #: Rules files parsed (new contents) and sites' rule sets new in this store.
        self.parsed = 0
        self.made = 0

    def load(self, paths: tuple[str, ...]) -> RuleSet:
        """The rule set of these files in this order; ConfigError (file:line)
        when one does not load."""
        from prexy.headerrules import HeaderRulesConflict
        from prexy.substitution import RulesError, parse_rules, prefilter
        from prexy.substitution.ruleset import CompileError, RuleSet

        engine = prefilter.ENGINE
        sets = []
        digests = []
        parsed_before = self.parsed
        for path in paths:
            try:
                data = self.files.read(path)
            except OSError as exc:
                raise ConfigError(path, None, None, f"cannot read rules: {exc.strerror}") from None
            key = (engine, hashlib.sha256(data).digest())
            given = self.given.get(path)
            if given is not None and given[0] != key[1]:
                given = None  # (other bytes than those it was loaded from)
            ruleset = self._files.get(key) or self._old_files.get(key)
            if ruleset is None:
                if given is not None:
                    ruleset = given[1]
                else:
                    try:
                        ruleset = parse_rules(data, path, lazy=True, checked=self.validated)
                    except RulesError as exc:
                        raise _rules_error(exc) from None
                self.parsed += 1
            if given is not None:
                self._checked.add(key)
            if self.check and key not in self._checked:
                try:
                    ruleset.check_compiles()
                except CompileError as exc:
                    where, _, line = exc.rule.origin.rpartition(":")
                    raise ConfigError(where or path, int(line) if line.isdigit() else None, None,
                                      f"pattern '{exc.rule.pattern.decode('latin-1')}': {exc.reason}") from None
                self._checked.add(key)
            self._files[key] = ruleset
            sets.append(ruleset)
            digests.append(key[1])
        combined: RuleSet | None
        if len(sets) == 1:
            combined = sets[0]
            if self.parsed > parsed_before:
                self.made += 1
        else:
            set_key = (engine, tuple(digests))
            combined = self._sets.get(set_key) or self._old_sets.get(set_key)
            if combined is None:
                try:
                    combined = RuleSet.combine(sets, lazy=True)
                except HeaderRulesConflict as exc:
                    names = ", ".join(paths)
                    raise ConfigError(names, None, None, str(exc)) from None
                self.made += 1
            self._sets[set_key] = combined
        if not self.lazy and not combined.compiled:
            compile_ruleset(combined)
        return combined

    def portable(self) -> dict[str, tuple[bytes, RuleSet]]:
        """The rule sets of the rules files in use, as ``given`` takes them
        (by the path each was parsed from, with the digest of its bytes), as
        validated files' (each pattern parsed again when its scanner is
        built: parsed trees and compiled scanners are what would cost to
        pass on): what a master hands a new worker with its configuration,
        so the worker parses no rules file the master parsed."""
        out: dict[str, tuple[bytes, RuleSet]] = {}
        for (_engine, digest), ruleset in self._files.items():
            if ruleset.rules:  # (one without rules costs nothing to parse)
                out[ruleset.rules[0].file] = (digest, _deferred(ruleset))
        return out

    def compiled(self) -> int:
        """How many of the rule sets in use have a compiled scanner."""
        used = {id(s): s for s in (*self._files.values(), *self._sets.values()) if s.rules}
        return sum(1 for s in used.values() if s.compiled)

    def done(self) -> None:
        """Forget the previous store's entries (the build is over), and
        which contents were checked but are no longer in use."""
        self._old_files = {}
        self._old_sets = {}
        self._checked &= set(self._files)


def precheck_rules(path: str) -> tuple[bytes, RuleSet]:
    """The SHA-256 digest of the rules file at ``path`` (read from the
    disk) once it parsed and every pattern compiled on its engine, as a
    checking :class:`RuleSets` would, and its rule set as a validated
    file's (each pattern parsed again when its scanner is built: the
    parsed trees are what would cost to pass on); raises when it does not
    load.  A master's start has forked processes do this (``prexy.forked``)
    while it reads the site files: its own ``RuleSets`` takes the rule
    sets of the files whose bytes it reads are those checked (``given``)."""
    from prexy.substitution import parse_rules

    with open(path, "rb") as f:
        data = f.read()
    ruleset = parse_rules(data, path, lazy=True)
    ruleset.check_compiles()
    return hashlib.sha256(data).digest(), _deferred(ruleset)


def _deferred(ruleset: RuleSet) -> RuleSet:
    """``ruleset`` as ``parse_rules(..., checked=True)`` gives it (each
    pattern a ``DeferredRegex`` not parsed yet, no scanner), without
    parsing again: itself when it is that already."""
    import dataclasses

    from prexy.substitution.dialect import DeferredRegex

    if "scanner" not in ruleset.__dict__ and all(
        type(r.parsed) is DeferredRegex and r.parsed.__dict__["_parsed"] is None for r in ruleset.rules
    ):
        return ruleset
    rules = tuple(dataclasses.replace(r, parsed=DeferredRegex(r.pattern, r.caseless)) for r in ruleset.rules)
    return dataclasses.replace(ruleset, rules=rules)


def rules_checker() -> Callable[[str], tuple[bytes, RuleSet]]:
    """:func:`precheck_rules`, its modules imported (before a pool forks:
    once, not in each child)."""
    import prexy.substitution.rules  # noqa: F401

    return precheck_rules


def _load_map(path: str, files: IFiles = DISK) -> UrlMap:
    from prexy.urlmap import MapError, load_map

    try:
        return load_map(path, files)
    except MapError as exc:
        reason = exc.reason
        if exc.text:
            reason += f' "{exc.text}"'
        if exc.detail:
            reason += f": {exc.detail}"
        raise ConfigError(exc.filename, exc.line, None, reason) from None
    except OSError as exc:
        raise ConfigError(path, None, None, f"cannot read map: {exc.strerror}") from None


def build_runtime(
    config: Config,
    load_rules: RuleLoader | None = None,
    load_map: MapLoader | None = None,
    previous: Runtime | None = None,
    *,
    lazy: bool = True,
    check: bool = False,
    files: IFiles = DISK,
    validated: bool = False,
    given: Mapping[str, tuple[bytes, RuleSet]] | None = None,
) -> Runtime:
    """Load every site's rules and maps; raise ConfigError on any failure.

    Rules go through a :class:`RuleSets` store (``lazy`` and ``check`` are
    its options), which takes over ``previous``'s rule sets whose files
    hold the same bytes; maps whose files did not change since
    ``previous`` are reused rather than loaded again.  Each site's
    ``upstream_ca`` file is read and checked here too, and its bytes kept
    in the site's origin key (the upstream pool trusts those).  Every file
    is read through ``files`` (:mod:`prexy.files`: the disk, or a master's
    snapshot).  An injected ``load_rules`` (tests) replaces the store.
    ``validated``: the master validated these bytes (a worker's build), so
    patterns are parsed when first compiled (``RuleSets``); ``given``: rule
    sets loaded elsewhere already (``RuleSets``).
    """
    store: RuleSets | None = None
    if load_rules is None:
        store = RuleSets(
            lazy=lazy, check=check, previous=previous.rulesets if previous is not None else None, files=files,
            validated=validated, given=given,
        )
        load_rules = store.load
    if load_map is None:
        def load_map(path: str) -> UrlMap:
            return _load_map(path, files)
    reuse_maps: dict[str, UrlMap] = {}
    previous_sites = {s.name: s for s in previous.sites} if previous is not None else {}
    if previous is not None:
        for s in previous.sites:
            if s.urlmap is not None and s.config.map is not None and _unchanged(s.urlmap, files):
                reuse_maps[s.config.map.path] = s.urlmap
    compiled: dict[tuple[str, ...], RuleSet] = {}
    cas: dict[str, bytes] = {}
    bound: dict[tuple[int, UpstreamURL], tuple[HeaderRules, frozenset[bytes], str]] = {}
    sites = []
    for site in config.sites:
        loaded = None
        if site.rules:
            if site.rules not in compiled:
                compiled[site.rules] = load_rules(site.rules)
            loaded = compiled[site.rules]
        urlmap = None
        if site.map is not None:
            urlmap = reuse_maps.get(site.map.path)
            if urlmap is None:  # (loaded once, however many sites name it)
                urlmap = reuse_maps[site.map.path] = load_map(site.map.path)
        ca_pem = None
        if site.upstream_ca is not None:
            if site.upstream_ca not in cas:
                cas[site.upstream_ca] = _load_ca(site.upstream_ca, files)
            ca_pem = cas[site.upstream_ca]
        origin_key = _origin_key(site, ca_pem)
        before = previous_sites.get(site.name)
        if (
            before is not None and before.loaded is loaded and before.urlmap is urlmap
            and (before.config is site or before.config == site) and before.origin_key == origin_key
        ):
            sites.append(before)  # unchanged: its header rules, digests and all
            continue
        # With header directives only, bodies pass untouched.
        rules = loaded if loaded is not None and loaded.rules else None
        # Header rules bound (and the digests taken) once per rule set and
        # upstream, not per site.
        bind_key = (id(loaded), site.upstream)
        if bind_key not in bound:
            header_rules = _header_rules(site, loaded)
            bound[bind_key] = (header_rules, _header_names(header_rules), _rules_version(rules, header_rules))
        header_rules, header_names, version = bound[bind_key]
        sites.append(SiteRuntime(site, rules, urlmap, origin_key=origin_key, header_rules=header_rules,
                                 header_names=header_names, rules_version=version, loaded=loaded))
    by_host = {h: s for s in sites for h in s.config.hosts}
    default = next(s for s in sites if s.name == config.default_site)
    if store is not None:
        store.done()
    return Runtime(config, tuple(sites), by_host, default, store)


def reloads_in_place(old: Config, new: Config) -> bool:
    """Whether a running worker can take ``new`` in place of ``old`` by
    building a new runtime (``ProxyService.reload``): when they differ in
    their sites only (sites, default site, the site files included).  Any
    other change (listeners, workers, cache, timeouts, limits, the server's
    compression, the [server] certificate's files, HTTP/2, cluster) starts a
    new generation of workers (renewed certificate bytes in the same files
    are swapped in place: ``ProxyService.reload``)."""
    return attrs.evolve(new, sites=old.sites, default_site=old.default_site, included=old.included) == old


def _unchanged(loaded: UrlMap, files: IFiles = DISK) -> bool:
    """Whether the files a loaded map came from still hold the bytes they
    held when it was read (their digests, read through ``files``): an edit
    goes live on the next reload even within the same modification-time
    tick."""
    from prexy.urlmap.index import source_digest

    sources = getattr(loaded, "source_files", None)
    if not sources:
        return False
    try:
        return all(source_digest(source.path, files) == source.digest for source in sources)
    except OSError:
        return False
