"""What a running proxy serves with: a validated Config plus the compiled
rules and loaded maps of each site, and the Host-header router.

Built once per (re)load, before anything is swapped in: a rules or map file
that does not load makes ``build_runtime`` raise ``ConfigError`` naming the
file and line, so ``--check``, start-up and reload share one code path and a
broken file never replaces a working runtime.  No Twisted here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from prexy.config import Config, ConfigError, OriginKey, SiteConfig


@attrs.frozen
class SiteRuntime:
    """One site, ready to serve: config plus compiled rules and map."""

    config: SiteConfig
    rules: Any = None  # prexy.substitution RuleSet, or None
    urlmap: Any = None  # prexy.urlmap UrlMap, or None
    #: The upstream connection pool's key for this site.
    origin_key: Any = attrs.field(
        default=attrs.Factory(lambda self: _origin_key(self.config), takes_self=True), eq=False
    )
    #: The site's cache settings (its config's ``CachePolicy``) when it is
    #: cached, else None.  Typed Any: the proxy reads it only where the site
    #: is known to be cached.
    cache_policy: Any = attrs.field(
        default=attrs.Factory(lambda self: self.config.cache, takes_self=True), eq=False
    )
    #: Response fields meant for this proxy alone (its targeted
    #: Cache-Control field): never sent to clients nor stored.
    targeted: frozenset[bytes] = attrs.field(
        default=attrs.Factory(lambda self: _targeted(self.config), takes_self=True), eq=False
    )
    #: The site's name as bytes (part of every rule-applicability key).
    name_bytes: bytes = attrs.field(
        default=attrs.Factory(lambda self: self.config.name.encode("utf-8", "surrogateescape"), takes_self=True),
        eq=False,
    )

    #: The site's response-header rules (``prexy.headerrules``), ``default``
    #: bound to its upstream: from its rules files, else nginx's default.
    header_rules: Any = attrs.field(
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

    @property
    def name(self) -> str:
        return self.config.name


def _rules_version(rules: Any, header_rules: Any) -> str:
    version: str = rules.digest if rules is not None else ""
    headers: str = header_rules.digest
    return f"{version}+{headers}" if headers else version


def _targeted(config: SiteConfig) -> frozenset[bytes]:
    if config.cache is None:
        return frozenset()
    from prexy.cache.policy import targeted_field_names

    return targeted_field_names(config.cache)


def _header_rules(config: SiteConfig, rules: Any) -> Any:
    from prexy.headerrules import HeaderRules

    up = config.upstream
    prefix = f"{up.scheme}://{up.host_header}{up.path}/".encode("latin-1")
    found = getattr(rules, "headers", None)
    return (found if found is not None else HeaderRules.default()).bind(prefix)


def _header_names(rules: Any) -> frozenset[bytes]:
    if not rules.active:
        return frozenset()
    names = set(rules.filter_headers)
    if not rules.redirect_off and rules.redirects:
        names |= {b"location", b"content-location", b"refresh"}
    if rules.cookie_domains or rules.cookie_paths:
        names.add(b"set-cookie")
    return frozenset(names)


def _origin_key(config: SiteConfig) -> OriginKey:
    up = config.upstream
    return OriginKey(up.scheme, up.host, up.port, config.upstream_ca)


@attrs.frozen
class Runtime:
    """Everything one generation of the proxy serves with."""

    config: Config
    sites: tuple[SiteRuntime, ...]
    by_host: dict[str, SiteRuntime] = attrs.field(hash=False)
    default: SiteRuntime

    def linear_rules(self) -> list[str]:
        """One line per rule that runs on RE2 rather than ``regex`` (for
        ``--check``): its file and line, pattern and why, once per rules
        file even when several sites share it."""
        lines: list[str] = []
        seen: set[int] = set()
        for site in self.sites:
            rules = site.rules
            if rules is None or id(rules) in seen:
                continue
            seen.add(id(rules))
            refused = rules.scanner.linear_refused if rules.scanner is not None else {}
            for k, (rule, engine, why) in enumerate(rules.engines()):
                if engine == "re2" or k in refused:
                    lines.append(
                        f"{rule.origin}: '{rule.pattern.decode('latin-1')}' runs on {engine}: {why}"
                    )
        return lines

    def with_maps(self, maps: dict[str, Any]) -> Runtime:
        """A copy whose sites use the given freshly loaded maps (by path)."""
        sites = tuple(
            attrs.evolve(s, urlmap=maps[s.config.map.path])
            if s.config.map is not None and s.config.map.path in maps
            else s
            for s in self.sites
        )
        by_host = {h: s for s in sites for h in s.config.hosts}
        default = next(s for s in sites if s.name == self.config.default_site)
        return Runtime(self.config, sites, by_host, default)

    def select(self, host: bytes | None) -> SiteRuntime:
        """The site for a Host header (port and one trailing dot ignored)."""
        if host:
            name = host.decode("latin-1").lower()
            if name.startswith("["):
                name = name[: name.find("]") + 1]
            else:
                name = name.rsplit(":", 1)[0] if ":" in name else name
            site = self.by_host.get(name.rstrip("."))
            if site is not None:
                return site
        return self.default


RuleLoader = Callable[[tuple[str, ...]], Any]
MapLoader = Callable[[str], Any]


def _load_rules(paths: tuple[str, ...]) -> Any:
    from prexy.substitution import RulesError, load_rules

    try:
        return load_rules(paths)
    except RulesError as exc:
        if not exc.line:  # the file itself (unreadable, not UTF-8, ...)
            raise ConfigError(exc.filename, None, None, exc.reason) from None
        reason = f"column {exc.column}: {exc.reason}"
        if exc.text and exc.text not in exc.reason:
            reason += f" (at {exc.text!r})"
        raise ConfigError(exc.filename, exc.line, None, reason) from None
    except OSError as exc:
        raise ConfigError(getattr(exc, "filename", None), None, None, f"cannot read rules: {exc.strerror}") from None


def _load_map(path: str) -> Any:
    from prexy.urlmap import MapError, load_map

    try:
        return load_map(path)
    except MapError as exc:
        reason = exc.reason
        if exc.text:
            reason += f' "{exc.text}"'
        if exc.detail:
            reason += f": {exc.detail}"
        raise ConfigError(exc.filename, exc.line, None, reason) from None
    except OSError as exc:
        raise ConfigError(path, None, None, f"cannot read map: {exc.strerror}") from None


def load_map_checked(path: str) -> Any:
    """Load a map file; ConfigError (file:line) when it does not load."""
    return _load_map(path)


def map_changed(urlmap: Any) -> bool:
    """Whether any file a loaded map came from changed since (or vanished)."""
    return not _unchanged(urlmap) and bool(getattr(urlmap, "source_files", None))


def build_runtime(
    config: Config,
    load_rules: RuleLoader = _load_rules,
    load_map: MapLoader = _load_map,
    previous: Runtime | None = None,
) -> Runtime:
    """Compile every site's rules and maps; raise ConfigError on any failure.

    Rule sets and maps whose files did not change since ``previous`` are
    reused rather than compiled again.
    """
    reuse_rules: dict[tuple[str, ...], Any] = {}
    reuse_maps: dict[str, Any] = {}
    if previous is not None:
        for s in previous.sites:
            if s.rules is not None and _unchanged(s.rules):
                reuse_rules[s.config.rules] = s.rules
            if s.urlmap is not None and s.config.map is not None and _unchanged(s.urlmap):
                reuse_maps[s.config.map.path] = s.urlmap
    compiled: dict[tuple[str, ...], Any] = {}
    sites = []
    for site in config.sites:
        rules = None
        header_rules = _header_rules(site, None)
        if site.rules:
            if site.rules not in compiled:
                compiled[site.rules] = reuse_rules.get(site.rules) or load_rules(site.rules)
            rules = compiled[site.rules]
            header_rules = _header_rules(site, rules)
            if not rules.rules:
                rules = None  # header directives only: bodies pass untouched
        urlmap = None
        if site.map is not None:
            urlmap = reuse_maps.get(site.map.path) or load_map(site.map.path)
        sites.append(SiteRuntime(site, rules, urlmap, header_rules=header_rules))
    by_host = {h: s for s in sites for h in s.config.hosts}
    default = next(s for s in sites if s.name == config.default_site)
    return Runtime(config, tuple(sites), by_host, default)


def _unchanged(loaded: Any) -> bool:
    """Whether the files a loaded object came from still have their mtimes."""
    import os

    sources = getattr(loaded, "source_files", None)
    if not sources:
        return False
    for source in sources:
        path, mtime = (source.path, source.mtime) if hasattr(source, "path") else source
        try:
            if os.stat(path).st_mtime != mtime:
                return False
        except OSError:
            return False
    return True
