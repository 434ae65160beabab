"""``twistd prexy``: command-line options and the service they describe.

The options resolve to one frozen ``Config`` (from ``--config FILE``, from the
single-site flags, or the built-in ``--demo``), which is validated and
compiled into a ``Runtime`` before twistd daemonises, so a broken config is
refused up front with its file and line.  ``--check`` stops there, like
``nginx -t``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.application import service
from twisted.logger import Logger
from twisted.python import usage

from prexy import collector, signals
from prexy.config import (
    Config,
    ConfigError,
    ConfigMemo,
    load_config,
    parse_size,
    single_site_config,
)
from prexy.files import DISK, IFiles, Recorder
from prexy.forked import Pool
from prexy.listen import (
    ListenError,
    ListeningService,
    ListenSpec,
    adopt,
    listening_service,
    split_endpoint,
    tls_files,
)
from prexy.observe.stats import Aggregate, Observer
from prexy.observing import OperatorView, TapPump
from prexy.runtime import Runtime, build_runtime, rules_checker

if TYPE_CHECKING:
    from prexy.workers import Validated

log = Logger()

#: A worker compiles every rule set its sites use before it serves (and a
#: reload before it swaps the new ones in) when there are at most this many
#: distinct ones, so the first request for a site is as fast as the next;
#: with more (thousands of sites) each set is compiled
#: by its site's first request in the worker.  Measured for the realistic
#: clone sets: 7 / 44 / 409 ms at 10 / 100 / 1000 rules, about 20 ms for 20.
COMPILE_AHEAD = 64


class ConfigRefused(SystemExit):
    """A configuration that does not load, given on the command line: twistd
    exits 1 printing only ``prexy: FILE:LINE: reason`` (and ``then``, a
    line saying what was not done), not the usage text a mistyped option
    gets.  ``str()`` is the error alone, for a reload's answer."""

    def __init__(self, error: ConfigError, then: str = "") -> None:
        lines = f"prexy: {error}" + (f"\nprexy: {then}" if then else "")
        super().__init__(lines)
        self.error = error

    def __str__(self) -> str:
        return str(self.error)


