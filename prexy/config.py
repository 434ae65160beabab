"""One TOML file (or the single-site command line) -> one frozen ``Config``.

Everything is validated here, once, at load time; an error names the file, the
line (found by locating the key in the text, since ``tomllib`` reports lines
only for syntax errors), the key and the reason.  Nothing in this module
imports Twisted or opens sockets, so ``--check`` and the tests run it as is.

Each key of each table is declared once, in the tables below the values
(``SERVER``, ``SITE``, ... and ``TOP``, the file's top level; the
``[cluster]`` table is ``prexy.cluster.settings.CLUSTER``): its converter,
the field it fills, its default.  :mod:`prexy.configschema` reads a table
with them; ``_Load`` checks what involves several keys or tables.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Sequence
from typing import Any, NoReturn
from urllib.parse import urlsplit

import attrs

from prexy.cache.memo import MEMO_SIZE
from prexy.cache.policy import CachePolicy, PolicyError
from prexy.certs import Certificate, CertificateError, load_certificate
from prexy.cluster.settings import CLUSTER, ClusterConfig
from prexy.codec import LEVELS, Compression
from prexy.configschema import SIZE_UNITS as SIZE_UNITS
from prexy.configschema import (
    Converter,
    Invalid,
    Key,
    Nested,
    Table,
    check_type,
    choice,
    parsed,
    size,
    strings,
    typed,
)
from prexy.configschema import parse_size as parse_size
from prexy.endpoints import unsupported_options
from prexy.errorpages import NO_PAGES, ErrorPages, load_error_pages
from prexy.files import DISK, IFiles
from prexy.h2settings import H2Settings
from prexy.hostnames import host_problem
from prexy.substitution.applicability import DEFAULT_BYTES as APPLICABILITY_BYTES

REDIRECT_STATUSES = (301, 302, 303, 307, 308)
#: An HTTP token (RFC 9110 5.6.2): what an ``Upgrade`` protocol name is.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class ConfigError(Exception):
    """A configuration that cannot be used; ``str()`` is ``file:line: key: reason``."""

    def __init__(self, path: str | None, line: int | None, key: str | None, reason: str) -> None:
        self.path = path
        self.line = line
        self.key = key
        self.reason = reason
        where = path or "<command line>"
        if line is not None:
            where += f":{line}"
        text = f"{where}: {key}: {reason}" if key else f"{where}: {reason}"
        super().__init__(text)


@attrs.frozen
class UpstreamURL:
    """Where a site's requests go."""

    scheme: str
    host: str
    port: int
    #: Path prefix prepended to every request path ('' for none).
    path: str = ""

    @classmethod
    def parse(cls, text: str) -> UpstreamURL:
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"must be an http:// or https:// URL, got {text!r}")
        if not parts.hostname:
            raise ValueError(f"has no host: {text!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"must not have a query or fragment: {text!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ValueError(f"bad port in {text!r}: {exc}") from None
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.path}"


@attrs.frozen(cache_hash=True)
class OriginKey:
    """Where a pooled upstream connection goes (and, for https, which CA
    file to trust instead of the system's).  Its hash is kept: the pool
    looks it up twice per request."""

    scheme: str
    host: str
    port: int
    ca_file: str | None = None
    #: The CA file's content as validated (``prexy.runtime``); None: read
    #: ``ca_file`` when a connection first needs it.
    ca_pem: bytes | None = attrs.field(default=None, repr=False)


@attrs.frozen
class Timeouts:
    """Timeouts in seconds; 0 disables one.  The first four are the
    upstream's, the last two the client's (nginx's ``client_header_timeout``
    and ``client_body_timeout``, with nginx's defaults)."""

    connect: float = 10.0
    first_byte: float = 60.0
    idle: float = 60.0
    pool_idle: float = 30.0
    #: From a request head's first byte (a new connection: from its accept)
    #: to the head's end; then 408 and close.
    client_header: float = 60.0
    #: The longest silence between two reads of a request body; then 408
    #: and close.
    client_body: float = 60.0
    #: A tunnel (WebSocket) with no byte either way for this long is
    #: closed (nginx closes one after ``proxy_read_timeout``, 60 s).
    tunnel_idle: float = 60.0


#: The most ``limits.max_header_lines`` may be: a header line takes at
#: least 4 bytes, so ``max_request_head`` caps the count long before this.
MAX_HEADER_LINES = 100_000


@attrs.frozen
class Limits:
    """Sizes of request and response heads, in bytes, and the number of
    header lines a request may have.  nginx's defaults
    (``large_client_header_buffers 4 8k``) allow lines of 8 KiB; a longer
    request line gets 414, a longer header line, a longer head or more
    header lines 431."""

    max_request_line: int = 8 * 1024
    max_header_line: int = 8 * 1024
    #: The whole request head: request line, header lines and line ends.
    max_request_head: int = 64 * 1024
    #: The whole response head from an upstream; larger is a 502.
    max_response_head: int = 64 * 1024
    #: Header lines (fields) in a request head, Host included: Apache's
    #: ``LimitRequestFields`` default.  nginx refuses past 1,000 lines
    #: (400); real clients send a few dozen at most.
    max_header_lines: int = 100


@attrs.frozen
class ObserveConfig:
    """The ``[observe]`` table: the operator's view (``prexy.observe``)."""

    #: Sites with their own label set in ``/metrics`` (the most requested;
    #: the rest are summed under ``site="other"``).
    top_sites: int = 20
    #: Rules that fired in none of a site's last this many rewritten
    #: responses are listed as never matching.
    never_matched_window: int = 1000


@attrs.frozen
class MapConfig:
    """How a site uses a URL map."""

    path: str
    action: str = "redirect"  # or "rewrite"
    status: int = 301
    keep_query: bool = True


#: The challenge types ``[acme] challenges`` may list (prexy.acme.issuer).
ACME_CHALLENGES = ("http-01", "tls-alpn-01")


def default_acme_storage(cache_path: str) -> str:
    """Where certificates are stored unless ``[acme] storage`` says:
    ``$STATE_DIRECTORY/acme`` under systemd's ``StateDirectory=`` (the
    unit in conf/ sets ``/var/lib/prexy``); else beside a configured
    ``[cache] path`` (its sibling ``prexy-acme``); else
    ``/var/lib/prexy/acme`` for root, ``~/.local/state/prexy/acme`` for
    another user.  Never the default cache directory, which is tmpfs: the
    certificates must outlive a reboot (re-issuing them all would meet the
    CA's rate limits)."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return os.path.join(state, "acme")
    if cache_path:
        return os.path.join(os.path.dirname(cache_path.rstrip("/")) or "/", "prexy-acme")
    if os.getuid() == 0:
        return "/var/lib/prexy/acme"
    return os.path.join(os.path.expanduser("~"), ".local", "state", "prexy", "acme")


@attrs.frozen
class AcmeConfig:
    """The ``[acme]`` table: the CA of the sites with ``tls = "acme"``."""

    #: The CA's directory URL (https).
    directory: str
    #: The account's contact; None: none.
    email: str | None = None
    #: A PEM file of CAs to trust for the directory's HTTPS; None: the system's.
    ca_bundle: str | None = None
    #: The directory of the certificates and the account key (one per machine).
    storage: str = ""
    #: The challenge types answered, in order of preference.
    challenges: tuple[str, ...] = ACME_CHALLENGES
    #: The ask check's URL (names under a wildcard host, issued on demand).
    ask: str | None = None
    #: Orders per registered domain per hour, and in flight at once.
    per_domain_per_hour: int = 5
    concurrent: int = 2
    #: How long a first handshake for a name under a wildcard host waits
    #: for its certificate (seconds) before the default serves it.
    on_demand_timeout: float = 10.0


@attrs.frozen
class SiteConfig:
    """One site: the Host names it answers and the upstream it fronts."""

    name: str
    upstream: UpstreamURL
    hosts: tuple[str, ...] = ()
    #: "pass" (the client's Host), "upstream" (the upstream's host) or a literal.
    host_header: str = "pass"
    rules: tuple[str, ...] = ()
    map: MapConfig | None = None
    #: The site's cache settings (the store itself is [cache]); None: not cached.
    cache: CachePolicy | None = None
    #: PEM file of the CA(s) to trust for an https upstream (default: the system's).
    upstream_ca: str | None = None
    #: Forward TRACE requests (off: 405, as nginx answers).
    allow_trace: bool = False
    #: Compression of answers to clients: the server's [compression]
    #: with the site's [sites.NAME.compression] keys over it.
    compression: Compression = Compression()
    #: Protocols an ``Upgrade`` request may switch to (lower-case; empty:
    #: none, the request is an ordinary one).
    upgrade: frozenset[bytes] = frozenset({b"websocket"})
    #: The pages of the answers Prexy makes itself (its ``error_pages``,
    #: else the server's); empty: generic bodies.
    error_pages: ErrorPages = NO_PAGES
    #: The site's own certificate (PEM chain and key files) for the ssl:
    #: listeners, chosen by the handshake's server name; None: the
    #: [server] one.
    tls_certificate: str | None = None
    tls_key: str | None = None
    #: Their contents as validated (compared by bytes: a renewed file is a
    #: changed site).
    certificate: Certificate | None = attrs.field(default=None, repr=False)
    #: ``tls = "acme"``: certificates for its hosts from the [acme] CA.
    acme: bool = False

    def upstream_host_header(self, client_host: bytes | None) -> bytes:
        if self.host_header == "pass":
            return client_host or self.upstream.host_header.encode("ascii")
        if self.host_header == "upstream":
            return self.upstream.host_header.encode("ascii")
        return self.host_header.encode("ascii")


@attrs.frozen
class Config:
    """Everything Prexy needs to run; immutable, compared by value."""

    listen: tuple[str, ...]
    sites: tuple[SiteConfig, ...]
    default_site: str
    timeouts: Timeouts = Timeouts()
    limits: Limits = Limits()
    max_request_body: int = 64 * 1024 * 1024
    access_log: str | None = "-"
    #: The access log's lines: "combined", "json", or an nginx-style
    #: format of ``$variables`` (``prexy.logformat.FORMAT_VARIABLES``).
    access_log_format: str = "combined"
    admin: str | None = None
    #: A token every admin request must carry (``Authorization: Bearer``);
    #: None: the admin endpoint's address is its only guard.
    admin_token: str | None = None
    tls_certificate: str | None = None
    tls_key: str | None = None
    #: A TLS handshake with no server name, or one no site serves:
    #: "default" (the [server] certificate) or "refuse" (an
    #: unrecognized_name alert).
    tls_unknown: str = "default"
    #: Offer HTTP/2 (ALPN h2 beside http/1.1) on the ssl: listeners
    #: (Prexy's own HTTP/2 connection, prexy.h2server); false: HTTP/1.1 only.
    http2: bool = True
    #: The [http2] table: limits of HTTP/2 connections.
    http2_settings: H2Settings = H2Settings()
    #: Listen endpoints (of ``listen``) that also take cleartext HTTP/2
    #: with prior knowledge (h2c).
    h2c_listen: tuple[str, ...] = ()
    cache_size: int = 0
    #: Directory of the machine-wide cache store (shared by all workers).
    cache_path: str = ""
    #: Bytes each process keeps of what it decoded or made from the store
    #: (objects, compressed variants, hit answers: ``prexy.cache.memo``).
    memo_size: int = MEMO_SIZE
    #: Bytes each process gives the rule-applicability memory
    #: (``prexy.substitution.applicability``): about 50,000 versions.
    applicability_memory: int = APPLICABILITY_BYTES
    workers: int | None = None
    shutdown_timeout: float = 30.0
    source: str | None = None
    #: The [compression] table: every site's, unless it sets its own keys.
    compression: Compression = Compression()
    #: The [cluster] table: nodes sharing invalidation; None: a node alone.
    cluster: ClusterConfig | None = None
    #: The site files ``include`` brought in (absolute paths, sorted).
    included: tuple[str, ...] = ()
    #: [server] error_pages: the pages of sites that give none of their own.
    error_pages: ErrorPages = NO_PAGES
    #: The [acme] table; None: no automatic certificates.
    acme: AcmeConfig | None = None
    #: The [observe] table.
    observe: ObserveConfig = ObserveConfig()

    def acme_sites(self) -> dict[str, tuple[str, ...]]:
        """The ``tls = "acme"`` sites' hosts, by site name."""
        return {s.name: s.hosts for s in self.sites if s.acme}

    def site(self, name: str) -> SiteConfig:
        for s in self.sites:
            if s.name == name:
                return s
        raise KeyError(name)

    def listen_endpoints(self) -> tuple[str, ...]:
        """Listen strings with the configured certificate filled into ``ssl:``
        endpoints that name none."""
        out = []
        for desc in self.listen:
            if desc.startswith("ssl:") and "privateKey=" not in desc and self.tls_key:
                desc += f":privateKey={_escape_endpoint(self.tls_key)}"
                if "certKey=" not in desc and self.tls_certificate:
                    desc += f":certKey={_escape_endpoint(self.tls_certificate)}"
            out.append(desc)
        return tuple(out)


def _escape_endpoint(value: str) -> str:
    return value.replace("\\", "\\\\").replace(":", "\\:").replace("=", "\\=")


class _Locator:
    """Finds the line of ``table.key`` in a TOML text (best effort)."""

    def __init__(self, text: str) -> None:
        self._lines = text.splitlines()

    def line_of(self, dotted: str) -> int | None:
        parts = dotted.split(".")
        key = parts[-1]
        table = parts[:-1]
        current: list[str] = []
        header_line: int | None = None
        for number, raw in enumerate(self._lines, start=1):
            line = raw.strip()
            m = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", line)
            if m:
                current = [p.strip().strip("\"'") for p in m.group(1).split(".")]
                if current == parts:
                    header_line = number
                continue
            km = re.match(r"^([A-Za-z0-9_\-\"'.]+)\s*=", line)
            if km:
                name = km.group(1).strip("\"'")
                full = current + [p.strip("\"'") for p in name.split(".")]
                if full == parts or (current == table and name == key):
                    return number
        return header_line


class _Source:
    """One file of a configuration: its path, directory and key locator."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.base = os.path.dirname(os.path.abspath(path))
        self.locator = _Locator(text)
        #: What a ``ConfigMemo`` knows this version of the file by.
        self.key = (path, text)

    def where(self, key: str) -> str:
        line = self.locator.line_of(key)
        return self.path if line is None else f"{self.path}:{line}"


class ConfigMemo:
    """What loading a configuration again may reuse (a reload of thousands
    of site files, few of them changed): each included file's tables by its
    path and file status, and each site's validated ``SiteConfig`` by its
    file's path and text, its name and what the main file gives every site
    (the cache size, the server's compression).  An included file whose
    status (device, inode, size, modification and change times in
    nanoseconds, as git's index compares them) is unchanged is not read
    again; one whose status changed is read, and parsed only if its text
    changed.  The files a reused site names (rules, map, CA) are checked to
    exist again."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[Any, dict[str, Any], _Source]] = {}
        self.sites: dict[tuple[Any, ...], SiteConfig] = {}
        #: Certificates loaded, by their files' bytes (chain, key).
        self.certificates: dict[tuple[bytes, bytes], Certificate] = {}

    def keep_only(self, sources: Sequence[_Source]) -> None:
        """Forget the files (and their sites) a load no longer included."""
        keys = {source.key for source in sources}
        self.files = {path: entry for path, entry in self.files.items() if entry[2].key in keys}
        self.sites = {k: site for k, site in self.sites.items() if k[0] in keys}


def _read_text(path: str, files: IFiles = DISK) -> str:
    try:
        raw = files.read(path)
    except OSError as exc:
        raise ConfigError(path, None, None, f"cannot read: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, None, f"not UTF-8: {exc}") from None


def _toml(text: str, path: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        line = int(m.group(1)) if m else None
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise ConfigError(path, line, None, f"TOML syntax: {reason}") from None


def _site_file(path: str, text: str) -> tuple[dict[str, Any], _Source]:
    """An included file's ``[sites]`` table, and the file as a ``_Source``."""
    data = _toml(text, path)
    source = _Source(path, text)
    for key in data:
        if key != "sites":
            raise ConfigError(path, source.locator.line_of(key), key, "an included file holds [sites.NAME] tables only")
    table = data.get("sites")
    if not isinstance(table, dict) or not table:
        raise ConfigError(path, None, "sites", "an included file holds one or more [sites.NAME] tables")
    return table, source


def _rel(base: str, value: str) -> str:
    """A file name a configuration gives, relative to its file's directory ``base``."""
    return value if os.path.isabs(value) else os.path.normpath(os.path.join(base, value))


def _named_rules(
    table: dict[str, Any], base: str, rules_named: Callable[[str], None], told: set[tuple[str, str]],
) -> None:
    """Tell ``rules_named`` the rules files an included file's sites name,
    as soon as it is parsed (long before its sites are checked: a hint,
    which a site's check may yet refuse); ``told``: the names (and their
    directories) told already."""
    for site in table.values():
        names = site.get("rules") if isinstance(site, dict) else None
        for name in [names] if isinstance(names, str) else names if isinstance(names, list) else ():
            if isinstance(name, str) and (base, name) not in told:
                told.add((base, name))
                rules_named(_rel(base, name))


def _include(
    patterns: Sequence[str], sites: Any, main: _Source, files: dict[str, _Source],
    err: Callable[[str, str], NoReturn], memo: ConfigMemo | None = None, reader: IFiles = DISK,
    rules_named: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The main file's ``[sites]`` with those of the files ``include`` names
    (glob patterns relative to the main file, each file in name order; a
    pattern matching no file is refused, so a moved folder never drops its
    sites silently).  ``files`` gets each included site's own file;
    ``rules_named`` the rules files each parsed file's sites name."""
    if sites is not None and not isinstance(sites, dict):
        err("sites", "must be a table")
    merged: dict[str, Any] = dict(sites or {})
    seen: set[str] = set()
    told: set[tuple[str, str]] = set()
    for pattern in patterns:
        full = pattern if os.path.isabs(pattern) else os.path.join(main.base, pattern)
        found = reader.glob(full)
        if not found:
            err("include", f"{pattern!r} matches no file")
        for path in found:
            if path in seen:  # (a folder the pattern matches is refused: it cannot be read)
                continue
            seen.add(path)
            known = memo.files.get(path) if memo is not None else None
            status = reader.status(path) if memo is not None else None
            if known is not None and status is not None and known[0] == status:
                _, table, source = known  # unchanged: not even read
            else:
                text = _read_text(path, reader)
                if known is not None and known[2].key[1] == text:
                    _, table, source = known  # touched, same text
                else:
                    table, source = _site_file(path, text)
                    if rules_named is not None:
                        _named_rules(table, source.base, rules_named, told)
                if memo is not None:
                    memo.files[path] = (status, table, source)
            for name, site in table.items():
                if name in merged:
                    first = files.get(name, main)
                    raise ConfigError(
                        path, source.locator.line_of(f"sites.{name}"), f"sites.{name}",
                        f"site {name!r} is already defined at {first.where(f'sites.{name}')}",
                    )
                merged[name] = site
                files[name] = source
    return merged


def load_config(
    path: str, memo: ConfigMemo | None = None, files: IFiles = DISK, now: float | None = None,
    rules_named: Callable[[str], None] | None = None,
) -> Config:
    """Read and validate a TOML config file (and the site files it includes;
    with a ``memo``, those unchanged since the memo's last load are not
    parsed and checked again).  Every file is read through ``files``
    (:mod:`prexy.files`: the disk, or a master's snapshot) by its absolute
    path, the name the configuration's ``source`` keeps: a worker reloading
    from its master's snapshot looks the file up by that name.  With
    ``now`` (seconds since the epoch), certificates must be valid then.
    ``rules_named`` is told each rules file a site read here names, as
    soon as its file is parsed (a hint: a master's start checks them in
    forked processes meanwhile, ``prexy.forked``)."""
    path = os.path.abspath(path)
    return parse_config(_read_text(path, files), path, memo, files, now, rules_named)


def parse_config(
    text: str, path: str = "<config>", memo: ConfigMemo | None = None, files: IFiles = DISK,
    now: float | None = None, rules_named: Callable[[str], None] | None = None,
) -> Config:
    """Validate a TOML config text; relative file names resolve against
    ``path``'s directory; the files it names are looked for in ``files``.
    Certificates (a site's and the server's) are read and checked to load
    and match their key; with ``now``, also to be valid at that time (what
    the master and ``--check`` do; a worker loads what they validated)."""
    load = _Load(text, path, memo, files, now)
    load.rules_named = rules_named
    return load.config(_toml(text, path))


# -- the keys of each table ------------------------------------------------------
#
# Each key is declared once, in its table below: its converter checks the
# file's value and makes the field's; ``configschema.Table.read`` applies
# them.  What involves several keys or tables (a certificate and its key,
# a host two sites claim) is checked by the loader (``_Load``) after.


def _refuse(reason: str) -> NoReturn:
    raise Invalid(reason)


def _endpoint(value: Any, ctx: _Load, key: str) -> str:
    value = check_type(value, str)
    _check_endpoint(value, _refuse)
    return value


def _endpoints(reason: str, empty: bool) -> Converter:
    """A list of listen endpoints (or one), each checked."""
    listed = strings(reason, one=True, empty=empty)

    def convert(value: Any, ctx: _Load, key: str) -> tuple[str, ...]:
        out = listed(value, ctx, key)
        for desc in out:
            _check_endpoint(desc, _refuse)
        return out

    return convert


_H2C_LIST = strings("must be a list of endpoint strings", one=True)


def _h2c(value: Any, ctx: _Load, key: str) -> tuple[str, ...]:
    out = _H2C_LIST(value, ctx, key)
    for desc in out:
        if desc.startswith("ssl:"):
            raise Invalid(f"{desc!r}: h2c is cleartext HTTP/2; an ssl: listener offers h2 by ALPN")
    return out


def _path(value: str, ctx: _Load) -> str:
    return ctx.rel(value)


def _file(value: Any, ctx: _Load, key: str) -> str:
    """A file that must exist, relative to the file that names it."""
    path = ctx.rel(check_type(value, str))
    if not ctx.is_file(path):
        raise Invalid(f"no such file: {path}")
    return path


def _access_log(value: str, ctx: _Load) -> str | None:
    return None if value in ("", "off") else (value if value == "-" else ctx.rel(value))


def _log_format(value: Any, ctx: _Load, key: str) -> str:
    from prexy.logformat import FormatError, line_maker

    value = check_type(value, str)
    if not value.strip():
        raise Invalid('must be "combined", "json" or a format of $variables')
    try:
        line_maker(value)
    except FormatError as exc:
        raise Invalid(str(exc)) from None
    return value


def _error_pages(value: Any, ctx: _Load, key: str) -> ErrorPages:
    def fail(entry: str | None, reason: str) -> NoReturn:
        if entry is None:
            raise Invalid(reason)
        # An entry's own line when it has one (a [*.error_pages] table),
        # else the line of the inline table.
        full = f"{key}.{entry}"
        if ctx.here.locator.line_of(full) is not None:
            raise Invalid(reason, full)
        raise Invalid(f"{entry!r}: {reason}")

    return load_error_pages(value, ctx.rel, fail, ctx.files.read)


def _flag(value: Any, ctx: _Load, key: str) -> bool:
    if not isinstance(value, bool):
        raise Invalid("must be true or false")
    return value


#: Seconds, 0 meaning off.
_SECONDS = typed(float, lambda v: v >= 0, "must be 0 (off) or more seconds")

SERVER = Table("server", (
    Key("listen", _endpoints("must be a non-empty list of endpoint strings", empty=False),
        default=("tcp:8080:interface=127.0.0.1",)),
    Key("admin", _endpoint),
    Key("admin_token", typed(str, lambda v: bool(v) and v.isprintable() and " " not in v,
                             "must be a non-empty token of printable characters without spaces")),
    Key("access_log", typed(str, then=_access_log)),
    Key("access_log_format", _log_format),
    Key("max_request_body", size()),
    Key("tls_certificate", _file),
    Key("tls_key", _file),
    Key("tls_unknown", typed(str, lambda v: v in ("default", "refuse"),
                             "must be 'default' (the [server] certificate) or 'refuse'")),
    Key("default_site", typed(str)),
    Key("workers", typed(int, lambda v: v >= 0, "must be 0 or more")),
    Key("shutdown_timeout", typed(float)),
    Key("http2", typed(bool)),
    Key("h2c_listen", _h2c),
    Key("error_pages", _error_pages),
    Key("applicability_memory", size()),
), target=Config)

OBSERVE = Table("observe", (
    Key("top_sites", typed(int, lambda n: 1 <= n <= 10_000, "must be from 1 to 10000")),
    Key("never_matched_window", typed(int, lambda n: 1 <= n <= 10**9, "must be from 1 to 1000000000")),
), target=ObserveConfig)

TIMEOUTS = Table("timeouts", tuple(Key(field.name, _SECONDS) for field in attrs.fields(Timeouts)), target=Timeouts)

_HEAD_SIZE = size(lambda n: n >= 256, "must be at least 256 bytes")

LIMITS = Table("limits", (
    Key("max_request_line", _HEAD_SIZE),
    Key("max_header_line", _HEAD_SIZE),
    Key("max_request_head", _HEAD_SIZE),
    Key("max_response_head", _HEAD_SIZE),
    Key("max_header_lines", typed(int, lambda n: 1 <= n <= MAX_HEADER_LINES, f"must be from 1 to {MAX_HEADER_LINES}")),
), target=Limits)

CACHE = Table("cache", (
    Key("size", size(), field="cache_size"),
    Key("path", typed(str, then=_path), field="cache_path"),
    Key("memo_size", size()),
), target=Config)

_COUNT = typed(int, lambda n: 1 <= n <= 2**31 - 1, "must be from 1 to 2147483647")

HTTP2 = Table("http2", (
    Key("max_concurrent_streams", _COUNT),
    Key("max_header_list_size", size(lambda n: 1024 <= n <= 2**31 - 1, "must be from 1k to 2G")),
    Key("idle_timeout", _SECONDS),
    Key("max_resets", _COUNT),
    Key("max_settings", _COUNT),
    Key("max_pings", _COUNT),
    Key("flood_window", typed(float, lambda v: v > 0, "must be more than 0 seconds")),
    Key("max_empty_frames", _COUNT),
), target=H2Settings)

_MEDIA_TYPE = re.compile(r"[A-Za-z0-9.+*_-]+/[A-Za-z0-9.+*_-]+")


def _level(coding: bytes) -> Converter:
    low, high = LEVELS[coding]
    return typed(int, lambda n: low <= n <= high, f"must be from {low} to {high}")


COMPRESSION = Table("compression", (
    Key("enabled", typed(bool)),
    Key("types", strings("must be a list of media types (type/subtype, type/*, type/*+suffix)",
                         lambda t: _MEDIA_TYPE.fullmatch(t) is not None)),
    Key("min_length", size()),
    Key("gzip_level", _level(b"gzip")),
    Key("br_level", _level(b"br")),
    Key("zstd_level", _level(b"zstd")),
), target=Compression)


def _directory(value: Any, ctx: _Load, key: str) -> str:
    value = check_type(value, str)
    parts = urlsplit(value)
    if parts.scheme != "https" or not parts.hostname:
        raise Invalid(f"must be an https:// URL, got {value!r}")
    return value


def _email(value: Any, ctx: _Load, key: str) -> str:
    value = check_type(value, str)
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", value):
        raise Invalid(f"not an e-mail address: {value!r}")
    return value


def _challenges(value: Any, ctx: _Load, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(c in ACME_CHALLENGES for c in value):
        raise Invalid(f"must be a non-empty list of {', '.join(map(repr, ACME_CHALLENGES))}")
    if len(set(value)) != len(value):
        raise Invalid("lists a challenge twice")
    return tuple(value)


def _ask(value: Any, ctx: _Load, key: str) -> str:
    value = check_type(value, str)
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid(f"must be an http:// or https:// URL, got {value!r}")
    return value


def _wait(value: Any, ctx: _Load, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 60:
        raise Invalid(f"must be a number of seconds above 0, at most 60, got {value!r}")
    return float(value)


_AT_LEAST_ONE = typed(int, lambda n: n >= 1, "must be 1 or more")

ACME = Table("acme", (
    Key("directory", _directory, required="missing key 'directory' (the CA's ACME directory URL)"),
    Key("email", _email),
    Key("ca_bundle", _file),
    Key("storage", typed(str, then=_path), default_from=lambda ctx: default_acme_storage(ctx.cache_path)),
    Key("challenges", _challenges),
    Key("ask", _ask),
    Key("per_domain_per_hour", _AT_LEAST_ONE),
    Key("concurrent", _AT_LEAST_ONE),
    Key("on_demand_timeout", _wait),
), target=AcmeConfig)


_upstream = parsed(UpstreamURL.parse)


def _hosts(value: Any, ctx: _Load, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(h, str) and h for h in value):
        raise Invalid("must be a list of host names")
    hosts = tuple(h.lower().rstrip(".") for h in value)
    for h in hosts:
        problem = host_problem(h)
        if problem is not None:
            raise Invalid(problem)
    return hosts


_RULES_LIST = strings("must be a file name or a list of file names", one=True)


def _rules(value: Any, ctx: _Load, key: str) -> tuple[str, ...]:
    names = _RULES_LIST(value, ctx, key)
    paths = tuple(ctx.rel(r) for r in names)
    for r in paths:
        if not ctx.is_file(r):
            raise Invalid(f"no such file: {r}")
        if ctx.rules_named is not None:
            ctx.rules_named(r)
    return paths


def _cache_on(value: Any, ctx: _Load, key: str) -> bool:
    on = _flag(value, ctx, key)
    if on and not ctx.cache_size:
        raise Invalid("needs a cache: set [cache] size")
    return on


def _upgrade(value: Any, ctx: _Load, key: str) -> frozenset[bytes]:
    if not isinstance(value, list) or not all(isinstance(u, str) and _TOKEN.fullmatch(u) for u in value):
        raise Invalid("must be a list of protocol names (such as \"websocket\")")
    return frozenset(u.lower().encode("ascii") for u in value)


def _tls(value: Any, ctx: _Load, key: str) -> bool:
    if check_type(value, str) != "acme":
        raise Invalid("the only value is \"acme\" (else give tls_certificate and tls_key)")
    if ctx.acme is None:
        raise Invalid("needs an [acme] table (its CA's directory)")
    return True


_LIST = strings("must be a list of strings")

SITE = Table("sites.NAME", (
    Key("upstream", _upstream, required="missing key 'upstream'"),
    Key("upstream_ca", _file),
    Key("hosts", _hosts),
    Key("host_header", typed(str)),
    Key("rules", _rules),
    Key("map", _file, field="map.path"),
    Key("map_action", choice(("redirect", "rewrite"), "must be 'redirect' or 'rewrite'"),
        field="map.action", needs="map"),
    Key("redirect_status", choice(REDIRECT_STATUSES, f"must be one of {REDIRECT_STATUSES}"),
        field="map.status", needs="map"),
    Key("map_keep_query", _flag, field="map.keep_query", needs="map"),
    # ``cache`` turns the site's CachePolicy on (made of the cache.* fields) or off.
    Key("cache", _cache_on, default_from=lambda ctx: bool(ctx.cache_size)),
    Key("cache_ttl", typed(float), field="cache.default_ttl"),
    Key("cache_grace", typed(float), field="cache.grace"),
    Key("cache_keep", typed(float), field="cache.keep"),
    Key("cache_ignore_cookies", _LIST, field="cache.ignore_cookies"),
    Key("cache_pass", _LIST, field="cache.pass_rules"),
    Key("cache_max_object", size(), field="cache.max_object_size"),
    Key("purge_from", _LIST, field="cache.purge_from"),
    Key("cache_stale_if_error", typed(float), field="cache.stale_if_error"),
    Key("cache_targeted_field", typed(str), field="cache.targeted_cache_control"),
    Key("allow_trace", typed(bool)),
    Key("compression", Nested(COMPRESSION, lambda fields, ctx, key: attrs.evolve(ctx.server_compression, **fields)),
        default_from=lambda ctx: ctx.server_compression),
    Key("upgrade", _upgrade),
    Key("error_pages", _error_pages, default_from=lambda ctx: ctx.server_pages),
    Key("tls_certificate", _file),
    Key("tls_key", _file),
    Key("tls", _tls, field="acme"),
), target=SiteConfig)

#: A site's dotted fields -> the part the loader builds (``map``, ``cache``) and its field.
_SITE_PARTS = {key.field: tuple(key.field.split(".", 1)) for key in SITE.keys if "." in key.field}

#: A site's cache keys in the file -> the ``CachePolicy`` field each sets.
CACHE_KEYS = {key.name: key.field.partition(".")[2] for key in SITE.keys if key.field.startswith("cache.")}


_INCLUDE = strings("must be a glob pattern or a list of them (such as \"sites.d/*.toml\")",
                   lambda p: bool(p), one=True, empty=False)


#: The file's top level: its tables, in the order the loader reads them.
TOP = Table("", (
    Key("server", Nested(SERVER, lambda fields, ctx, key: fields)),
    Key("http2", Nested(HTTP2, lambda fields, ctx, key: H2Settings(**fields)), field="http2_settings"),
    Key("timeouts", Nested(TIMEOUTS, lambda fields, ctx, key: Timeouts(**fields))),
    Key("limits", Nested(LIMITS, lambda fields, ctx, key: ctx.limits(fields))),
    Key("cache", Nested(CACHE, lambda fields, ctx, key: fields)),
    Key("cluster", Nested(CLUSTER, lambda fields, ctx, key: ClusterConfig(**fields))),
    Key("acme", Nested(ACME, lambda fields, ctx, key: AcmeConfig(**fields))),
    Key("compression", Nested(COMPRESSION, lambda fields, ctx, key: Compression(**fields))),
    Key("observe", Nested(OBSERVE, lambda fields, ctx, key: ObserveConfig(**fields))),
    Key("include", _INCLUDE),
    Key("sites", Nested(SITE, lambda tables, ctx, key: ctx.sites(tables), each=True)),
))


class _Load:
    """One load of a configuration: the context the tables' converters
    read (which file's keys are being checked, what earlier tables set) and
    the checks across keys and tables."""

    def __init__(self, text: str, path: str, memo: ConfigMemo | None, files: IFiles, now: float | None) -> None:
        # The file whose keys are being checked: the main file, or a site's
        # own file (``include``); errors name it and relative names resolve
        # against its directory.
        self.here = self.main = _Source(path, text)
        self.path = path
        self.memo = memo
        self.files = files
        self.now = now
        self.known_certificates = memo.certificates if memo is not None else {}
        self.certificates: dict[tuple[bytes, bytes], Certificate] = {}
        self.exists: dict[str, bool] = {}
        self.page_bytes: dict[str, bytes | None] = {}
        # What the tables read so far set, for those read after them.
        self.cache_size = 0
        self.cache_path = ""
        self.acme: AcmeConfig | None = None
        self.server_compression = Compression()
        self.server_pages = NO_PAGES
        self.site_files: dict[str, _Source] = {}
        self.seen_hosts: dict[str, str] = {}
        #: Told each rules file a site names (``load_config``).
        self.rules_named: Callable[[str], None] | None = None

    def err(self, key: str, reason: str) -> NoReturn:
        raise ConfigError(self.here.path, self.here.locator.line_of(key), key, reason)

    def rel(self, value: str) -> str:
        return _rel(self.here.base, value)

    def is_file(self, path: str) -> bool:
        """Whether ``path`` is a file: asked once per load, however many sites name it."""
        if path not in self.exists:
            self.exists[path] = self.files.is_file(path)
        return self.exists[path]

    def table(self, data: dict[str, Any], name: str) -> Any:
        """A top-level table of the file (an absent one: empty) read with its declaration."""
        return TOP.convert(name, data.get(name, {}), self, "")

    def config(self, data: dict[str, Any]) -> Config:
        TOP.check_keys(data, self, "")
        kwargs: dict[str, Any] = {"source": os.path.abspath(self.path)}
        server = self.table(data, "server")
        default = server.pop("default_site", None)
        self.check_server(server)
        kwargs.update(server)
        self.server_pages = server.get("error_pages", NO_PAGES)
        kwargs["error_pages"] = self.server_pages
        for name in ("http2", "timeouts", "limits", "observe"):  # (each one value of Config's)
            kwargs[TOP.key(name).field] = self.table(data, name)
        kwargs.update(self.table(data, "cache"))
        self.cache_size = kwargs.get("cache_size", 0)
        self.cache_path = kwargs.get("cache_path", "")
        if "cluster" in data:  # nodes sharing invalidation through Redis (prexy.cluster)
            kwargs["cluster"] = self.table(data, "cluster")
        if "acme" in data:
            kwargs["acme"] = self.acme = self.table(data, "acme")
        kwargs["compression"] = self.server_compression = self.table(data, "compression")
        sites_table = data.get("sites")
        if "include" in data:
            patterns = TOP.convert("include", data["include"], self, "")
            sites_table = _include(patterns, sites_table, self.main, self.site_files, self.err, self.memo, self.files,
                                   self.rules_named)
            kwargs["included"] = tuple(sorted({f.path for f in self.site_files.values()}))
        if not isinstance(sites_table, dict) or not sites_table:
            self.err("sites", "at least one [sites.NAME] table with an upstream is required")
        kwargs["sites"] = TOP.convert("sites", sites_table, self, "")
        if default is not None:
            if default not in sites_table:
                self.err("server.default_site", f"no site named {default!r}")
        else:
            default = kwargs["sites"][0].name
        kwargs["default_site"] = default
        return Config(**kwargs)

    def check_server(self, server: dict[str, Any]) -> None:
        """What [server]'s keys say together: an ssl: listener's key, h2c
        listeners among the listeners, the default certificate."""
        listen = server["listen"]
        for desc in server.get("h2c_listen", ()):
            if desc not in listen:
                self.err("server.h2c_listen", f"{desc!r} is not one of server.listen")
        if any(d.startswith("ssl:") and "privateKey=" not in d for d in listen) and "tls_key" not in server:
            self.err("server.listen", "an ssl: endpoint needs server.tls_key (and tls_certificate) or privateKey=")
        if "tls_key" in server:  # (the certificate may be in the key's file)
            self.certificate(server.get("tls_certificate", server["tls_key"]), server["tls_key"], "server", ())

    def limits(self, fields: dict[str, Any]) -> Limits:
        limits = Limits(**fields)
        if limits.max_request_head < max(limits.max_request_line, limits.max_header_line):
            self.err("limits.max_request_head", "must be at least max_request_line and max_header_line")
        return limits

    def certificate(self, cert_path: str, key_path: str, where: str, hosts: tuple[str, ...]) -> Certificate:
        """The certificate of these files (read through ``files``, parsed
        once per content), checked for ``hosts`` (and ``now``)."""
        loaded = []
        for key, file in ((f"{where}.tls_certificate", cert_path), (f"{where}.tls_key", key_path)):
            try:
                loaded.append(self.files.read(file))
            except OSError as exc:
                self.err(key, f"cannot read {file}: {exc.strerror}")
        pair = (loaded[0], loaded[1])
        found = self.certificates.get(pair) or self.known_certificates.get(pair)
        if found is None:
            try:
                found = load_certificate(*pair)
            except CertificateError as exc:
                which = "tls_key" if exc.which == "key" else "tls_certificate"
                self.err(f"{where}.{which}", f"{key_path if which == 'tls_key' else cert_path}: {exc.reason}")
        self.certificates[pair] = found
        if self.now is not None:
            problem = found.problem(hosts, self.now)
            if problem is not None:
                self.err(f"{where}.tls_certificate", f"{cert_path}: {problem}")
        return found

    def sites(self, sites_table: dict[str, Any]) -> tuple[SiteConfig, ...]:
        memo = self.memo
        sites = []
        # What the main file gives every site: part of a memoised site's key.
        context = repr((
            self.cache_size, self.server_compression,
            tuple((key, page.path, page.content_type, len(page.body), hash(page.body))
                  for key, page in self.server_pages.pages),
        ))  # (a str: hashed once)
        for name, table in sites_table.items():
            self.here = self.site_files.get(name, self.main)
            where = f"sites.{name}"
            memo_key = (self.here.key, name, context) if memo is not None and self.here is not self.main else None
            known = memo.sites.get(memo_key) if memo is not None and memo_key is not None else None
            if known is not None and self.still_there(known):
                site = self.reuse(known, where)
            else:
                site = self.site(name, table, where)
            if memo is not None and memo_key is not None:
                memo.sites[memo_key] = site
            sites.append(site)
        self.here = self.main
        if memo is not None:
            memo.keep_only(list(self.site_files.values()))
            memo.certificates = self.certificates
        return tuple(sites)

    def claim_hosts(self, name: str, hosts: tuple[str, ...], where: str) -> None:
        for h in hosts:
            if h in self.seen_hosts:
                other = self.site_files.get(self.seen_hosts[h], self.main).path
                self.err(f"{where}.hosts", f"host {h!r} already belongs to site {self.seen_hosts[h]!r} ({other})")
            self.seen_hosts[h] = name

    def site(self, name: str, table: Any, where: str) -> SiteConfig:
        """A site's table read with its declaration, then checked across keys."""
        fields: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {"map": {}, "cache": {}}
        for field, value in SITE.read(table, self, where).items():
            split = _SITE_PARTS.get(field)
            if split is None:
                fields[field] = value
            else:
                parts[split[0]][split[1]] = value
        hosts = fields.get("hosts", ())
        self.claim_hosts(name, hosts, where)
        if "upstream_ca" in fields and fields["upstream"].scheme != "https":
            self.err(f"{where}.upstream_ca", "only applies to an https upstream")
        given = [key for key in ("tls_certificate", "tls_key") if key in fields]
        if fields.get("acme"):
            if given:
                self.err(f"{where}.tls", "a site's certificate is tls = \"acme\" or its tls_certificate and tls_key,"
                         " not both")
            if not hosts:
                self.err(f"{where}.tls", "a site's certificate is chosen by its hosts: give it hosts")
        if given:
            for key, other in (("tls_certificate", "tls_key"), ("tls_key", "tls_certificate")):
                if key not in fields:
                    self.err(f"{where}.{other}", f"needs {key} too (a certificate and its key)")
            if not hosts:
                self.err(f"{where}.tls_certificate", "a site's certificate is chosen by its hosts: give it hosts")
            fields["certificate"] = self.certificate(fields["tls_certificate"], fields["tls_key"], where, hosts)
        if parts["map"]:
            fields["map"] = MapConfig(**parts["map"])
        if fields["cache"]:
            try:
                fields["cache"] = CachePolicy(**parts["cache"])
            except PolicyError as exc:
                key = next(k for k, field in CACHE_KEYS.items() if field == exc.field)
                self.err(f"{where}.{key}", exc.reason)
        else:
            fields["cache"] = None
        return SiteConfig(name=name, **fields)

    def still_there(self, site: SiteConfig) -> bool:
        """Whether the files a memoised site names are all still there (a
        missing one: the site is checked again, and refused with its key
        and line)."""
        named = (*site.rules, *((site.map.path,) if site.map else ()), *((site.upstream_ca,) if site.upstream_ca else ()),
                 *((site.tls_certificate,) if site.tls_certificate else ()), *((site.tls_key,) if site.tls_key else ()))
        return all(self.is_file(file) for file in named) and all(
            self.same_page(page.path, page.body) for _, page in site.error_pages.pages
        )

    def same_page(self, path: str, body: bytes) -> bool:  # each file read once per load
        if path not in self.page_bytes:
            try:
                self.page_bytes[path] = self.files.read(path)
            except OSError:
                self.page_bytes[path] = None
        return self.page_bytes[path] == body

    def reuse(self, known: SiteConfig, where: str) -> SiteConfig:
        """A memoised site, checked against what may have changed outside its file."""
        self.claim_hosts(known.name, known.hosts, where)
        if known.acme and self.acme is None:  # (the main file's [acme] went)
            self.err(f"{where}.tls", "needs an [acme] table (its CA's directory)")
        if known.tls_certificate is not None and known.tls_key is not None:
            # The files may hold a renewed certificate: read again.
            current = self.certificate(known.tls_certificate, known.tls_key, where, known.hosts)
            if current != known.certificate:
                known = attrs.evolve(known, certificate=current)
        return known


def _check_endpoint(desc: str, fail: Any) -> None:
    kind = desc.split(":", 1)[0]
    if kind not in ("tcp", "tcp6", "ssl", "unix", "systemd"):
        fail(f"unsupported endpoint {desc!r} (use tcp:, tcp6:, ssl:, unix: or systemd:)")
    unknown = unsupported_options(desc)
    if unknown:
        fail(
            f"{desc!r}: option(s) {', '.join(unknown)} not supported on an ssl: listener"
            " (it takes interface, backlog, privateKey and certKey; put the chain after the"
            " certificate in certKey's file)"
        )


def single_site_config(
    listen: Sequence[str],
    upstream: str,
    rules: Sequence[str] = (),
    map_path: str | None = None,
    cache_size: int = 0,
    admin: str | None = None,
    workers: int | None = None,
    host_header: str = "pass",
    files: IFiles = DISK,
) -> Config:
    """The config the single-site command line describes (its files looked
    for in ``files``)."""
    try:
        url = UpstreamURL.parse(upstream)
    except ValueError as exc:
        raise ConfigError(None, None, "--upstream", str(exc)) from None
    for desc in listen:
        _check_endpoint(desc, lambda reason: _raise_cli("--listen", reason))
    for r in rules:
        if not files.is_file(r):
            raise ConfigError(None, None, "--rules", f"no such file: {r}")
    if map_path is not None and not files.is_file(map_path):
        raise ConfigError(None, None, "--map", f"no such file: {map_path}")
    site = SiteConfig(
        name="default",
        upstream=url,
        host_header=host_header,
        rules=tuple(os.path.abspath(r) for r in rules),
        map=MapConfig(os.path.abspath(map_path)) if map_path else None,
        cache=CachePolicy() if cache_size else None,
    )
    return Config(
        listen=tuple(listen) or ("tcp:8080:interface=127.0.0.1",),
        sites=(site,),
        default_site="default",
        cache_size=cache_size,
        admin=admin,
        workers=workers,
    )


def _raise_cli(key: str, reason: str) -> None:
    raise ConfigError(None, None, key, reason)
