"""One TOML file (or the single-site command line) -> one frozen ``Config``.

Everything is validated here, once, at load time; an error names the file, the
line (found by locating the key in the text, since ``tomllib`` reports lines
only for syntax errors), the key and the reason.  Nothing in this module
imports Twisted or opens sockets, so ``--check`` and the tests run it as is.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import attrs

from prexy.cache.policy import CachePolicy, PolicyError
from prexy.certs import Certificate, CertificateError, load_certificate
from prexy.cluster.settings import ClusterConfig, parse_cluster
from prexy.codec import LEVELS, Compression
from prexy.endpoints import unsupported_options
from prexy.errorpages import NO_PAGES, ErrorPages, load_error_pages
from prexy.files import DISK, IFiles
from prexy.h2settings import H2Settings
from prexy.hostnames import host_problem

SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
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


def parse_size(text: str | int) -> int:
    """``64M`` / ``8k`` / ``1g`` / ``1048576`` -> bytes (nginx-style units)."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"negative size: {text}")
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)[bB]?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (use a number with an optional k, M or G)")
    return int(m.group(1)) * SIZE_UNITS[m.group(2).lower()]


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


@attrs.frozen
class OriginKey:
    """Where a pooled upstream connection goes (and, for https, which CA
    file to trust instead of the system's)."""

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
class MapConfig:
    """How a site uses a URL map."""

    path: str
    action: str = "redirect"  # or "rewrite"
    status: int = 301
    keep_query: bool = True


#: A site's cache keys in the file -> the ``CachePolicy`` field each sets.
CACHE_KEYS = {
    "cache_ttl": "default_ttl",
    "cache_grace": "grace",
    "cache_keep": "keep",
    "cache_stale_if_error": "stale_if_error",
    "cache_ignore_cookies": "ignore_cookies",
    "cache_pass": "pass_rules",
    "cache_max_object": "max_object_size",
    "purge_from": "purge_from",
    "cache_targeted_field": "targeted_cache_control",
}


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
    admin: str | None = None
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


def _include(
    value: Any, sites: Any, main: _Source, files: dict[str, _Source], err: Any, memo: ConfigMemo | None = None,
    reader: IFiles = DISK,
) -> dict[str, Any]:
    """The main file's ``[sites]`` with those of the files ``include`` names
    (glob patterns relative to the main file, each file in name order; a
    pattern matching no file is refused, so a moved folder never drops its
    sites silently).  ``files`` gets each included site's own file."""
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) and p for p in patterns):
        err("include", "must be a glob pattern or a list of them (such as \"sites.d/*.toml\")")
    if sites is not None and not isinstance(sites, dict):
        err("sites", "must be a table")
    merged: dict[str, Any] = dict(sites or {})
    seen: set[str] = set()
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


def _known(
    table: Mapping[str, Any], allowed: Sequence[str], where: str, err: Any
) -> None:
    for key in table:
        if key not in allowed:
            err(f"{where}.{key}" if where else key, f"unknown key (allowed: {', '.join(allowed)})")


def load_config(
    path: str, memo: ConfigMemo | None = None, files: IFiles = DISK, now: float | None = None
) -> Config:
    """Read and validate a TOML config file (and the site files it includes;
    with a ``memo``, those unchanged since the memo's last load are not
    parsed and checked again).  Every file is read through ``files``
    (:mod:`prexy.files`: the disk, or a master's snapshot) by its absolute
    path, the name the configuration's ``source`` keeps: a worker reloading
    from its master's snapshot looks the file up by that name.  With
    ``now`` (seconds since the epoch), certificates must be valid then."""
    path = os.path.abspath(path)
    return parse_config(_read_text(path, files), path, memo, files, now)


