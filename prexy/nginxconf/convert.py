"""nginx configuration -> Prexy configuration: the core of ``prexy convert nginx``.

Pure: :func:`convert` takes the directives :func:`prexy.nginxconf.parser.load`
read (includes expanded) and returns a :class:`Conversion`, the files to write
(``prexy.toml``, ``rules/SITE.rules``, ``maps/NAME.map``, ``REPORT.txt``, each
a relative path and its bytes) and the notes behind ``REPORT.txt``.  Nothing is
dropped silently: each directive is converted, or listed in the report as not
converted, converted with a difference, or not needed, with its file, line and
the reason.

What converts to what:

- ``server`` -> ``[sites.NAME]``: ``server_name`` -> ``hosts`` (``.x`` gives
  ``x`` and ``*.x``), ``location /`` with ``proxy_pass`` -> ``upstream``
  (an ``upstream`` block: its first ``server``), ``ssl_certificate`` /
  ``ssl_certificate_key`` -> ``tls_certificate`` / ``tls_key``,
  ``proxy_set_header Host`` -> ``host_header`` (nginx's default, the
  upstream's name, is ``"upstream"``), ``proxy_cache`` -> ``cache``,
  ``proxy_cache_valid`` -> ``cache_ttl``.
- ``listen`` of every server -> ``[server] listen`` (``ssl`` -> ``ssl:``, the
  certificate of the default server -> ``[server] tls_certificate``).
- The rules file: ``replace_filter*`` unchanged, ``subs_filter`` and
  ``sub_filter`` rewritten as ``replace_filter``, the header directives
  (``proxy_set_header``, ``add_header``, ``proxy_hide_header``,
  ``proxy_redirect``, ``proxy_cookie_domain``, ``proxy_cookie_path``) as
  they are, nginx's inheritance applied (a level that sets a kind of
  directive replaces what it inherits).  The file is parsed as Prexy parses
  it; a line Prexy refuses is taken out and reported with Prexy's reason.
- ``map $request_uri $v`` used as ``if ($v) { return 301 $v; }`` or
  ``rewrite ^ $v permanent|redirect|last|break`` -> ``maps/v.map`` and the
  site's ``map``, ``map_action``, ``redirect_status``, ``map_keep_query``.
- ``gzip*`` -> ``[compression]``; ``client_max_body_size`` -> ``[server]
  max_request_body``; ``proxy_connect_timeout``, ``proxy_read_timeout``,
  ``client_header_timeout``, ``client_body_timeout`` -> ``[timeouts]``;
  ``worker_processes N`` -> ``workers``; ``access_log`` -> ``access_log``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import attrs


class DirectiveLike(Protocol):
    """What :class:`prexy.nginxconf.parser.Directive` gives."""

    @property
    def name(self) -> str: ...
    @property
    def args(self) -> tuple[str, ...]: ...
    @property
    def block(self) -> tuple[DirectiveLike, ...] | None: ...
    @property
    def file(self) -> str: ...
    @property
    def line(self) -> int: ...


@attrs.frozen
class Note:
    """One line of the report: where, which directive, and why."""

    kind: str  # "skipped", "differs", "unneeded"
    file: str
    line: int
    directive: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.directive}: {self.reason}"


@attrs.frozen
class Conversion:
    """The files to write (relative path -> bytes) and the report's notes."""

    files: Mapping[str, bytes]
    notes: tuple[Note, ...]
    sites: tuple[str, ...]

    def of_kind(self, kind: str) -> tuple[Note, ...]:
        return tuple(n for n in self.notes if n.kind == kind)


# -- small pieces -------------------------------------------------------------

_TIME_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "M": 2592000, "y": 31536000}
_TIME = re.compile(r"(\d+)(ms|s|m|h|d|w|M|y)?")


def parse_time(text: str) -> float | None:
    """nginx's time (``30``, ``500ms``, ``1m30s``) in seconds, None if invalid."""
    if not text:
        return None
    total = 0.0
    pos = 0
    while pos < len(text):
        m = _TIME.match(text, pos)
        if m is None:
            return None
        total += int(m.group(1)) * _TIME_UNITS[m.group(2) or "s"]
        pos = m.end()
    return total


_SIZE = re.compile(r"(\d+)([kKmMgG]?)")


def parse_size(text: str) -> int | None:
    """nginx's size (``512``, ``8k``, ``1m``, ``2g``) in bytes, None if invalid."""
    m = _SIZE.fullmatch(text)
    if m is None:
        return None
    return int(m.group(1)) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[m.group(2).lower()]