class Options(usage.Options):
    """Options of ``twistd prexy``."""

    synopsis = (
        "[--demo | --config FILE [--check] | --listen ENDPOINT --upstream URL "
        "[--rules FILE] [--map FILE] [--cache-size SIZE]] [--workers N]"
    )
    longdesc = (
        "Prexy, a streaming rewriting reverse proxy. Run a whole configuration "
        "from a TOML file with --config, one site from the command line with "
        "--listen/--upstream, or the built-in demonstration with --demo."
    )
    optFlags = [
        ["demo", None, "Run a built-in origin and Prexy in front of it on 127.0.0.1:8080."],
        ["check", None, "Validate the configuration (and its rules and maps), then exit 0 or 1."],
        ["reload", None, "Ask the running Prexy (through its admin endpoint) to reload, then exit."],
        ["cluster", None, "With --reload: reload every node of the cluster ([cluster] in the config)."],
    ]
    optParameters = [
        ["config", "c", None, "TOML configuration file."],
        ["upstream", "u", None, "Upstream URL for a single site without a config file."],
        ["map", "m", None, "nginx map file for the single site (redirects old URLs)."],
        ["cache-size", None, None, "Enable the cache with this size (e.g. 256M)."],
        ["workers", "w", None, "Worker processes sharing the port (default: CPUs; 0 = in-process)."],
        ["admin", None, None, "Admin endpoint (health, metrics), e.g. tcp:9080:interface=127.0.0.1."],
        ["host-header", None, "pass", "Host sent upstream: pass, upstream, or a literal name."],
    ]

    #: Whether loading compiles each rule's pattern to validate it (see
    #: ``RuleSets``): the master, ``--check`` and a single process do; a
    #: worker, whose master checked the same files, only parses them.
    check_rules = True

    def __init__(self) -> None:
        super().__init__()
        self["listen"] = []
        self["rules"] = []
        self.argv: list[str] = []
        #: What a later load of the same files may reuse: the site files
        #: parsed (``ConfigMemo``) and the runtime built before (its rule
        #: sets, by content).  ``ConfigLoader`` carries both across reloads.
        self.memo = ConfigMemo()
        self.previous: Runtime | None = None
        #: Where every file is read (``prexy.files``): the disk, through a
        #: recorder whose snapshot a master hands its workers; a worker
        #: sets its master's snapshot here.
        self.files: IFiles = Recorder()

    def parseOptions(self, options: Any = None) -> None:
        # Keep the command line: workers and reloads parse it again.
        self.argv = list(sys.argv[1:] if options is None else options)
        super().parseOptions(options)

    def opt_listen(self, endpoint: str) -> None:
        """Listen endpoint (Twisted endpoint string), e.g. tcp:8080:interface=127.0.0.1.
        May be repeated."""
        self["listen"].append(endpoint)

    def opt_rules(self, path: str) -> None:
        """replace_filter rules file for the single site. May be repeated."""
        self["rules"].append(path)

    opt_l = opt_listen
    opt_r = opt_rules

    def opt_version(self) -> None:
        """Print Prexy's version and exit."""
        from prexy import __version__

        sys.stdout.write(f"prexy {__version__}\n")
        raise SystemExit(0)

    def postOptions(self) -> None:
        if self["reload"]:
            # The running Prexy validates the files itself, rules and maps
            # included, and answers with the error; here only the admin
            # endpoint is needed.
            try:
                config = self._config()
            except ConfigError as exc:
                raise ConfigRefused(exc, "reload not requested") from None
            raise SystemExit(request_reload(config, everywhere=bool(self["cluster"])))
        # Loaded by twistd's command line (a sub-command's options have a
        # parent): the process's start, whose objects are frozen as it ends,
        # and whose rules files (hundreds, with thousands of sites) are
        # checked by forked processes while the site files load: what they
        # found is a hint that the serial checks below take or redo.
        start = getattr(self, "parent", None) is not None and self.previous is None
        pool = Pool.for_this_machine(rules_checker()) if start and self.check_rules else None
        try:
            with collector.paused(settle=start):
                config = self._config(rules_named=pool.submit if pool is not None else None)
                checked = pool.results() if pool is not None else None
                runtime = build_runtime(config, previous=self.previous, check=self.check_rules, files=self.files,
                                        given=checked)
                #: The ssl: listeners' key and certificate files (PEM bytes by path).
                self.tls = tls_files(config.listen_endpoints(), self.files)
        except ConfigError as exc:
            raise ConfigRefused(exc, "configuration test failed" if self["check"] else "") from None
        finally:
            if pool is not None:
                pool.close()
        if self["check"]:
            source = config.source or "command line"
            files = f" ({len(config.included)} site file(s) included)" if config.included else ""
            own = sum(1 for site in config.sites if site.certificate is not None)
            if own:
                files += f", {own} with a certificate of its own"
            if config.acme is not None:
                acme_sites = config.acme_sites()
                listed = sum(1 for hosts in acme_sites.values() for h in hosts if not h.startswith("*."))
                files += (f", {len(acme_sites)} on ACME ({listed} listed name(s), from {config.acme.directory},"
                          f" stored in {config.acme.storage})")
            sys.stdout.write(
                f"prexy: configuration {source} is ok: {len(config.sites)} site(s){files}, "
                f"listening on {', '.join(config.listen)}\n"
            )
            for line in runtime.linear_rules():
                sys.stdout.write(f"prexy: {line}\n")
            raise SystemExit(0)
        self.config = config
        self.runtime = runtime

    def _config(self, rules_named: Callable[[str], None] | None = None) -> Config:
        modes = sum(bool(x) for x in (self["demo"], self["config"], self["upstream"]))
        if modes != 1:
            raise usage.UsageError("give exactly one of --demo, --config FILE, or --upstream URL")
        workers = None
        if self["workers"] is not None:
            try:
                workers = int(self["workers"])
                if workers < 0:
                    raise ValueError
            except ValueError:
                raise usage.UsageError(f"--workers must be 0 or more, got {self['workers']!r}") from None
        cache_size = 0
        if self["cache-size"]:
            try:
                cache_size = parse_size(self["cache-size"])
            except ValueError as exc:
                raise usage.UsageError(f"--cache-size: {exc}") from None
        if self["demo"]:
            from prexy.demo import demo_config

            return demo_config(workers=workers)
        if self["config"]:
            if self["listen"] or self["rules"] or self["map"]:
                raise usage.UsageError("--listen/--rules/--map go without --config (put them in the file)")
            # The master and --check check that certificates are valid
            # now; a worker loads what its master validated.
            now = time.time() if self.check_rules else None
            config = load_config(self["config"], self.memo, self.files, now, rules_named)
            if workers is not None:
                import attrs

                config = attrs.evolve(config, workers=workers)
            return config
        return single_site_config(
            listen=self["listen"],
            upstream=self["upstream"],
            rules=self["rules"],
            map_path=self["map"],
            cache_size=cache_size,
            admin=self["admin"],
            workers=workers,
            host_header=self["host-header"],
            files=self.files,
        )


