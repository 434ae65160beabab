"""Finding a running Prexy's admin endpoint and talking to it, for the
operator's views (``prexy log``, ``top``, ``hist`` and ``rules diff``).

Plain blocking standard library (``http.client``, ``tomllib``): the views
run outside Twisted, as short-lived commands.  The endpoint is given as
``--admin`` (a URL, ``http://127.0.0.1:9080``, or a Twisted endpoint string
as the configuration writes it, ``tcp:9080:interface=127.0.0.1`` or
``unix:/run/prexy/admin.sock``) or found in the configuration file's
``[server] admin`` (with its ``admin_token``).  The file is read with
``tomllib`` alone, not with :func:`prexy.config.load_config`: that one
reads and checks every file the configuration names (rules, maps,
certificates and their keys), which an operator's account need not be able
to read, and the views need two keys of one table.

Every failure is an :class:`AdminError` whose text is one line for the
operator; :class:`NdjsonReader` cuts the live log's stream into records
whatever the sizes of the reads.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import tomllib
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs

from prexy.endpoints import split_endpoint

__all__ = [
    "AdminClient",
    "AdminError",
    "AdminTarget",
    "NdjsonReader",
    "TOKEN_ENV",
    "config_target",
    "endpoint_target",
    "find_target",
    "parse_admin",
]

#: The environment variable read for the admin token when ``--token`` is
#: not given (a token on the command line shows in ``ps``).
TOKEN_ENV = "PREXY_ADMIN_TOKEN"

#: The longest line of the live log accepted: a server sending more without
#: a newline is broken, and the reader does not buffer without bound.
MAX_LINE = 1024 * 1024


class AdminError(Exception):
    """What stops a view, as one line for the operator; ``status`` is the
    exit status it asks for (2: it could not ask, 1: the answer was a
    refusal)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


@attrs.frozen
class AdminTarget:
    """Where the admin endpoint answers, and the token it wants."""

    #: "http", "https" or "unix".
    scheme: str
    #: The host to connect to; for "unix", the socket's path.
    host: str
    port: int | None = None
    #: Path prefix of an ``--admin`` URL ("" for none); routes go below it.
    prefix: str = ""
    token: str | None = None

    def describe(self) -> str:
        """How error messages name it: ``http://127.0.0.1:9080``, ``unix:/path``."""
        if self.scheme == "unix":
            return f"unix:{self.host}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.prefix}"

    def with_token(self, token: str | None) -> AdminTarget:
        return attrs.evolve(self, token=token)


#: Endpoint kinds of a configuration's ``admin`` key.
_ENDPOINT_KINDS = ("tcp", "tcp6", "unix", "ssl", "systemd")

#: Where a listener bound to every address is reached from this machine.
_ANY = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def endpoint_target(desc: str, token: str | None = None) -> AdminTarget:
    """The target of a Twisted server endpoint string (the admin endpoint
    as the configuration writes it): ``tcp:9080:interface=127.0.0.1`` ->
    http://127.0.0.1:9080, ``unix:/run/prexy/admin.sock`` (or
    ``unix:address=...``) -> that socket.  A listener on every address is
    reached on loopback."""
    kind, args, kwargs = split_endpoint(desc)
    if kind in ("tcp", "tcp6"):
        port_text = kwargs.get("port", args[0] if args else "")
        try:
            port = int(port_text)
        except ValueError:
            raise AdminError(f"admin endpoint {desc!r}: no port") from None
        if not 0 < port < 65536:
            raise AdminError(f"admin endpoint {desc!r}: port {port} is out of range")
        interface = kwargs.get("interface", args[1] if len(args) > 1 else ("::" if kind == "tcp6" else ""))
        return AdminTarget("http", _ANY.get(interface, interface), port, token=token)
    if kind == "unix":
        path = kwargs.get("address", args[0] if args else "")
        if not path:
            raise AdminError(f"admin endpoint {desc!r}: no socket path")
        return AdminTarget("unix", path, token=token)
    if kind == "ssl":
        raise AdminError(
            f"admin endpoint {desc!r} is TLS: give --admin https://NAME:PORT with the name its certificate holds"
        )
    if kind == "systemd":
        raise AdminError(f"admin endpoint {desc!r} is a socket systemd passes: give --admin URL")
    raise AdminError(f"admin endpoint {desc!r}: unsupported (use tcp:, tcp6: or unix:)")