def _size_text(n: int) -> str:
    for unit, size in (("G", 1024**3), ("M", 1024**2), ("k", 1024)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _seconds(value: float) -> int | float:
    return int(value) if value == int(value) else value


_BARE = re.compile(r"[^\s;{}#\"'\\$]+")


def nginx_quote(word: str) -> str:
    """``word`` as an nginx-syntax token (rules and map files) that reads
    back as ``word``: bare when it can be, else single-quoted."""
    if _BARE.fullmatch(word) and "$" not in word:
        return word
    escaped = (word.replace("\\", "\\\\").replace("'", "\\'")
               .replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t"))
    return f"'{escaped}'"


def _value_quote(word: str) -> str:
    """A value that may hold ``$`` variables: quoted only when it must be."""
    if re.fullmatch(r"[^\s;{}#\"'\\]+", word):
        return word
    return nginx_quote(word) if "$" not in word else '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _line(name: str, args: Iterable[str]) -> str:
    return " ".join([name, *(_value_quote(a) for a in args)]) + ";"


def toml_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(value)


def _show(d: DirectiveLike) -> str:
    text = " ".join([d.name, *(_value_quote(a) for a in d.args)])
    if d.block is not None:
        text += " { ... }"
    return text if len(text) <= 120 else text[:117] + "..."


def _walk(directives: Iterable[DirectiveLike]) -> Iterator[DirectiveLike]:
    for d in directives:
        yield d
        if d.block is not None:
            yield from _walk(d.block)


# Directives with no Prexy counterpart that need saying why.
_REASONS = {
    "user": "Prexy runs as the user systemd (conf/prexy.service) or twistd starts it as",
    "daemon": "twistd -n runs in the foreground, twistd without it as a daemon",
    "master_process": "Prexy always runs a master and its workers ([server] workers = 0 for one process)",
    "pid": "twistd's --pidfile, or systemd, keeps the process id",
    "error_log": "Prexy logs to twistd's log (journald under systemd)",
    "events": "Prexy's reactor needs no connection settings",
    "worker_connections": "Prexy's reactor needs no connection settings",
    "worker_rlimit_nofile": "set LimitNOFILE= in the systemd unit",
    "load_module": "Prexy loads no modules",
    "sendfile": "Prexy copies bodies itself",
    "tcp_nopush": "Prexy sets its sockets itself",
    "tcp_nodelay": "Prexy sets its sockets itself",
    "types_hash_max_size": "Prexy keeps no types table",
    "types": "Prexy passes the upstream's Content-Type",
    "default_type": "Prexy passes the upstream's Content-Type",
    "ssl_protocols": "Prexy's TLS uses OpenSSL's defaults; there is no protocol key",
    "ssl_ciphers": "Prexy's TLS uses OpenSSL's defaults; there is no cipher key",
    "ssl_prefer_server_ciphers": "Prexy's TLS uses OpenSSL's defaults",
    "ssl_session_cache": "no Prexy key",
    "ssl_session_timeout": "no Prexy key",
    "ssl_dhparam": "no Prexy key",
    "keepalive_timeout": "no Prexy key for client keep-alive",
    "keepalive_requests": "no Prexy key for client keep-alive",
    "send_timeout": "no Prexy key ([timeouts] has connect, first_byte, idle, client_header, client_body)",
    "proxy_send_timeout": "no Prexy key ([timeouts] has connect, first_byte, idle, client_header, client_body)",
    "root": "Prexy serves no files (a site proxies to its upstream)",
    "index": "Prexy serves no files (a site proxies to its upstream)",
    "try_files": "Prexy serves no files (a site proxies to its upstream)",
    "autoindex": "Prexy serves no files",
    "location": "Prexy applies one set of rules to the whole site: only location / is converted",
    "if": "only if ($map) { return/rewrite } of a map is converted",
    "return": "only the return of a map's if is converted",
    "rewrite": "only the rewrite of a map's if is converted",
    "upstream": "no site proxies to this upstream",
    "map": "only a map of $request_uri used by if ($var) { return/rewrite } is converted",
    "proxy_buffering": "Prexy streams bodies as they come",
    "proxy_buffers": "Prexy streams bodies as they come",
    "proxy_buffer_size": "Prexy streams bodies as they come",
    "proxy_temp_path": "Prexy spools request bodies itself",
    "client_body_temp_path": "Prexy spools request bodies itself",
    "fastcgi_temp_path": "Prexy speaks HTTP only",
    "uwsgi_temp_path": "Prexy speaks HTTP only",
    "scgi_temp_path": "Prexy speaks HTTP only",
    "gzip_vary": "no Prexy key (docs/behaviour.md, compression to clients)",
    "gzip_proxied": "no Prexy key (Prexy compresses for every client that accepts it)",
    "gzip_disable": "no Prexy key",
    "gzip_buffers": "no Prexy key",
    "gzip_http_version": "no Prexy key",
    "proxy_cache_path": "Prexy's cache is one store per machine ([cache] size, path)",
    "proxy_cache_key": "Prexy's cache key is fixed: site, method class, URL, Vary values, rule set",
    "proxy_cache_lock": "Prexy always collapses concurrent misses into one upstream request",
    "proxy_cache_use_stale": "see the site's cache_grace and cache_stale_if_error",
    "proxy_cache_bypass": "see the site's cache_pass",
    "proxy_no_cache": "see the site's cache_pass",
    "subs_filter_bypass": "no Prexy equivalent",
    "http2": "Prexy offers HTTP/2 on every ssl: listener ([server] http2)",
}

_HEADER_KINDS = ("proxy_set_header", "add_header", "proxy_hide_header", "proxy_redirect",
                 "proxy_cookie_domain", "proxy_cookie_path")
# Kinds of directive inherited as a whole (a level that has one replaces the parent's).
_LISTS = (*_HEADER_KINDS, "replace_filter", "subs_filter", "sub_filter")
_SCALARS = ("replace_filter_types", "replace_filter_max_buffered_size", "replace_filter_last_modified",
            "replace_filter_skip", "replace_filter_headers", "subs_filter_types", "sub_filter_types",
            "sub_filter_once", "sub_filter_last_modified", "proxy_cache", "proxy_cache_valid",
            "ssl_certificate", "ssl_certificate_key", "gzip", "gzip_types", "gzip_comp_level",
            "gzip_min_length", "client_max_body_size", "proxy_connect_timeout", "proxy_read_timeout",
            "client_header_timeout", "client_body_timeout")


class _Scope:
    """The directives of one level (http, server, location /) and its parent."""

    def __init__(self, directives: Sequence[DirectiveLike], parent: _Scope | None) -> None:
        self.directives = tuple(directives)
        self.parent = parent

    def own(self, name: str) -> list[DirectiveLike]:
        return [d for d in self.directives if d.name == name]

    def get(self, name: str) -> list[DirectiveLike]:
        """The directives of this kind in force here: the nearest level that has any."""
        scope: _Scope | None = self
        while scope is not None:
            found = scope.own(name)
            if found:
                return found
            scope = scope.parent
        return []

    def last(self, name: str) -> DirectiveLike | None:
        found = self.get(name)
        return found[-1] if found else None


@attrs.frozen
class _Nowhere:
    """Where a site made from no server block is said to come from."""

    name: str = "server"
    args: tuple[str, ...] = ()
    block: tuple[DirectiveLike, ...] | None = ()
    file: str = "-"
    line: int = 0


@attrs.define
class _Site:
    name: str
    server: DirectiveLike
    hosts: list[str]
    upstream: str
    keys: dict[str, Any] = attrs.Factory(dict)
    rules: list[tuple[str, DirectiveLike]] = attrs.Factory(list)
    compression: dict[str, Any] = attrs.Factory(dict)
    endpoints: list[str] = attrs.Factory(list)
    default: bool = False


# -- the converter ------------------------------------------------------------


class _Converter:
    def __init__(self, directives: Sequence[DirectiveLike], prefix: str) -> None:
        self.top = tuple(directives)
        self.prefix = prefix
        self.notes: list[Note] = []
        self.done: set[int] = set()  # id() of directives converted or reported
        self.sites: list[_Site] = []
        self.maps: dict[str, str] = {}  # file -> text
        self.server: dict[str, Any] = {}
        self.timeouts: dict[str, Any] = {}
        self.compression: dict[str, Any] = {}
        self.cache: dict[str, Any] = {}
        self.listen: list[str] = []
        self.hosts_seen: dict[str, str] = {}
        self.dual_stack: list[DirectiveLike] = []
        self.rules_ok: dict[str, tuple[str, list[tuple[int, str]]]] = {}

    # notes
    def note(self, kind: str, d: DirectiveLike, reason: str) -> None:
        self.notes.append(Note(kind, d.file, d.line, _show(d), reason))
        self.done.add(id(d))

    def skip(self, d: DirectiveLike, reason: str) -> None:
        self.note("skipped", d, reason)

    def skip_block(self, d: DirectiveLike, reason: str) -> None:
        """Report a block once and count everything inside it as reported."""
        count = sum(1 for _ in _walk(d.block or ()))
        self.skip(d, f"{reason} (with the {count} directive(s) inside it)" if count else reason)
        for inner in _walk(d.block or ()):
            self.done.add(id(inner))

    def used(self, *ds: DirectiveLike | None) -> None:
        for d in ds:
            if d is not None:
                self.done.add(id(d))

    def path(self, name: str) -> str:
        return name if os.path.isabs(name) else os.path.abspath(os.path.join(self.prefix, name))

    # the whole file
    def run(self) -> Conversion:
        https = [d for d in self.top if d.name == "http" and d.block is not None]
        for d in self.top:
            if d.name == "worker_processes" and d.args:
                self.used(d)
                if d.args[0].isdigit() and int(d.args[0]) > 0:
                    self.server["workers"] = int(d.args[0])
                elif d.args[0] != "auto":
                    self.skip(d, "not a number of processes")
        if https:
            for extra in https[1:]:
                self.skip_block(extra, "a second http block is not converted")
            http = _Scope(https[0].block or (), None)
            self.used(https[0])
        else:
            # a file of server blocks (sites-enabled), or of map/upstream blocks
            http = _Scope(self.top, None)
        self.http = http
        self.upstreams = {d.args[0]: d for d in http.directives if d.name == "upstream" and d.args}
        self.map_blocks = {d.args[1]: d for d in http.directives if d.name == "map" and len(d.args) == 2}
        self.used_maps: set[str] = set()
        self._globals(http)
        servers = [d for d in http.directives if d.name == "server" and d.block is not None]
        for srv in servers:
            self._server(srv, http)
        if not self.sites:
            self._placeholder(servers)
        self._listeners()
        for name, block in self.map_blocks.items():
            if name not in self.used_maps:
                self.skip_block(block, _REASONS["map"])
        for d in _walk(self.top):
            if id(d) not in self.done:
                reason = _REASONS.get(d.name, "no Prexy equivalent")
                if d.block is not None:
                    self.skip_block(d, reason)
                else:
                    self.skip(d, reason)
        return self._files()

    def _globals(self, http: _Scope) -> None:
        formats = {d.args[0]: d for d in http.own("log_format") if len(d.args) >= 2}
        for d in http.own("access_log"):
            self.used(d)
            if d.args[0] == "off":
                self.server["access_log"] = "off"
            elif d.args[0].startswith("syslog:"):
                self.skip(d, "Prexy logs to a file, stdout or off")
            elif len(d.args) > 1 and d.args[1] != "combined" and "=" not in d.args[1]:
                self._log_format(d, formats.get(d.args[1]))
            else:
                self.server["access_log"] = self.path(d.args[0])
                if len(d.args) > 1:
                    self.note("differs", d, "buffer/flush/gzip/if parameters are not converted")
        body = http.last("client_max_body_size")
        if body is not None:
            size = self._size(body)
            if size == 0:
                self.skip(body, "0 (no limit) has no Prexy equivalent; Prexy's default limit applies")
            elif size is not None:
                self.server["max_request_body"] = _size_text(size)
        self._timeouts(http, self.timeouts)
        self._gzip(http, self.compression, None)

    def _size(self, d: DirectiveLike) -> int | None:
        """The size ``d`` gives (``10m``, ``512k``...); None, and ``d``
        reported, when it gives none."""
        self.used(d)
        size = parse_size(d.args[0]) if d.args else None
        if size is None:
            self.skip(d, "not a size")
        return size

    def _log_format(self, access_log: DirectiveLike, log_format: DirectiveLike | None) -> None:
        """An access log in a format of ``log_format``'s: Prexy's
        ``access_log_format`` when Prexy writes every variable it uses."""
        from prexy.logformat import FormatError, compile_format

        name = access_log.args[1]
        if log_format is None:
            self.skip(access_log, f"no log_format {name!r} is defined at the http level")
            return
        strings = [a for a in log_format.args[1:] if not a.startswith("escape=")]
        text = "".join(strings)
        try:
            compile_format(text)
        except FormatError as exc:
            self.skip(access_log, f"the log format {name!r} is not converted: {exc}")
            return
        self.used(log_format)
        self.server["access_log"] = self.path(access_log.args[0])
        self.server["access_log_format"] = text
        if len(log_format.args) > 1 and log_format.args[1].startswith("escape="):
            self.note("differs", log_format, "escape= is not converted: Prexy writes bytes outside printable"
                      " ASCII as \\xNN")

    def _timeouts(self, scope: _Scope, out: dict[str, Any]) -> None:
        for nginx, keys in (("proxy_connect_timeout", ("connect",)),
                            ("proxy_read_timeout", ("first_byte", "idle")),
                            ("client_header_timeout", ("client_header",)),
                            ("client_body_timeout", ("client_body",))):
            d = scope.last(nginx)
            if d is None:
                continue
            self.used(d)
            seconds = parse_time(d.args[0]) if d.args else None
            if seconds is None:
                self.skip(d, "not a time")
                continue
            for key in keys:
                out[key] = _seconds(seconds)

    def _gzip(self, scope: _Scope, out: dict[str, Any], parent: dict[str, Any] | None) -> None:
        on = scope.last("gzip")
        self.used(on)
        out["enabled"] = on is not None and on.args[:1] == ("on",)
        types = scope.last("gzip_types")
        if types is not None:
            self.used(types)
            good = ["text/html"]
            for t in types.args:
                if t == "*":
                    good = ["*/*"]
                    break
                if re.fullmatch(r"[A-Za-z0-9.+*_-]+/[A-Za-z0-9.+*_-]+", t):
                    if t not in good:
                        good.append(t)
                else:
                    self.note("differs", types, f"type {t!r} left out: not a media type")
            out["types"] = good
        else:
            out["types"] = ["text/html"]
        level = scope.last("gzip_comp_level")
        if level is not None:
            self.used(level)
            if level.args and level.args[0].isdigit() and 1 <= int(level.args[0]) <= 9:
                out["gzip_level"] = int(level.args[0])
            else:
                self.skip(level, "not a level from 1 to 9")
        else:
            out["gzip_level"] = 1  # nginx's default
        minimum = scope.last("gzip_min_length")
        if minimum is not None:
            size = self._size(minimum)
            if size is not None:
                out["min_length"] = size
        else:
            out["min_length"] = 20  # nginx's default

    # one server block
    def _server(self, srv: DirectiveLike, http: _Scope) -> None:
        scope = _Scope(srv.block or (), http)
        roots = [d for d in scope.directives if d.name == "location" and d.args == ("/",) and d.block is not None]
        loc = _Scope(roots[0].block or (), scope) if roots else None
        proxy = loc.own("proxy_pass") if loc is not None else []
        if loc is None or not proxy:
            why = "no location / with proxy_pass" if loc is None or not roots else "its location / has no proxy_pass"
            self.skip_block(srv, f"server not converted: {why} (Prexy proxies; it serves no files)")
            return
        self.used(srv, roots[0])
        for version in loc.get("proxy_http_version"):
            if version.args[:1] == ("1.1",):
                self.note("unneeded", version, "Prexy speaks HTTP/1.1 upstream, with keep-alive")
            else:
                self.note("differs", version, "Prexy speaks HTTP/1.1 upstream")
        upstream = self._upstream(proxy[0])
        if upstream is None:
            self.skip_block(srv, "server not converted: its proxy_pass has no upstream Prexy can use (see above)")
            return
        hosts = self._hosts(scope, srv)
        base = re.sub(r"[^A-Za-z0-9_-]+", "_", hosts[0].replace("*.", "")) if hosts else "default"
        name = base.strip("_") or "default"
        taken = {s.name for s in self.sites}
        n = 2
        unique = name
        while unique in taken:
            unique = f"{name}_{n}"
            n += 1
        site = _Site(unique, srv, hosts, upstream)
        for host in hosts:
            self.hosts_seen[host] = unique
        self._listens(scope, site)
        self._certificate(scope, site)
        self._host_header(loc, site)
        self._cache(loc, site)
        self._rules(loc, site)
        self._map(scope, loc, site)
        self._site_overrides(loc, site)
        for other in scope.directives:
            if other.name == "location" and other is not roots[0]:
                self.skip_block(other, _REASONS["location"])
        for d in roots[1:]:
            self.skip_block(d, "a second location / is not converted")
        self.sites.append(site)

    def _upstream(self, d: DirectiveLike) -> str | None:
        self.used(d)
        url = d.args[0] if d.args else ""
        m = re.fullmatch(r"(https?)://([^/]+)(/.*)?", url)
        if m is None or "$" in url:
            self.skip(d, "proxy_pass with variables or without http:// or https:// is not converted")
            return None
        scheme, host, path = m.group(1), m.group(2), m.group(3) or ""
        if path not in ("", "/"):
            self.skip(d, f"the URI part {path!r} is not converted: Prexy sends the request's own path")
            return None
        block = self.upstreams.get(host)
        if block is not None:
            servers = [s for s in block.block or () if s.name == "server"]
            self.used(block)
            if not servers:
                self.skip(d, f"upstream {host!r} has no server")
                return None
            first = servers[0]
            self.used(first)
            address = first.args[0] if first.args else ""
            if address.startswith("unix:"):
                self.skip(first, "a unix: upstream is not converted")
                return None
            host = address
            if ":" not in address.rsplit("]", 1)[-1]:
                host = f"{address}:{443 if scheme == 'https' else 80}"
            if len(first.args) > 1:
                self.note("differs", first, f"parameters {' '.join(first.args[1:])} are not converted")
            for other in servers[1:]:
                self.skip(other, "Prexy has one upstream per site: the first server is used")
            for inner in block.block or ():
                if inner.name in ("keepalive", "keepalive_requests", "keepalive_timeout"):
                    self.note("unneeded", inner, "Prexy keeps upstream connections alive itself")
        return f"{scheme}://{host}"

    def _hosts(self, scope: _Scope, srv: DirectiveLike) -> list[str]:
        from prexy.hostnames import host_problem

        hosts: list[str] = []
        for d in scope.own("server_name"):
            self.used(d)
            for name in d.args:
                if name in ("_", ""):
                    continue
                if name.startswith("~"):
                    self.note("differs", d, f"regex name {name!r} left out: Prexy's hosts are names and *. wildcards")
                    continue
                if name.endswith(".*"):
                    self.note("differs", d, f"name {name!r} left out: Prexy has no trailing wildcards")
                    continue
                names = [name[1:], "*" + name] if name.startswith(".") else [name]
                for h in names:
                    h = h.lower().rstrip(".")
                    problem = host_problem(h)
                    if problem is not None:
                        self.note("differs", d, f"name {h!r} left out: {problem}")
                    elif h in self.hosts_seen:
                        self.note("differs", d, f"name {h!r} left out: already a host of site "
                                                f"{self.hosts_seen[h]!r} (Prexy routes by name on every listener)")
                    elif h not in hosts:
                        hosts.append(h)
        return hosts

    def _listens(self, scope: _Scope, site: _Site) -> None:
        listens = scope.own("listen")
        if not listens:
            site.endpoints.append("tcp:80")
            return
        for d in listens:
            self.used(d)
            address, params = d.args[0], d.args[1:]
            ssl = "ssl" in params
            backlog = [p for p in params if re.fullmatch(r"backlog=\d+", p)]
            extra = [p for p in params if p not in ("ssl", "default_server", "default", "http2", *backlog)]
            if "default_server" in params or "default" in params:
                site.default = True
            if address.startswith("unix:"):
                if ssl:
                    self.skip(d, "ssl on a unix socket is not converted")
                    continue
                site.endpoints.append(f"unix:{address[5:]}")
                continue
            m = re.fullmatch(r"(?:\[([0-9A-Fa-f:.]+)\]|([^:\[\]]+))?(?::?(\d+))?", address)
            if address.isdigit():
                iface, port = "", address
            elif m is not None and m.group(3):
                iface, port = m.group(1) or m.group(2) or "", m.group(3)
            elif m is not None and (m.group(1) or m.group(2)):
                iface, port = m.group(1) or m.group(2) or "", "80"
            else:
                self.skip(d, "not an address Prexy can listen on")
                continue
            kind = "ssl" if ssl else "tcp"
            if iface in ("*", "0.0.0.0"):
                iface = ""
            if iface and not re.fullmatch(r"[0-9A-Fa-f:.]+", iface):
                self.note("differs", d, f"host name {iface!r}: listening on every address")
                iface = ""
            if iface == "::" and not ssl:
                self.dual_stack.append(d)
                endpoint = f"tcp6:{port}:interface=\\:\\:"
            elif iface:
                endpoint = f"{kind}:{port}:interface={iface.replace(':', chr(92) + ':')}"
            else:
                endpoint = f"{kind}:{port}"
            if backlog:
                endpoint += ":" + backlog[0]
            if extra:
                self.note("differs", d, f"parameters {' '.join(extra)} are not converted")
            site.endpoints.append(endpoint)

    def _certificate(self, scope: _Scope, site: _Site) -> None:
        certs, keys = scope.get("ssl_certificate"), scope.get("ssl_certificate_key")
        self.used(*certs, *keys)
        if not certs and not keys:
            return
        if not certs or not keys or any("$" in d.args[0] for d in (*certs, *keys) if d.args):
            self.skip((certs or keys)[0], "needs ssl_certificate and ssl_certificate_key, without variables")
            return
        site.keys["tls_certificate"] = self.path(certs[0].args[0])
        site.keys["tls_key"] = self.path(keys[0].args[0])
        for extra in (*certs[1:], *keys[1:]):
            self.skip(extra, "Prexy serves one certificate per site: the first is used")

    def _host_header(self, loc: _Scope, site: _Site) -> None:
        sets = loc.get("proxy_set_header")
        hosts = [d for d in sets if d.args and d.args[0].lower() == "host"]
        if not hosts:
            site.keys["host_header"] = "upstream"  # nginx sends $proxy_host
            return
        d = hosts[-1]
        value = d.args[1] if len(d.args) > 1 else ""
        if value == "$proxy_host":
            site.keys["host_header"] = "upstream"
            self.used(d)
        elif value == "$http_host":
            site.keys["host_header"] = "pass"
            self.used(d)
        elif value and "$" not in value:
            site.keys["host_header"] = value
            self.used(d)
        # anything else stays a proxy_set_header line in the rules file
        for extra in hosts[:-1]:
            self.skip(extra, "a second proxy_set_header Host: nginx sends the last one, Prexy refuses two")

    def _cache(self, loc: _Scope, site: _Site) -> None:
        zone = loc.last("proxy_cache")
        self.used(zone)
        if zone is None or zone.args[:1] == ("off",):
            site.keys["cache"] = False
            return
        if "size" not in self.cache:
            size = 256 * 1024**2
            for path in self.http.own("proxy_cache_path"):
                for arg in path.args:
                    if arg.startswith("max_size="):
                        size = parse_size(arg[9:]) or size
                self.note("differs", path, f"[cache] size = {_size_text(size)!r}; Prexy's store has its own path")
            self.cache["size"] = _size_text(size)
        site.keys["cache"] = True
        valid = loc.get("proxy_cache_valid")
        self.used(*valid)
        ttl: float | None = None
        for d in valid:
            codes, time = (d.args[:-1] or ("200", "301", "302")), parse_time(d.args[-1]) if d.args else None
            if time is None:
                self.skip(d, "not a time")
                continue
            if "200" in codes or "any" in codes:
                if ttl is None:
                    ttl = time
                if ttl != time:
                    self.note("differs", d, "Prexy has one cache_ttl for every status")
            elif ttl is not None and time != ttl or ttl is None:
                self.note("differs", d, f"Prexy has one cache_ttl for every status; {' '.join(codes)} get "
                                        "the 200 answers' time")
        site.keys["cache_ttl"] = _seconds(ttl) if ttl is not None else 0
        if ttl is None:
            self.note("differs", zone, "no proxy_cache_valid for 200: cache_ttl = 0 (stored only with "
                                       "the upstream's own freshness)")

    def _rules(self, loc: _Scope, site: _Site) -> None:
        lines = site.rules
        replace = loc.get("replace_filter")
        subs = loc.get("subs_filter")
        sub = loc.get("sub_filter")
        filters = [kind for kind, found in (("replace_filter", replace), ("subs_filter", subs),
                                           ("sub_filter", sub)) if found]
        if len(filters) > 1:
            self.note("differs", (replace or subs or sub)[0],
                      f"{' and '.join(filters)} run one after another in nginx; in Prexy as one pass")
        for d in replace:
            self.used(d)
            lines.append((_line(d.name, d.args), d))
        for d in subs:
            self._subs(d, lines)
        if len(subs) > 1:
            self.note("differs", subs[0], f"subs_filter applies its {len(subs)} rules one after another, each to "
                                          "what the ones before made, line by line; replace_filter applies them "
                                          "in one pass (the leftmost match first): the same output unless a rule "
                                          "matches what another one wrote, or two rules' matches overlap")
        once = loc.last("sub_filter_once")
        self.used(once)
        global_ = once is not None and once.args[:1] == ("off",)
        for d in sub:
            self._sub(d, lines, global_)
        types: list[str] = []
        first_types: DirectiveLike | None = None
        for kind in ("replace_filter_types", "subs_filter_types", "sub_filter_types"):
            found = loc.last(kind)
            if found is not None and (kind == "replace_filter_types" or (kind[:-6] in filters)):
                self.used(found)
                types += [t for t in found.args if t not in types]
                first_types = first_types or found
            elif found is not None:
                self.note("unneeded", found, f"no {kind[:-6]} directive uses it")
        if types and filters and first_types is not None:
            lines.append((_line("replace_filter_types", types), first_types))
        for kind in ("replace_filter_max_buffered_size", "replace_filter_last_modified",
                     "replace_filter_skip", "replace_filter_headers"):
            found = loc.last(kind)
            if found is not None:
                self.used(found)
                lines.append((_line(found.name, found.args), found))
        keep = loc.last("sub_filter_last_modified")
        if keep is not None:
            self.used(keep)
            if keep.args[:1] == ("on",) and "sub_filter" in filters:
                lines.append(("replace_filter_last_modified keep;", keep))
        for kind in _HEADER_KINDS:
            for d in loc.get(kind):
                if id(d) in self.done:
                    continue
                self.used(d)
                if kind == "proxy_set_header" and d.args and d.args[0].lower() == "connection" \
                        and d.args[1:] in ((), ("",), ("close",), ("keep-alive",)):
                    self.note("unneeded", d, "Prexy manages upstream connections (keep-alive) itself")
                    continue
                if kind == "proxy_set_header" and d.args and d.args[0].lower() in ("upgrade", "connection"):
                    self.note("unneeded", d, "WebSocket tunnels are the site's upgrade setting (on by default)")
                    continue
                lines.append((_line(d.name, d.args), d))

    def _subs(self, d: DirectiveLike, lines: list[tuple[str, DirectiveLike]]) -> None:
        self.used(d)
        if len(d.args) not in (2, 3):
            self.skip(d, "needs a pattern, a replacement and optional flags")
            return
        pattern, repl = d.args[0], d.args[1]
        flags = d.args[2] if len(d.args) == 3 else "g"
        if set(flags) - set("giro"):
            self.skip(d, f"unknown flag in {flags!r}")
            return
        regex = "r" in flags
        if not regex:
            pattern = _literal(pattern)
        out, problem = _subs_replacement(repl, regex)
        if problem is not None:
            self.skip(d, f"not converted: {problem}")
            return
        new_flags = ("" if "o" in flags else "g") + ("i" if "i" in flags else "")
        if regex and _crosses_lines(d.args[0]):
            self.note("differs", d, "subs_filter matches within one line; this pattern can match a line "
                                    "break, and replace_filter's can match across lines")
        line = f"replace_filter {nginx_quote(pattern)} {nginx_quote(out)}" + (f" {new_flags}" if new_flags else "") + ";"
        lines.append((line, d))

    def _sub(self, d: DirectiveLike, lines: list[tuple[str, DirectiveLike]], global_: bool) -> None:
        self.used(d)
        if len(d.args) != 2:
            self.skip(d, "needs a string and a replacement")
            return
        match, repl = d.args
        if "$" in match or "$" in repl:
            self.skip(d, "variables in sub_filter are not converted (replace_filter has none)")
            return
        pattern = _literal(match)
        flags = "gi" if global_ else "i"
        lines.append((f"replace_filter {nginx_quote(pattern)} {nginx_quote(repl)} {flags};", d))

    def _map(self, scope: _Scope, loc: _Scope, site: _Site) -> None:
        for level in (scope, loc):
            for d in level.directives:
                if d.name != "if" or d.block is None or id(d) in self.done:
                    continue
                var = _if_variable(d.args)
                if var is None or var not in self.map_blocks:
                    continue
                action = _map_action(d.block, var)
                if action is None:
                    continue
                if "map" in site.keys:
                    self.skip_block(d, "Prexy takes one map per site")
                    continue
                block = self.map_blocks[var]
                if block.args[0] != "$request_uri":
                    self.skip_block(d, f"the map reads {block.args[0]}; Prexy's maps read $request_uri")
                    continue
                path = f"maps/{var[1:]}.map"
                if var not in self.used_maps:
                    text, problem = self._map_text(block)
                    if problem is not None:
                        self.skip_block(d, problem)
                        continue
                    self.maps[path] = text
                    self.used_maps.add(var)
                    self.used(block)
                    for inner in _walk(block.block or ()):
                        self.used(inner)
                self.used(d)
                for inner in _walk(d.block):
                    self.used(inner)
                kind, status, keep_query = action
                site.keys["map"] = path
                site.keys["map_action"] = kind
                if kind == "redirect":
                    site.keys["redirect_status"] = status
                site.keys["map_keep_query"] = keep_query
                if keep_query:
                    self.note("differs", d, "nginx's rewrite appends the request's query after a value's own "
                                            "query; Prexy keeps the request's query only when the value has none")

    def _map_text(self, block: DirectiveLike) -> tuple[str, str | None]:
        from prexy.urlmap.loader import parse_map

        out = [f"# map {block.args[0]} {block.args[1]} from {block.file}:{block.line}"]
        for entry in block.block or ():
            if entry.name == "volatile":
                continue
            if entry.block is not None:
                return "", f"map entry {entry.name!r} at {entry.file}:{entry.line} is a block"
            out.append(" ".join(nginx_quote(w) for w in (entry.name, *entry.args)) + ";")
        text = "\n".join(out) + "\n"
        try:
            parse_map(text, f"{block.file}:{block.line}")
        except Exception as exc:  # MapError, or the engine's own refusal
            return "", f"the map is not converted: {exc}"
        return text, None

    def _site_overrides(self, loc: _Scope, site: _Site) -> None:
        """What a server or location / sets apart from http: per-site
        compression; global settings that differ are reported."""
        scopes_differ = any(loc.get(n) and loc.get(n) is not self.http.own(n) and loc.get(n) != self.http.own(n)
                            for n in ("gzip", "gzip_types", "gzip_comp_level", "gzip_min_length"))
        if scopes_differ:
            own: dict[str, Any] = {}
            self._gzip(loc, own, self.compression)
            site.compression = {k: v for k, v in own.items() if self.compression.get(k) != v}
        for name in ("client_max_body_size", "proxy_connect_timeout", "proxy_read_timeout",
                     "client_header_timeout", "client_body_timeout"):
            d = loc.last(name)
            if d is not None and d not in self.http.own(name):
                self.used(d)
                if id(d) not in {id(n) for n in self.http.own(name)}:
                    self.skip(d, "Prexy has this for the whole server, not per site: "
                                 "the http level's value (or Prexy's default) applies")

    def _placeholder(self, servers: Sequence[DirectiveLike]) -> None:
        """No server proxies: a site with a placeholder upstream keeps the
        output a configuration Prexy loads; the report says to point it."""
        site = _Site("default", servers[0] if servers else _Nowhere(), [], "http://127.0.0.1:8080")
        site.keys["host_header"] = "pass"
        site.keys["cache"] = False
        for srv in servers:
            for d in (srv.block or ()):
                if d.name == "listen":
                    scope = _Scope(srv.block or (), self.http)
                    self._listens(_Scope([d], scope), site)
        site.default = True
        self.sites.append(site)
        where = servers[0] if servers else None
        self.notes.append(Note("skipped", where.file if where else "-", where.line if where else 0,
                               "upstream = \"http://127.0.0.1:8080\"",
                               "no server block proxies: site 'default' was written with this placeholder "
                               "upstream; point it at the server that serves these pages"))

    def _listeners(self) -> None:
        endpoints: list[str] = []
        for site in self.sites:
            for e in site.endpoints:
                if e not in endpoints:
                    endpoints.append(e)
        # [::]:N with 0.0.0.0:N: one dual-stack tcp6 socket (Linux's default bindv6only=0)
        for e in list(endpoints):
            if e.startswith("tcp6:") and e.endswith(":interface=\\:\\:"):
                plain = "tcp:" + e.split(":")[1]
                if plain in endpoints:
                    endpoints.remove(plain)
                    for d in self.dual_stack:
                        if d.args[0].endswith("]:" + e.split(":")[1]) or d.args[0] == "[::]":
                            self.note("differs", d, f"{plain} and this are one dual-stack listener, {e} "
                                                    "(IPv4 too, with Linux's default net.ipv6.bindv6only=0)")
        default = next((s for s in self.sites if s.default), None)
        if any(e.startswith("ssl:") for e in endpoints):
            cert_site = default if default is not None and "tls_certificate" in default.keys else next(
                (s for s in self.sites if "tls_certificate" in s.keys), None)
            if cert_site is None:
                for site in self.sites:
                    site.endpoints = [e for e in site.endpoints if not e.startswith("ssl:")]
                dropped = [e for e in endpoints if e.startswith("ssl:")]
                endpoints = [e for e in endpoints if not e.startswith("ssl:")]
                self.notes.append(Note("skipped", self.sites[0].server.file, self.sites[0].server.line,
                                       "listen ... ssl", f"{', '.join(dropped)} left out: no ssl_certificate"))
            else:
                self.server["tls_certificate"] = cert_site.keys["tls_certificate"]
                self.server["tls_key"] = cert_site.keys["tls_key"]
        if not endpoints:
            endpoints = ["tcp:80"]
            first = self.sites[0].server
            self.notes.append(Note("differs", first.file, first.line, "listen",
                                   "no listener left: listening on tcp:80, nginx's default"))
        self.listen = endpoints
        if default is not None and len(self.sites) > 1:
            self.server["default_site"] = default.name
        chosen = self.server.get("default_site", self.sites[0].name)
        for site in self.sites:
            if not site.hosts and site.name != chosen and site.server is not None:
                self.notes.append(Note("differs", site.server.file, site.server.line, "server { ... }",
                                       f"site {site.name!r} has no host names: Prexy routes by Host, so only "
                                       "requests for no site's name reach it when it is default_site"))
        sets = {tuple(s.endpoints) for s in self.sites}
        if len(sets) > 1:
            for site in self.sites:
                self.notes.append(Note("differs", site.server.file, site.server.line, "server { ... }",
                                       f"site {site.name!r} is served on every listener: Prexy has one set "
                                       f"of listeners ({', '.join(endpoints)})"))

    # the output
    def _validate_rules(self, site: _Site) -> str:
        from prexy.substitution.rules import RulesError, parse_rules

        lines = [text for text, _ in site.rules]
        key = "\n".join(lines)
        if key not in self.rules_ok:
            removed: list[tuple[int, str]] = []
            keep = list(range(len(lines)))
            while keep:
                try:
                    parse_rules("\n".join(lines[i] for i in keep) + "\n", "rules", lazy=True)
                    break
                except RulesError as exc:
                    index = keep[min(max(exc.line, 1), len(keep)) - 1]
                    removed.append((index, exc.reason))
                    keep.remove(index)
            self.rules_ok[key] = ("".join(lines[i] + "\n" for i in keep), removed)
        text, removed = self.rules_ok[key]
        for index, reason in removed:
            self.skip(site.rules[index][1], f"Prexy refuses it: {reason}")
        return text

    def _files(self) -> Conversion:
        files: dict[str, bytes] = {}
        out = ["# Converted from nginx by `prexy convert nginx`; see REPORT.txt for what was not.", ""]
        out.append("[server]")
        out.append(f"listen = {_toml_value(self.listen)}")
        for key, value in self.server.items():
            out.append(f"{key} = {_toml_value(value)}")
        if self.timeouts:
            out += ["", "[timeouts]"] + [f"{k} = {_toml_value(v)}" for k, v in self.timeouts.items()]
        if self.cache:
            out += ["", "[cache]"] + [f"{k} = {_toml_value(v)}" for k, v in self.cache.items()]
        out += ["", "[compression]"] + [f"{k} = {_toml_value(v)}" for k, v in self.compression.items()]
        for site in self.sites:
            out += ["", f"[sites.{site.name}]"]
            where = f"{site.server.file}:{site.server.line}" if site.server is not None else "-"
            out[-1] += f"  # {where}"
            if site.hosts:
                out.append(f"hosts = {_toml_value(site.hosts)}")
            out.append(f"upstream = {_toml_value(site.upstream)}")
            for key, value in site.keys.items():
                out.append(f"{key} = {_toml_value(value)}")
            if site.rules:
                text = self._validate_rules(site)
                if text:
                    path = f"rules/{site.name}.rules"
                    files[path] = (f"# site {site.name}, from {where}\n" + text).encode()
                    out.append(f"rules = {_toml_value([path])}")
            if site.compression:
                out.append(f"compression = {{ {', '.join(f'{k} = {_toml_value(v)}' for k, v in site.compression.items())} }}")
        files["prexy.toml"] = ("\n".join(out) + "\n").encode()
        for path, text in self.maps.items():
            files[path] = text.encode()
        files["REPORT.txt"] = self._report().encode()
        return Conversion(files, tuple(self.notes), tuple(s.name for s in self.sites))

    def _report(self) -> str:
        order = {n: i for i, n in enumerate(("skipped", "differs", "unneeded"))}
        notes = sorted(self.notes, key=lambda n: (order[n.kind], n.file, n.line))
        titles = {"skipped": "Not converted", "differs": "Converted, with a difference",
                  "unneeded": "Not needed (Prexy does this itself)"}
        out = [f"prexy convert nginx: {len(self.sites)} site(s): {', '.join(s.name for s in self.sites)}"]
        for kind in ("skipped", "differs", "unneeded"):
            group = [n for n in notes if n.kind == kind]
            out += ["", f"{titles[kind]} ({len(group)}):"]
            out += [f"  {n}" for n in group] or ["  (none)"]
        return "\n".join(out) + "\n"


def _if_variable(args: Sequence[str]) -> str | None:
    """``$v`` of ``if ($v)``, ``if ($v != "")`` or ``if ($v != '')``; else None."""
    inner = list(args)
    if inner and inner[0].startswith("("):
        inner[0] = inner[0][1:]
    if inner and inner[-1].endswith(")"):
        inner[-1] = inner[-1][:-1]
    inner = [a for a in inner if a]
    if len(inner) == 1 and re.fullmatch(r"\$\w+", inner[0]):
        return inner[0]
    if len(inner) == 3 and inner[1] == "!=" and inner[2] in ("", '""', "''"):
        return inner[0]
    if len(inner) == 2 and inner[1] == "!=":
        return inner[0]
    return None


def _map_action(block: Sequence[DirectiveLike], var: str) -> tuple[str, int, bool] | None:
    """(map_action, redirect_status, map_keep_query) for an if block holding
    only ``return CODE $var`` or ``rewrite ^ $var FLAG``; else None."""
    if len(block) != 1:
        return None
    d = block[0]
    if d.name == "return":
        if len(d.args) == 2 and d.args[1] == var and d.args[0] in ("301", "302", "303", "307", "308"):
            return "redirect", int(d.args[0]), False
        return None
    if d.name == "rewrite" and len(d.args) in (2, 3) and d.args[1] == var and d.args[0] in ("^", "^.*$", "^(.*)$", "."):
        flag = d.args[2] if len(d.args) == 3 else ""
        if flag == "permanent":
            return "redirect", 301, True
        if flag == "redirect":
            return "redirect", 302, True
        return "rewrite", 301, True
    return None


def _subs_replacement(repl: str, regex: bool) -> tuple[str, str | None]:
    """subs_filter's replacement as replace_filter's: ``$N`` (one digit, as
    nginx reads it) -> ``${N}``; any other ``$`` (a variable) is not
    convertible, nor is a literal ``$`` replace_filter would read."""
    out: list[str] = []
    i = 0
    while i < len(repl):
        ch = repl[i]
        if ch == "$":
            nxt = repl[i + 1:i + 2]
            if regex and nxt.isdigit():
                out.append("${" + nxt + "}")
                i += 2
                continue
            if nxt and (nxt.isalnum() or nxt in "_{"):
                return "", f"the replacement has a variable ({repl!r}); replace_filter has only $N captures"
            out.append("$$")
            i += 1
            continue
        out.append(ch)
        i += 1
    return "".join(out), None


def _literal(text: str) -> str:
    """A fixed string as a replace_filter (sregex) pattern."""
    return re.sub(r"([.\\?*+()\[\]{}|^$])", r"\\\1", text)


def _crosses_lines(pattern: str) -> bool:
    """Whether a PCRE pattern may match a line break: ``\\n``, ``\\s``, a
    negated class, ``\\W`` ``\\D`` ``\\H``... (subs_filter sees one line at a time)."""
    return bool(re.search(r"\\[nsWDRvV]|\[\^|\\x0[aA]|\(\?[a-z]*s", pattern))


def convert(directives: Sequence[DirectiveLike], prefix: str = ".") -> Conversion:
    """Convert nginx ``directives`` (includes expanded); relative certificate
    and log paths are resolved against ``prefix`` as nginx resolves them."""
    return _Converter(directives, prefix).run()