def config_from_argv(argv: Sequence[str]) -> Config:
    """The ``Config`` a ``twistd prexy`` command line gives, checked exactly as
    at startup (rules and maps compiled); raises ``UsageError`` (or
    ``SystemExit`` for ``--check``/``--reload``) when it does not load.  The
    master calls this to validate a reload."""
    options = Options()
    options.parseOptions(list(argv))
    config: Config = options.config
    return config


class ConfigLoader:
    """``config_from_argv`` for a process that loads the same command line
    again and again (the master, on every reload): it keeps the site files
    parsed and the runtime built last time, so a reload parses, checks and
    builds only what changed (thousands of site files).  Each
    load is recorded (``files``, a ``prexy.files.Recorder``): it gives the
    configuration with the snapshot of the files it was validated from,
    which is what the workers load."""

    def __init__(
        self, memo: ConfigMemo | None = None, runtime: Runtime | None = None, files: Recorder | None = None
    ) -> None:
        self.memo = memo if memo is not None else ConfigMemo()
        self.runtime = runtime
        self.files = files if files is not None else Recorder()

    def __call__(self, argv: Sequence[str]) -> Validated:

        options = Options()
        options.memo = self.memo
        options.previous = self.runtime
        options.files = self.files
        self.files.begin()
        options.parseOptions(list(argv))
        self.runtime = options.runtime
        config: Config = options.config
        return self.validated(config, options.tls)

    def validated(self, config: Config, tls: dict[str, bytes]) -> Validated:
        """``config``, just loaded through ``files``, with the files its
        runtime is built from: the snapshot of the load less the main file
        and the site files, which the workers are handed parsed
        (``prexy.handoff``)."""
        from prexy.workers import Validated

        own = (config.source,) if config.source else ()
        rulesets = self.runtime.rulesets if self.runtime is not None and self.runtime.config is config else None
        return Validated(config, self.files.snapshot().without((*own, *config.included)), tls, rulesets)


def open_cache(reactor: Any, config: Config, metrics: Any, memos: Any = None) -> Any:
    """The worker's view of the machine-wide cache store; ``memos``: the
    process's memo budget (``prexy.cache.memo.Memos``), which the store's
    decoded objects and the compressed variants draw on."""
    from prexy.cache import Store
    from prexy.cache.paths import default_cache_path
    from prexy.proxy.caching import CacheLayer
    from prexy.proxy.events import KeyEvents

    path = config.cache_path or default_cache_path()
    # (The three memos' keys differ in shape: each part's go in as they are.)
    objects = memos.part("objects", own_keys=True) if memos is not None else None
    store = Store.open(path, config.cache_size, clock=reactor.seconds, memo=objects)
    log.info("cache: {size} bytes in {path}", size=config.cache_size, path=path)
    # Notices between workers that a fetch is over, beside the store.
    events = KeyEvents(reactor, path + ".events", str(os.getpid()))
    events.start()
    return CacheLayer(reactor, store, metrics, events, memos)


def request_reload(config: Config, everywhere: bool = False) -> int:
    """POST /reload to the admin endpoint the config names (``?cluster=1``
    with ``everywhere``: every node of the cluster); exit status."""
    import urllib.error
    import urllib.request

    from prexy.listen import split_endpoint

    if not config.admin:
        sys.stderr.write("prexy: --reload needs an admin endpoint ([server] admin or --admin)\n")
        return 1
    kind, args, kw = split_endpoint(config.admin)
    if kind not in ("tcp", "tcp6") or not args:
        sys.stderr.write(f"prexy: --reload cannot reach admin endpoint {config.admin!r}\n")
        return 1
    host = kw.get("interface", "127.0.0.1")
    host = "127.0.0.1" if host in ("", "0.0.0.0") else ("::1" if host == "::" else host)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{args[0]}/reload"
    if everywhere:
        url += "?cluster=1"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=60) as answer:
            sys.stdout.write(answer.read().decode("utf-8", "replace"))
            return 0
    except urllib.error.HTTPError as exc:
        sys.stderr.write("prexy: " + exc.read().decode("utf-8", "replace"))
        return 1
    except OSError as exc:
        sys.stderr.write(f"prexy: cannot reach {url}: {exc}\n")
        return 1