def parse_admin(value: str, token: str | None = None) -> AdminTarget:
    """``--admin``'s value: an http(s) URL (``http://127.0.0.1:9080``, a
    path prefix allowed), an endpoint string (``tcp:9080``,
    ``unix:/path``), or ``HOST:PORT``."""
    value = value.strip()
    if value.split(":", 1)[0] in _ENDPOINT_KINDS:
        return endpoint_target(value, token)
    url = value if "://" in value else "http://" + value
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise AdminError(f"--admin {value!r}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise AdminError(f"--admin {value!r}: use an http:// or https:// URL, or a tcp: or unix: endpoint")
    if not parts.hostname:
        raise AdminError(f"--admin {value!r}: no host")
    if parts.query or parts.fragment or parts.username is not None:
        raise AdminError(f"--admin {value!r}: a URL with no query, fragment or user, please")
    default = 443 if parts.scheme == "https" else 80
    return AdminTarget(parts.scheme, parts.hostname, port or default, parts.path.rstrip("/"), token)


def config_target(path: str) -> AdminTarget:
    """The admin endpoint and token of a Prexy configuration file
    (``[server] admin`` and ``admin_token``)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise AdminError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AdminError(f"{path}: not a Prexy configuration: {exc}") from None
    server = data.get("server", {})
    if not isinstance(server, dict):
        raise AdminError(f"{path}: [server] is not a table")
    admin = server.get("admin")
    if admin is None:
        raise AdminError(f"{path}: [server] admin is not set: this Prexy has no admin endpoint")
    if not isinstance(admin, str):
        raise AdminError(f"{path}: [server] admin must be an endpoint string")
    token = server.get("admin_token")
    if token is not None and not isinstance(token, str):
        raise AdminError(f"{path}: [server] admin_token must be a string")
    try:
        return endpoint_target(admin, token or None)
    except AdminError as exc:
        raise AdminError(f"{path}: {exc}") from None


def find_target(
    admin: str | None, config: str | None, token: str | None, environ: Mapping[str, str] = os.environ
) -> AdminTarget:
    """The endpoint from ``--admin`` (which wins) or ``--config``; the token
    from ``--token``, else the environment's ``PREXY_ADMIN_TOKEN``, else the
    configuration's ``admin_token``."""
    if admin is None and config is None:
        raise AdminError("say where Prexy's admin endpoint is: --admin URL or --config FILE")
    from_config = config_target(config) if config is not None else None
    target = parse_admin(admin) if admin is not None else from_config
    assert target is not None
    chosen = token or environ.get(TOKEN_ENV) or (from_config.token if from_config is not None else None)
    return target.with_token(chosen or None)


class NdjsonReader:
    """Newline-delimited JSON cut from reads of any size: ``feed(data)``
    gives the values of the lines it completed; ``end()`` says whether the
    stream stopped inside a line.  Blank lines are skipped."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._partial = b""
        self._max = max_line

    def feed(self, data: bytes) -> list[Any]:
        buffered = self._partial + data
        *lines, self._partial = buffered.split(b"\n")
        if len(self._partial) > self._max:
            raise AdminError(f"the live log sent a line longer than {self._max} bytes", status=1)
        out = []
        for line in lines:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                shown = line[:80].decode("utf-8", "replace")
                raise AdminError(f"the live log sent a line that is not JSON: {shown!r}", status=1) from None
        return out

    def end(self) -> bool:
        """True when the stream ended between lines, as it should."""
        return not self._partial.strip()


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (the admin endpoint as ``unix:PATH``)."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _connection(target: AdminTarget, timeout: float | None) -> http.client.HTTPConnection:
    if target.scheme == "unix":
        return _UnixConnection(target.host, timeout)
    if target.scheme == "https":
        return http.client.HTTPSConnection(target.host, target.port, timeout=timeout)
    return http.client.HTTPConnection(target.host, target.port, timeout=timeout)


def _reason(exc: BaseException) -> str:
    """A connection failure in a few words."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, FileNotFoundError):
        return "no such socket"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the name ({exc.strerror})"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


def refusal_text(status: int, body: bytes) -> str:
    """What an answer other than 200 says: what to do about a token for 401
    and 403, else its JSON ``error``, else the first line of its text, else
    the status."""
    if status == 401:
        return "the admin endpoint wants a token (--token, PREXY_ADMIN_TOKEN or the configuration's admin_token)"
    if status == 403:
        return "the admin endpoint refused the token"
    text = body.decode("utf-8", "replace").strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("error"), str):
        return value["error"]
    first = text.splitlines()[0][:200] if text else ""
    return f"{status} {first}".strip() if first else f"{status} {http.client.responses.get(status, '')}".strip()