def parse_config(
    text: str, path: str = "<config>", memo: ConfigMemo | None = None, files: IFiles = DISK,
    now: float | None = None,
) -> Config:
    """Validate a TOML config text; relative file names resolve against
    ``path``'s directory; the files it names are looked for in ``files``.
    Certificates (a site's and the server's) are read and checked to load
    and match their key; with ``now``, also to be valid at that time (what
    the master and ``--check`` do; a worker loads what they validated)."""
    data = _toml(text, path)
    # The file whose keys are being checked: the main file, or a site's
    # own file (``include``); errors name it and relative names resolve
    # against its directory.
    here = main = _Source(path, text)

    def err(key: str, reason: str) -> None:
        raise ConfigError(here.path, here.locator.line_of(key), key, reason)

    def rel(value: str) -> str:
        return value if os.path.isabs(value) else os.path.normpath(os.path.join(here.base, value))

    def typed(table: Mapping[str, Any], key: str, kind: Any, where: str) -> Any:
        value = table[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            err(f"{where}.{key}" if where else key, f"must be a {name}, got {value!r}")
        return value

    _known(data, ("server", "timeouts", "limits", "cache", "compression", "http2", "sites", "cluster",
                  "include", "acme"), "", err)
    server = data.get("server", {})
    if not isinstance(server, dict):
        err("server", "must be a table")
    _known(
        server,
        (
            "listen",
            "admin",
            "access_log",
            "max_request_body",
            "tls_certificate",
            "tls_key",
            "tls_unknown",
            "default_site",
            "workers",
            "shutdown_timeout",
            "http2",
            "h2c_listen",
            "error_pages",
        ),
        "server",
        err,
    )
    listen = server.get("listen", ["tcp:8080:interface=127.0.0.1"])
    if isinstance(listen, str):
        listen = [listen]
    if not isinstance(listen, list) or not listen or not all(isinstance(x, str) for x in listen):
        err("server.listen", "must be a non-empty list of endpoint strings")
    for desc in listen:
        _check_endpoint(desc, lambda reason: err("server.listen", reason))
    kwargs: dict[str, Any] = {"listen": tuple(listen), "source": os.path.abspath(path)}
    if "admin" in server:
        admin = typed(server, "admin", str, "server")
        _check_endpoint(admin, lambda reason: err("server.admin", reason))
        kwargs["admin"] = admin
    if "access_log" in server:
        value = typed(server, "access_log", str, "server")
        kwargs["access_log"] = None if value in ("", "off") else (value if value == "-" else rel(value))
    if "max_request_body" in server:
        try:
            kwargs["max_request_body"] = parse_size(server["max_request_body"])
        except ValueError as exc:
            err("server.max_request_body", str(exc))
    for key in ("tls_certificate", "tls_key"):
        if key in server:
            file = rel(typed(server, key, str, "server"))
            if not files.is_file(file):
                err(f"server.{key}", f"no such file: {file}")
            kwargs[key] = file
    if any(d.startswith("ssl:") and "privateKey=" not in d for d in listen) and "tls_key" not in kwargs:
        err("server.listen", "an ssl: endpoint needs server.tls_key (and tls_certificate) or privateKey=")
    known_certificates = memo.certificates if memo is not None else {}
    certificates: dict[tuple[bytes, bytes], Certificate] = {}

    def certificate(cert_path: str, key_path: str, where: str, hosts: tuple[str, ...]) -> Certificate:
        """The certificate of these files (read through ``files``, parsed
        once per content), checked for ``hosts`` (and ``now``)."""
        loaded = []
        for key, file in ((f"{where}.tls_certificate", cert_path), (f"{where}.tls_key", key_path)):
            try:
                loaded.append(files.read(file))
            except OSError as exc:
                err(key, f"cannot read {file}: {exc.strerror}")
        pair = (loaded[0], loaded[1])
        found = certificates.get(pair) or known_certificates.get(pair)
        if found is None:
            try:
                found = load_certificate(*pair)
            except CertificateError as exc:
                which = "tls_key" if exc.which == "key" else "tls_certificate"
                err(f"{where}.{which}", f"{key_path if which == 'tls_key' else cert_path}: {exc.reason}")
        assert found is not None
        certificates[pair] = found
        if now is not None:
            problem = found.problem(hosts, now)
            if problem is not None:
                err(f"{where}.tls_certificate", f"{cert_path}: {problem}")
        return found

    if "tls_key" in kwargs:  # (the certificate may be in the key's file)
        certificate(kwargs.get("tls_certificate", kwargs["tls_key"]), kwargs["tls_key"], "server", ())
    if "tls_unknown" in server:
        kwargs["tls_unknown"] = typed(server, "tls_unknown", str, "server")
        if kwargs["tls_unknown"] not in ("default", "refuse"):
            err("server.tls_unknown", "must be 'default' (the [server] certificate) or 'refuse'")
    if "http2" in server:
        kwargs["http2"] = typed(server, "http2", bool, "server")
    if "h2c_listen" in server:
        h2c = server["h2c_listen"]
        if isinstance(h2c, str):
            h2c = [h2c]
        if not isinstance(h2c, list) or not all(isinstance(x, str) for x in h2c):
            err("server.h2c_listen", "must be a list of endpoint strings")
        for desc in h2c:
            if desc not in listen:
                err("server.h2c_listen", f"{desc!r} is not one of server.listen")
            if desc.startswith("ssl:"):
                err("server.h2c_listen", f"{desc!r}: h2c is cleartext HTTP/2; an ssl: listener offers h2 by ALPN")
        kwargs["h2c_listen"] = tuple(h2c)
    kwargs["http2_settings"] = _http2_settings(data.get("http2", {}), err, typed)

    def error_pages(value: Any, where: str) -> ErrorPages:
        def fail(key: str | None, reason: str) -> None:
            table = f"{where}.error_pages"
            if key is None:
                err(table, reason)
            # An entry's own line when it has one (a [*.error_pages] table),
            # else the line of the inline table.
            full = f"{table}.{key}"
            if here.locator.line_of(full) is not None:
                err(full, reason)
            err(table, f"{key!r}: {reason}")

        return load_error_pages(value, rel, fail, files.read)

    server_pages = error_pages(server["error_pages"], "server") if "error_pages" in server else NO_PAGES
    kwargs["error_pages"] = server_pages
    if "workers" in server:
        workers = typed(server, "workers", int, "server")
        if workers < 0:
            err("server.workers", "must be 0 or more")
        kwargs["workers"] = workers
    if "shutdown_timeout" in server:
        kwargs["shutdown_timeout"] = typed(server, "shutdown_timeout", float, "server")

    timeouts = data.get("timeouts", {})
    if not isinstance(timeouts, dict):
        err("timeouts", "must be a table")
    _known(timeouts, [f.name for f in attrs.fields(Timeouts)], "timeouts", err)
    tvalues = {}
    for key in timeouts:
        value = typed(timeouts, key, float, "timeouts")
        if value < 0:
            err(f"timeouts.{key}", "must be 0 (off) or more seconds")
        tvalues[key] = value
    kwargs["timeouts"] = Timeouts(**tvalues)

    limits = data.get("limits", {})
    if not isinstance(limits, dict):
        err("limits", "must be a table")
    _known(limits, [f.name for f in attrs.fields(Limits)], "limits", err)
    lvalues = {}
    for key in limits:
        if key == "max_header_lines":
            count = typed(limits, key, int, "limits")
            if not 1 <= count <= MAX_HEADER_LINES:
                err(f"limits.{key}", f"must be from 1 to {MAX_HEADER_LINES}")
            lvalues[key] = count
            continue
        try:
            lvalues[key] = parse_size(limits[key])
        except ValueError as exc:
            err(f"limits.{key}", str(exc))
        if lvalues[key] < 256:
            err(f"limits.{key}", "must be at least 256 bytes")
    lim = Limits(**lvalues)
    if lim.max_request_head < max(lim.max_request_line, lim.max_header_line):
        err("limits.max_request_head", "must be at least max_request_line and max_header_line")
    kwargs["limits"] = lim

    cache = data.get("cache", {})
    if not isinstance(cache, dict):
        err("cache", "must be a table")
    _known(cache, ("size", "path"), "cache", err)
    if "size" in cache:
        try:
            kwargs["cache_size"] = parse_size(cache["size"])
        except ValueError as exc:
            err("cache.size", str(exc))
    if "path" in cache:
        kwargs["cache_path"] = rel(typed(cache, "path", str, "cache"))
    if "cluster" in data:  # nodes sharing invalidation through Redis (prexy.cluster)
        kwargs["cluster"] = parse_cluster(data["cluster"], err)
    if "acme" in data:
        kwargs["acme"] = _acme(data["acme"], err, typed, rel, files, kwargs.get("cache_path", ""))

    def compression(table: Any, where: str, base: Compression) -> Compression:
        if not isinstance(table, dict):
            err(where, "must be a table")
        _known(table, [f.name for f in attrs.fields(Compression)], where, err)
        ckw: dict[str, Any] = {}
        if "enabled" in table:
            ckw["enabled"] = typed(table, "enabled", bool, where)
        if "types" in table:
            types = table["types"]
            if not isinstance(types, list) or not all(
                isinstance(t, str) and re.fullmatch(r"[A-Za-z0-9.+*_-]+/[A-Za-z0-9.+*_-]+", t) for t in types
            ):
                err(f"{where}.types", "must be a list of media types (type/subtype, type/*, type/*+suffix)")
            ckw["types"] = tuple(types)
        if "min_length" in table:
            try:
                ckw["min_length"] = parse_size(table["min_length"])
            except ValueError as exc:
                err(f"{where}.min_length", str(exc))
        for coding, (low, high) in LEVELS.items():
            key = f"{coding.decode()}_level"
            if key in table:
                level = typed(table, key, int, where)
                if not low <= level <= high:
                    err(f"{where}.{key}", f"must be from {low} to {high}")
                ckw[key] = level
        return attrs.evolve(base, **ckw)

    server_compression = compression(data.get("compression", {}), "compression", Compression())
    kwargs["compression"] = server_compression

    sites_table = data.get("sites")
    site_files: dict[str, _Source] = {}
    if "include" in data:
        sites_table = _include(data["include"], sites_table, main, site_files, err, memo, files)
        kwargs["included"] = tuple(sorted({f.path for f in site_files.values()}))
    if not isinstance(sites_table, dict) or not sites_table:
        err("sites", "at least one [sites.NAME] table with an upstream is required")
    assert isinstance(sites_table, dict)
    sites = []
    seen_hosts: dict[str, str] = {}
    # What the main file gives every site: part of a memoised site's key.
    context = repr((
        kwargs.get("cache_size"), server_compression,
        tuple((key, page.path, page.content_type, len(page.body), hash(page.body)) for key, page in server_pages.pages),
    ))  # (a str: hashed once)
    exists: dict[str, bool] = {}
    page_bytes: dict[str, bytes | None] = {}

    def same_page(path: str, body: bytes) -> bool:  # each file read once per load
        if path not in page_bytes:
            try:
                page_bytes[path] = files.read(path)
            except OSError:
                page_bytes[path] = None
        return page_bytes[path] == body

    def is_file(path: str) -> bool:  # once per file, however many sites name it
        if path not in exists:
            exists[path] = files.is_file(path)
        return exists[path]

    def still_there(site: SiteConfig) -> bool:
        named = (*site.rules, *((site.map.path,) if site.map else ()), *((site.upstream_ca,) if site.upstream_ca else ()),
                 *((site.tls_certificate,) if site.tls_certificate else ()), *((site.tls_key,) if site.tls_key else ()))
        # (a missing one: the site is checked again below, and refused with its key and line)
        return all(is_file(file) for file in named) and all(
            same_page(page.path, page.body) for _, page in site.error_pages.pages
        )

    for name, table in sites_table.items():
        here = site_files.get(name, main)
        where = f"sites.{name}"
        memo_key = (here.key, name, context) if memo is not None and here is not main else None
        known = memo.sites.get(memo_key) if memo is not None and memo_key is not None else None
        if known is not None and still_there(known):
            for h in known.hosts:
                if h in seen_hosts:
                    other = site_files.get(seen_hosts[h], main).path
                    err(f"{where}.hosts", f"host {h!r} already belongs to site {seen_hosts[h]!r} ({other})")
                seen_hosts[h] = name
            if known.acme and "acme" not in kwargs:  # (the main file's [acme] went)
                err(f"{where}.tls", "needs an [acme] table (its CA's directory)")
            if known.tls_certificate is not None and known.tls_key is not None:
                # The files may hold a renewed certificate: read again.
                current = certificate(known.tls_certificate, known.tls_key, where, known.hosts)
                if current != known.certificate:
                    known = attrs.evolve(known, certificate=current)
                    if memo is not None and memo_key is not None:
                        memo.sites[memo_key] = known
            sites.append(known)
            continue
        if not isinstance(table, dict):
            err(where, "must be a table")
        _known(
            table,
            ("upstream", "upstream_ca", "hosts", "host_header", "rules", "map", "map_action",
             "redirect_status", "map_keep_query", "cache", "cache_ttl", "cache_grace",
             "cache_keep", "cache_ignore_cookies", "cache_pass", "cache_max_object", "purge_from",
             "allow_trace", "compression", "upgrade", "cache_stale_if_error", "cache_targeted_field",
             "error_pages", "tls_certificate", "tls_key", "tls"),
            where,
            err,
        )
        if "upstream" not in table:
            err(where, "missing key 'upstream'")
        try:
            upstream = UpstreamURL.parse(typed(table, "upstream", str, where))
        except ValueError as exc:
            err(f"{where}.upstream", str(exc))
        hosts = table.get("hosts", [])
        if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
            err(f"{where}.hosts", "must be a list of host names")
        norm_hosts = tuple(h.lower().rstrip(".") for h in hosts)
        for h in norm_hosts:
            problem = host_problem(h)
            if problem is not None:
                err(f"{where}.hosts", problem)
            if h in seen_hosts:
                other = site_files.get(seen_hosts[h], main).path
                err(f"{where}.hosts", f"host {h!r} already belongs to site {seen_hosts[h]!r} ({other})")
            seen_hosts[h] = name
        host_header = typed(table, "host_header", str, where) if "host_header" in table else "pass"
        allow_trace = typed(table, "allow_trace", bool, where) if "allow_trace" in table else False
        upgrade = table.get("upgrade", ["websocket"])
        if not isinstance(upgrade, list) or not all(isinstance(u, str) and _TOKEN.fullmatch(u) for u in upgrade):
            err(f"{where}.upgrade", "must be a list of protocol names (such as \"websocket\")")
        upstream_ca = None
        if "upstream_ca" in table:
            upstream_ca = rel(typed(table, "upstream_ca", str, where))
            if not is_file(upstream_ca):
                err(f"{where}.upstream_ca", f"no such file: {upstream_ca}")
            if upstream.scheme != "https":
                err(f"{where}.upstream_ca", "only applies to an https upstream")
        tls_paths: dict[str, str] = {}
        for key in ("tls_certificate", "tls_key"):
            if key in table:
                tls_paths[key] = rel(typed(table, key, str, where))
                if not is_file(tls_paths[key]):
                    err(f"{where}.{key}", f"no such file: {tls_paths[key]}")
        site_acme = False
        if "tls" in table:
            if typed(table, "tls", str, where) != "acme":
                err(f"{where}.tls", "the only value is \"acme\" (else give tls_certificate and tls_key)")
            if tls_paths:
                err(f"{where}.tls", "a site's certificate is tls = \"acme\" or its tls_certificate and tls_key,"
                    " not both")
            if "acme" not in kwargs:
                err(f"{where}.tls", "needs an [acme] table (its CA's directory)")
            if not norm_hosts:
                err(f"{where}.tls", "a site's certificate is chosen by its hosts: give it hosts")
            site_acme = True
        site_certificate = None
        if tls_paths:
            for key, other in (("tls_certificate", "tls_key"), ("tls_key", "tls_certificate")):
                if key not in tls_paths:
                    err(f"{where}.{other}", f"needs {key} too (a certificate and its key)")
            if not norm_hosts:
                err(f"{where}.tls_certificate", "a site's certificate is chosen by its hosts: give it hosts")
            site_certificate = certificate(tls_paths["tls_certificate"], tls_paths["tls_key"], where, norm_hosts)
        rules = table.get("rules", [])
        if isinstance(rules, str):
            rules = [rules]
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            err(f"{where}.rules", "must be a file name or a list of file names")
        rule_files = tuple(rel(r) for r in rules)
        for r in rule_files:
            if not is_file(r):
                err(f"{where}.rules", f"no such file: {r}")
        map_cfg = None
        if "map" in table:
            map_path = rel(typed(table, "map", str, where))
            if not is_file(map_path):
                err(f"{where}.map", f"no such file: {map_path}")
            action = table.get("map_action", "redirect")
            if action not in ("redirect", "rewrite"):
                err(f"{where}.map_action", "must be 'redirect' or 'rewrite'")
            status = table.get("redirect_status", 301)
            if status not in REDIRECT_STATUSES:
                err(f"{where}.redirect_status", f"must be one of {REDIRECT_STATUSES}")
            keep_query = table.get("map_keep_query", True)
            if not isinstance(keep_query, bool):
                err(f"{where}.map_keep_query", "must be true or false")
            map_cfg = MapConfig(map_path, action, status, keep_query)
        else:
            for key in ("map_action", "redirect_status", "map_keep_query"):
                if key in table:
                    err(f"{where}.{key}", "has no effect without 'map'")
        cache_cfg = None
        cache_on = table.get("cache", bool(kwargs.get("cache_size")))
        if not isinstance(cache_on, bool):
            err(f"{where}.cache", "must be true or false")
        if cache_on:
            if not kwargs.get("cache_size"):
                err(f"{where}.cache", "needs a cache: set [cache] size")
            # The file's types are checked here; the values by the policy,
            # whose refusal names the field, mapped back to the file's key.
            ckw: dict[str, Any] = {}
            for key in ("cache_ttl", "cache_grace", "cache_keep", "cache_stale_if_error"):
                if key in table:
                    ckw[CACHE_KEYS[key]] = typed(table, key, float, where)
            for key in ("cache_ignore_cookies", "cache_pass", "purge_from"):
                if key in table:
                    value = table[key]
                    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                        err(f"{where}.{key}", "must be a list of strings")
                    ckw[CACHE_KEYS[key]] = tuple(value)
            if "cache_targeted_field" in table:
                ckw["targeted_cache_control"] = typed(table, "cache_targeted_field", str, where)
            if "cache_max_object" in table:
                try:
                    ckw["max_object_size"] = parse_size(table["cache_max_object"])
                except ValueError as exc:
                    err(f"{where}.cache_max_object", str(exc))
            try:
                cache_cfg = CachePolicy(**ckw)
            except PolicyError as exc:
                key = next(k for k, field in CACHE_KEYS.items() if field == exc.field)
                err(f"{where}.{key}", exc.reason)
        sites.append(
            SiteConfig(
                name=name,
                upstream=upstream,
                hosts=norm_hosts,
                host_header=host_header,
                rules=rule_files,
                map=map_cfg,
                cache=cache_cfg,
                upstream_ca=upstream_ca,
                allow_trace=allow_trace,
                upgrade=frozenset(u.lower().encode("ascii") for u in upgrade),
                compression=compression(table.get("compression", {}), f"{where}.compression", server_compression),
                error_pages=error_pages(table["error_pages"], where) if "error_pages" in table else server_pages,
                tls_certificate=tls_paths.get("tls_certificate"),
                tls_key=tls_paths.get("tls_key"),
                certificate=site_certificate,
                acme=site_acme,
            )
        )
        if memo is not None and memo_key is not None:
            memo.sites[memo_key] = sites[-1]
    here = main
    if memo is not None:
        memo.keep_only(list(site_files.values()))
        memo.certificates = certificates
    if "default_site" in server:
        default = typed(server, "default_site", str, "server")
        if default not in sites_table:
            err("server.default_site", f"no site named {default!r}")
    else:
        default = sites[0].name
    kwargs["sites"] = tuple(sites)
    kwargs["default_site"] = default
    return Config(**kwargs)


def _acme(table: Any, err: Any, typed: Any, rel: Any, files: IFiles, cache_path: str) -> AcmeConfig:
    """The ``[acme]`` table, checked (``err`` raises with the key's line)."""
    if not isinstance(table, dict):
        err("acme", "must be a table")
    _known(table, ("directory", "email", "ca_bundle", "storage", "challenges", "ask", "per_domain_per_hour",
                   "concurrent", "on_demand_timeout"), "acme", err)
    if "directory" not in table:
        err("acme", "missing key 'directory' (the CA's ACME directory URL)")
    directory = typed(table, "directory", str, "acme")
    parts = urlsplit(directory)
    if parts.scheme != "https" or not parts.hostname:
        err("acme.directory", f"must be an https:// URL, got {directory!r}")
    kw: dict[str, Any] = {"directory": directory}
    if "email" in table:
        email = typed(table, "email", str, "acme")
        if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email):
            err("acme.email", f"not an e-mail address: {email!r}")
        kw["email"] = email
    if "ca_bundle" in table:
        bundle = rel(typed(table, "ca_bundle", str, "acme"))
        if not files.is_file(bundle):
            err("acme.ca_bundle", f"no such file: {bundle}")
        kw["ca_bundle"] = bundle
    kw["storage"] = rel(typed(table, "storage", str, "acme")) if "storage" in table else default_acme_storage(cache_path)
    if "challenges" in table:
        chosen = table["challenges"]
        if not isinstance(chosen, list) or not chosen or not all(c in ACME_CHALLENGES for c in chosen):
            err("acme.challenges", f"must be a non-empty list of {', '.join(map(repr, ACME_CHALLENGES))}")
        if len(set(chosen)) != len(chosen):
            err("acme.challenges", "lists a challenge twice")
        kw["challenges"] = tuple(chosen)
    if "ask" in table:
        ask = typed(table, "ask", str, "acme")
        ask_parts = urlsplit(ask)
        if ask_parts.scheme not in ("http", "https") or not ask_parts.hostname:
            err("acme.ask", f"must be an http:// or https:// URL, got {ask!r}")
        kw["ask"] = ask
    for key in ("per_domain_per_hour", "concurrent"):
        if key in table:
            value = typed(table, key, int, "acme")
            if value < 1:
                err(f"acme.{key}", "must be 1 or more")
            kw[key] = value
    if "on_demand_timeout" in table:
        wait = table["on_demand_timeout"]
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 < wait <= 60:
            err("acme.on_demand_timeout", f"must be a number of seconds above 0, at most 60, got {wait!r}")
        kw["on_demand_timeout"] = float(wait)
    return AcmeConfig(**kw)