class ProxyService(service.MultiService):
    """Listening ports, the upstream pool and the resource of one process.

    ``reload()`` re-reads the config file and swaps the runtime only when
    everything in it loads; on any error the old runtime keeps serving.
    Rules and map files are read at start-up and on a reload only: a file
    edited in place goes live when the operator reloads, validated first.
    """

    def __init__(
        self,
        reactor: Any,
        config: Config,
        runtime: Runtime,
        inherited: Sequence[tuple[ListenSpec, int]] = (),
        check_rules: bool = True,
        memo: ConfigMemo | None = None,
        files: IFiles = DISK,
        tls: dict[str, bytes] | None = None,
    ) -> None:
        super().__init__()
        #: The inherited ssl: sockets' keys and certificates (PEM by path),
        #: as the master validated them; None: read their files.
        self.tls = tls
        #: Where a reload reads the files (``prexy.files``); a worker's
        #: master hands it a snapshot with each reload instead.
        self.files = files
        self._inherited = list(inherited)
        #: The listeners' names, in the order of the endpoints they were
        #: made for (an inherited socket's description is its master's).
        self._listener_names = [spec.description for spec, _ in inherited] or list(config.listen_endpoints())
        #: A worker of a pool (given its listening sockets): its master
        #: decides reloads.
        self.worker = bool(inherited)
        #: Passed to ``build_runtime`` on reload (see ``Options.check_rules``).
        self.check_rules = check_rules
        #: The site files parsed so far, for a reload to reuse.
        self.memo = memo if memo is not None else ConfigMemo()
        self.last_reload_error = ""
        self._adopted: list[Any] = []
        self._draining = False
        self._cluster_cache: Any = None
        from prexy.metrics import Metrics
        from prexy.proxy.pool import UpstreamPool
        from prexy.proxy.resource import ProxyResource, ProxySite

        self.reactor = reactor
        self.config = config
        self.metrics = Metrics()
        #: Per-site and per-rule counters (prexy.observe), the live log's
        #: tap, and, for the admin endpoint of a process alone, their sums
        #: and the log's readers (a worker's master has those).
        self.observer = Observer()
        self.pump = TapPump(reactor, self.observer, self._log_records)
        self.view = OperatorView(self.pump.set_filters, config.observe.never_matched_window, reactor.seconds())
        self.pool = UpstreamPool(reactor, config.timeouts, limits=config.limits)
        runtime.compile_ahead(COMPILE_AHEAD)
        from prexy.cache.memo import Memos

        self.resource = ProxyResource(
            reactor, self.pool, runtime, self.metrics, timer=time.perf_counter, observer=self.observer,
            memos=Memos(config.memo_size), applicability_memory=config.applicability_memory,
        )
        self.site = ProxySite(
            self.resource, config.max_request_body, self.metrics, reactor=reactor,
            limits=config.limits, timeouts=config.timeouts,
        )
        self.site.h2_settings = config.http2_settings
        self.access_log = None
        if config.access_log is None:
            self.site.log = lambda request: None  # type: ignore[method-assign]
        else:
            from prexy.accesslog import AccessLog

            self.access_log = AccessLog(reactor, config.access_log, config.access_log_format)
            self.site.log = self.access_log.log  # type: ignore[method-assign]
        from prexy.sni import ServerCertificates

        #: The ssl: listeners' certificates, the sites' chosen by SNI.
        self.certificates = ServerCertificates(alpn=config.http2, count=self.metrics.count)
        #: The issuer of automatic certificates (prexy.acme.service.AcmeService),
        #: in the process that runs alone (workers = 0); a pool's master runs it.
        self.acme: Any = None
        if config.acme is not None:
            self._use_acme(config, issue=not inherited)
        self.certificates.update(runtime, refuse=config.tls_unknown == "refuse")
        if not inherited:
            for desc in config.listen_endpoints():
                listening_service(
                    reactor, desc, self._factory_for(desc), self.certificates, self.tls
                ).setServiceParent(self)
        if config.admin and not inherited:
            from prexy.admin import admin_service

            admin_service(reactor, config.admin, self).setServiceParent(self)
        #: This node's link to the fleet (prexy.cluster) when it runs alone
        #: (workers = 0); in a pool the master holds it.
        self.cluster: Any = None
        self.announce: Any = None
        if config.cluster is not None and not inherited:
            from prexy.cluster.node import node_service

            self.cluster = node_service(reactor, config, self.metrics, self.cache_store, self.reload)
            self.cluster.setServiceParent(self)
            self.announce = self.cluster.publish
            if self.acme is not None:  # one order per name across the fleet
                self.acme.share_through(self.cluster)

    def _use_acme(self, config: Config, issue: bool) -> None:
        """Serve the ACME sites' stored certificates and answer the
        challenges; ``issue``: this process also orders them."""
        from prexy.acme.service import acme_service, challenge_registry

        acme = config.acme
        assert acme is not None
        if issue:
            self.acme = acme_service(self.reactor, acme, config.acme_sites())
            self.acme.setServiceParent(self)
            registry = self.acme.registry
        else:
            registry = challenge_registry(acme)
        self.certificates.use_acme(acme.storage, registry if "tls-alpn-01" in acme.challenges else None)
        if acme.ask is not None:  # names under wildcard hosts issued at their first handshake
            from prexy.ondemand import OnDemand

            on_demand = self.certificates.on_demand = OnDemand(
                self.reactor, self.certificates, acme.on_demand_timeout, self.metrics.count
            )
            if self.acme is not None:  # (a worker asks its master: prexy.worker)
                issuer = self.acme

                def request(name: str) -> None:
                    issuer.on_demand(name).addCallback(lambda issued: on_demand.answered(name, issued))

                on_demand.request = request
        if "http-01" in acme.challenges:
            self.resource.challenges = registry
        if self.acme is not None:
            contexts = self.certificates.acme
            self.acme.manager.watch(lambda name, stored: contexts.forget(name))
            from prexy.acme.service import stored_line
            from prexy.workers import sd_notify

            self.acme.manager.watch(lambda name, stored: stored_line(name, stored, sd_notify))

    def certificate_stored(self, name: str) -> None:
        """The issuing process stored ``name``'s certificate: the next
        handshake for it reads the new one."""
        if self.certificates.acme is not None:
            self.certificates.acme.forget(name)
        if self.certificates.on_demand is not None:
            self.certificates.on_demand.answered(name, True)

    def no_certificate(self, name: str) -> None:
        """The issuing process has no certificate for ``name`` to give a
        handshake waiting for one: it goes on with the default."""
        if self.certificates.on_demand is not None:
            self.certificates.on_demand.answered(name, False)

    def cache_store(self) -> Any:
        """The shared cache store, if any (for the admin endpoint's ban)."""
        cache = self.resource.cache if self.resource.cache is not None else self._cluster_cache
        return cache.store if cache is not None else None

    def _factory_for(self, desc: str) -> Any:
        """The site, or for an ``h2c_listen`` endpoint the site behind a
        check for the HTTP/2 preface (cleartext HTTP/2 with prior knowledge)."""
        if desc in self.config.h2c_listen:
            from prexy.proxy.http2 import PriorKnowledgeFactory

            return PriorKnowledgeFactory(self.site)
        if self.config.http2 and desc.startswith("ssl:"):
            from prexy.proxy.http2 import NegotiatedFactory

            return NegotiatedFactory(self.site)
        return self.site

    def _default_certificates(self, config: Config) -> dict[str, tuple[str, str]]:
        """The key and certificate paths ``config`` gives each ssl:
        listener, by the listener's name; none when its endpoints are not
        the ones listened on (they changed: a restart takes them)."""
        endpoints = config.listen_endpoints()
        if len(endpoints) != len(self._listener_names):
            return {}
        out = {}
        for name, desc in zip(self._listener_names, endpoints, strict=True):
            kind, _args, kw = split_endpoint(desc)
            if kind == "ssl" and kw.get("privateKey"):
                out[name] = (kw["privateKey"], kw.get("certKey", kw["privateKey"]))
        return out

    def _listeners(self) -> list[ListeningService]:
        """The services listening on the proxy endpoints (not the admin's)."""
        return [c for c in self if isinstance(c, ListeningService) and _site_of(c.factory) is self.site]

    def listening_ports(self) -> Any:
        """Deferred list of the listening ports of the proxy endpoints, once
        every one listens (None for one whose listen failed)."""
        from twisted.internet import defer

        return defer.gatherResults([listener.when_listening() for listener in self._listeners()])

    @property
    def runtime(self) -> Runtime:
        return self.resource.runtime

    def reload(self, files: IFiles | None = None, config: Config | None = None) -> bool:
        """Re-read the config file (if any) and its rules and maps (from
        ``files``, else ``self.files``); swap them in when all of it is
        valid. Returns whether the new config is in force.  A worker is
        handed its ``config`` parsed by its master, and ``files``, the
        bytes of the rules, maps and certificates it was validated with
        (``prexy.handoff``): it reads no configuration file."""
        files = files if files is not None else self.files
        handed = config is not None
        try:
            with collector.paused():
                now = time.time() if self.check_rules else None
                if config is None:
                    config = (load_config(self.config.source, self.memo, files, now) if self.config.source
                              else self.config)
                runtime = build_runtime(config, previous=self.resource.runtime, check=self.check_rules, files=files,
                                        validated=handed)
                tls = tls_files(config.listen_endpoints(), files)
        except ConfigError as exc:
            self.last_reload_error = str(exc)
            log.error("reload refused, keeping the running configuration: {error}", error=str(exc))
            return False
        if config.listen != self.config.listen:
            log.warn("reload: listen endpoints changed; they take effect on restart")
        if config.cluster != self.config.cluster:
            log.warn("reload: [cluster] changed; it takes effect on restart")
        if config.acme != self.config.acme:
            log.warn("reload: [acme] changed; it takes effect on restart")
        runtime.compile_ahead(COMPILE_AHEAD)
        try:
            for name, (key, cert) in self._default_certificates(config).items():
                if self.certificates.renew_default(name, tls[cert], tls[key]):
                    log.info("reload: {listener} has a new default certificate", listener=name)
            self.certificates.update(runtime, refuse=config.tls_unknown == "refuse")
        except Exception as exc:  # (validated at load: OpenSSL refusing one is unexpected)
            self.last_reload_error = f"TLS: {exc}"
            log.failure("reload refused, keeping the running configuration: TLS")
            return False
        self.config = config
        self.resource.runtime = runtime
        self.resource.memos.resize(config.memo_size)
        self.resource.applicability.resize(config.applicability_memory)
        self.view.aggregate.window = config.observe.never_matched_window
        if self.access_log is not None:
            from prexy.logformat import line_maker

            self.access_log.make = line_maker(config.access_log_format)
        if self.acme is not None:
            self.acme.update(config.acme_sites())
        self.site.max_request_body = config.max_request_body
        self.site.limits = config.limits
        self.site.timeouts = config.timeouts
        self.site.h2_settings = config.http2_settings
        self.pool.limits = config.limits
        store = runtime.rulesets
        log.info(
            "reloaded configuration: {n} site(s); {parsed} rules file(s) parsed, {made} rule set(s) new,"
            " the others reused",
            n=len(runtime.sites), parsed=store.parsed if store else "?", made=store.made if store else "?",
        )
        return True

    def startService(self) -> None:
        super().startService()
        if self.config.cache_size and self.resource.cache is None:
            cache = open_cache(self.reactor, self.config, self.metrics, self.resource.memos)
            if self.cluster is None:
                self.resource.cache = cache
            else:  # serve from the store once the node caught up (prexy.cluster)
                self._cluster_cache = cache
                cache.announce = self.cluster.publish
                self.cluster.ready.addCallback(lambda _: setattr(self.resource, "cache", cache))
        defaults = self._default_certificates(self.config)
        for spec, fd in self._inherited:
            self._adopted.append(adopt(
                self.reactor, spec, fd, self._factory_for(spec.description), self.tls, self.certificates,
                defaults.get(spec.description),
            ))
        self._inherited = []
        if self.access_log is not None:
            self.access_log.start()
        if hasattr(signal, "SIGHUP") and self.reactor is _global_reactor():
            # Now, not once the reactor runs: READY=1 may go out first, and
            # a signal then would meet the default action (which ends us).
            self._install_signals()
        # Upstream host names are resolved in the reactor's thread pool,
        # whose first thread was otherwise started by the first request.
        call_in_thread = getattr(self.reactor, "callInThread", None)
        if call_in_thread is not None:
            self.reactor.callWhenRunning(call_in_thread, lambda: None)

    def _install_signals(self) -> None:
        # A worker (inherited sockets) reloads on its master's command only.
        signals.install(self.reactor, self.reopen_logs, None if self.worker else self.reload)

    def _log_records(self, records: list[list[Any]], dropped: int) -> None:
        self.view.hub.deliver(records, dropped)

    def observed(self) -> Aggregate:
        """This process's counters, summed for the admin endpoint."""
        self.view.aggregate.update("self", self.observer.report())
        return self.view.aggregate

    def report_levels(self) -> None:
        """Set this process's gauges (open connections, requests being
        answered, cache evictions, the memos' and the applicability
        memory's bytes) in its metrics, for the report or ``/metrics``."""
        gauges = self.metrics.gauges
        gauges["prexy_open_connections"] = float(self.site.open_connections())
        gauges["prexy_active_requests"] = float(self.site.active_requests)
        cache = self.resource.cache
        if cache is not None:
            self.metrics.counters[("prexy_cache_evictions_total", ())] = cache.store.evicted
        memos = self.resource.memos
        for name, used in memos.used_by().items():
            self.metrics.level("prexy_memo_bytes", float(used), memo=name)
        gauges["prexy_memo_max_bytes"] = float(memos.budget)
        applicability = self.resource.applicability
        gauges["prexy_applicability_bytes"] = float(applicability.used)
        gauges["prexy_applicability_max_bytes"] = float(applicability.max_bytes)

    def collect_metrics(self) -> bytes:
        """``/metrics`` of a process alone."""
        from prexy.metrics import cache_gauges, memo_held, render

        self.report_levels()
        extra: dict[str, float] = {}
        if self.cluster is not None:
            extra.update(self.cluster.gauges())
        extra.update(cache_gauges(self.cache_store()))
        text = render(
            [self.metrics], extra, observed=self.observed(), top_sites=self.config.observe.top_sites,
            processes=[("self", os.getpid())], memo={"self": memo_held(self.metrics.snapshot())},
        )
        if self.acme is not None:
            text += ("\n".join(self.acme.metric_lines()) + "\n").encode("utf-8")
        return text

    def dry_run(
        self, site_name: str, draft: bytes, file_name: str, count: int, urls: Sequence[str] | None = None,
    ) -> Any:
        """Compare ``draft`` (a rules file's bytes, named ``file_name`` in
        errors) with the site's rules on ``urls``, by default its ``count``
        most requested pages here (``prexy.proxy.dryrun``): a Deferred of
        (HTTP status, report)."""
        from twisted.internet import defer

        from prexy.proxy.dryrun import dry_run
        from prexy.substitution.dryrun import load_draft
        from prexy.substitution.rules import RulesError

        site = self.resource.runtime.site_named(site_name)
        if site is None:
            return defer.succeed((404, {"error": f"no site named {site_name!r}"}))
        try:
            ruleset = load_draft(draft, file_name)
        except RulesError as exc:
            return defer.succeed((400, {"error": str(exc)}))
        if urls is None:
            urls = [url for url, _ in self.observer.top_urls(site_name, count)]
        urls = list(urls) or ["/"]
        d = dry_run(self.pool, site, urls, ruleset)
        return d.addCallback(lambda report: (200, report))

    def reopen_logs(self) -> None:
        """Reopen the access log, if any (after logrotate moved it)."""
        if self.access_log is not None:
            self.access_log.reopen()
            log.info("SIGUSR1: access log reopened")
        else:
            log.info("SIGUSR1: no access log to reopen")

    def drain_and_stop(self, deadline: float) -> None:
        """Graceful exit of a worker: stop accepting, close idle keep-alive
        connections, let requests in flight finish (up to ``deadline``
        seconds), then stop the reactor."""
        if self._draining:
            return
        self._draining = True
        for port in self._adopted:
            port.stopListening()
        self._adopted = []
        for listener in self._listeners():
            listener.stopService()
        self.site.close_idle_connections()
        started = self.reactor.seconds()

        def check() -> None:
            # Wait for requests in flight and for connections accepted just
            # before we stopped listening (their request may be on its way).
            busy = self.site.active_requests + self.site.open_connections()
            if busy and self.reactor.seconds() - started < deadline:
                self.site.close_idle_connections()
                self.reactor.callLater(0.05, check)
                return
            if busy:
                log.warn("shutdown deadline reached with {n} request(s)/connection(s) open", n=busy)
            self.reactor.stop()

        check()

    def stopService(self) -> Any:
        from twisted.internet import defer

        d = super().stopService()
        self.pump.stop()
        if self.resource.cache is not None:
            self.resource.cache.events.stop()
        closed = self.pool.stop()
        if self.access_log is not None:
            self.access_log.stop()
        return defer.gatherResults([d, closed])