ConnectionFactory = Callable[[AdminTarget, "float | None"], http.client.HTTPConnection]


class AdminClient:
    """Requests to one admin endpoint, a connection each."""

    def __init__(
        self, target: AdminTarget, timeout: float | None = 10.0, connect: ConnectionFactory = _connection
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._connect = connect

    def open(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None,
        stream: bool = False,
    ) -> http.client.HTTPResponse:
        """The response to one request, its body unread.  The client's
        timeout bounds the connection and the wait for the answer's head;
        a ``stream`` (the live log, which may be quiet for hours) then
        waits for its body without limit."""
        all_headers = {"Accept": "application/json", "User-Agent": "prexy-cli"}
        if self.target.token:
            all_headers["Authorization"] = f"Bearer {self.target.token}"
        all_headers.update(headers or {})
        conn = self._connect(self.target, self.timeout)
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise AdminError(f"cannot reach the admin endpoint at {self.target.describe()}: {_reason(exc)}") from None
        try:
            conn.request(method, self.target.prefix + path, body=body, headers=all_headers)
            response = conn.getresponse()
        except TimeoutError:
            conn.close()
            raise AdminError(
                f"the admin endpoint at {self.target.describe()} did not answer {method} {path.split('?')[0]}"
                f" within {self.timeout:g} s", status=1,
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            reason = f"a bad answer ({type(exc).__name__})" if isinstance(exc, http.client.HTTPException) else _reason(exc)
            raise AdminError(f"the admin endpoint at {self.target.describe()} broke off: {reason}", status=1) from None
        if stream and conn.sock is not None:
            conn.sock.settimeout(None)
        return response

    def _read(self, response: http.client.HTTPResponse) -> bytes:
        try:
            return response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise AdminError(
                f"the admin endpoint at {self.target.describe()} broke off its answer: {_reason(exc)}", status=1
            ) from None

    def call(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        """Status and JSON value of one request; an answer that is not JSON
        is an error unless it is a refusal (then its text is the value)."""
        response = self.open(method, path, body, headers)
        data = self._read(response)
        if response.status != 200:
            return response.status, {"error": refusal_text(response.status, data)}
        try:
            return response.status, json.loads(data)
        except ValueError:
            raise AdminError(f"the admin endpoint at {self.target.describe()} answered {path} with no JSON") from None

    def get_json(self, path: str) -> Any:
        """The JSON of ``GET path``; a refusal is an AdminError."""
        status, value = self.call("GET", path)
        if status != 200:
            raise AdminError(f"{path}: {value['error']}", status=1)
        return value

    def records(self, path: str, read_size: int = 65536, opened: Callable[[], object] | None = None) -> Iterator[Any]:
        """The values of an ndjson stream, each as soon as its line is whole
        (never waiting for the whole answer); ends when the server ends the
        stream.  ``opened`` is called once the answer's head came (the live
        log sends it when every worker records for the reader)."""
        response = self.open("GET", path, headers={"Accept": "application/x-ndjson"}, stream=True)
        if response.status != 200:
            raise AdminError(f"{path.split('?')[0]}: {refusal_text(response.status, self._read(response))}", status=1)
        if opened is not None:
            opened()
        reader = NdjsonReader()
        try:
            while True:
                try:
                    data = response.read1(read_size)
                except (OSError, http.client.HTTPException) as exc:
                    raise AdminError(
                        f"the admin endpoint at {self.target.describe()} broke off the stream: {_reason(exc)}",
                        status=1,
                    ) from None
                if not data:
                    break
                yield from reader.feed(data)
            if not reader.end():
                raise AdminError(f"the admin endpoint at {self.target.describe()} ended the stream mid-line", status=1)
        finally:
            response.close()