def _http2_settings(table: Any, err: Any, typed: Any) -> H2Settings:
    """The [http2] table."""
    if not isinstance(table, dict):
        err("http2", "must be a table")
    _known(table, [f.name for f in attrs.fields(H2Settings)], "http2", err)
    values: dict[str, Any] = {}
    for key in ("max_concurrent_streams", "max_resets", "max_settings", "max_pings", "max_empty_frames"):
        if key in table:
            value = typed(table, key, int, "http2")
            if not 1 <= value <= 2**31 - 1:
                err(f"http2.{key}", "must be from 1 to 2147483647")
            values[key] = value
    if "max_header_list_size" in table:
        try:
            values["max_header_list_size"] = size = parse_size(table["max_header_list_size"])
        except ValueError as exc:
            err("http2.max_header_list_size", str(exc))
        if not 1024 <= size <= 2**31 - 1:
            err("http2.max_header_list_size", "must be from 1k to 2G")
    if "idle_timeout" in table:
        values["idle_timeout"] = typed(table, "idle_timeout", float, "http2")
        if values["idle_timeout"] < 0:
            err("http2.idle_timeout", "must be 0 (off) or more seconds")
    if "flood_window" in table:
        values["flood_window"] = typed(table, "flood_window", float, "http2")
        if values["flood_window"] <= 0:
            err("http2.flood_window", "must be more than 0 seconds")
    return H2Settings(**values)


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