def _global_reactor() -> Any:
    from twisted.internet import reactor

    return reactor



class TopService(service.MultiService):
    """What ``twistd prexy`` runs: a start-up that cannot listen on an
    endpoint (a port in use, a socket systemd did not pass) stops twistd
    with one log line naming the endpoint and the reason, exit status 1,
    rather than a traceback.

    Daemonised (no ``--nodaemon``), the error is raised on instead: twistd
    hands an exception's one line to the process that launched it, which
    prints it and exits 1, and waits for ever on anything else."""

    def __init__(self, daemon: bool = False, pidfile: str | None = None) -> None:
        super().__init__()
        self.daemon = daemon
        #: twistd's pid file, removed on the way out as twistd would.
        self.pidfile = pidfile

    def privilegedStartService(self) -> None:
        try:
            super().privilegedStartService()
        except ListenError as exc:
            log.critical("{error}", error=str(exc))
            if self.daemon:
                raise
            if self.pidfile:
                try:
                    os.unlink(self.pidfile)
                except OSError:
                    pass
            raise SystemExit(1) from None


def makeService(options: Options) -> service.IService:
    """The twistd entry point: in-process (``--workers 0``, the demo) or a
    master with a pool of workers."""
    from twisted.internet import reactor

    config: Config = options.config
    runtime: Runtime = options.runtime
    collector.settle()  # (the configuration loaded: left out of later collections)
    twistd_options = getattr(options, "parent", None) or {}
    top = TopService(daemon=bool(twistd_options) and not twistd_options.get("nodaemon"),
                     pidfile=twistd_options.get("pidfile"))
    if options["demo"]:
        from prexy.demo import DemoService

        DemoService(reactor).setServiceParent(top)
    from prexy.workers import MasterService, default_workers, sd_notify

    workers = config.workers if config.workers is not None else default_workers()
    if workers == 0:
        options.files = DISK  # (what the load recorded is not needed)
        from twisted.internet.task import LoopingCall

        from prexy.memory import TRIM_INTERVAL, trim, tune_malloc

        tune_malloc()  # this process serves (a worker does the same)
        reactor.callWhenRunning(lambda: LoopingCall(trim).start(TRIM_INTERVAL, now=False))
        try:
            ProxyService(reactor, config, runtime).setServiceParent(top)
        except ListenError as exc:  # systemd passed no such socket
            raise SystemExit(f"prexy: {exc}") from None

        def listening() -> None:
            sd_notify("READY=1")
            log.info("prexy {pid} listening on {listen}", pid=os.getpid(), listen=", ".join(config.listen))

        reactor.callWhenRunning(listening)
    else:
        files = options.files
        assert isinstance(files, Recorder)
        loader = ConfigLoader(options.memo, runtime, files)
        MasterService(reactor, loader.validated(config, options.tls), options.argv, workers, loader).setServiceParent(
            top
        )
    return top


def _site_of(factory: Any) -> Any:
    """The site a listener's factory serves: itself, or the site of the
    factory it wraps (TLS) or starts connections for (HTTP/2)."""
    factory = getattr(factory, "wrappedFactory", factory)
    return getattr(factory, "site", factory)
