"""Response-header rewriting: nginx's ``proxy_redirect``, ``proxy_cookie_domain``
and ``proxy_cookie_path`` with nginx 1.22's semantics, and Prexy's own
``replace_filter_headers``, as directives of a Prexy rules file.

Pure (no Twisted, no I/O): :class:`HeaderRulesBuilder` takes the directives
:func:`prexy.substitution.rules.tokenize` yields, :meth:`HeaderRules.apply`
rewrites one response's headers.  nginx's behaviour, kept here and checked
against nginx 1.22.1 by ``tests/integration/test_headerrules_nginx.py``:

* ``proxy_redirect``: ``Location``, and ``Refresh`` after its first caseless
  ``url=`` (even inside ``curl=``).  Rules in order, first match wins.  FROM is
  a case-sensitive prefix replaced by TO; ``~RE`` / ``~*RE`` (caseless) is
  searched and the whole value (after ``url=``) becomes TO.  No directive
  means ``default``; ``proxy_redirect default x;`` is the literal "default".
* The last Location the rules rewrote is made absolute if it starts with
  ``/`` (``scheme://host[:port]``, no port for http on 80 or https on 443).
  Other Locations, rewritten or not, stay as they are; Refresh is never made
  absolute.
* ``Set-Cookie`` is cut at every ``;``, spaces (not tabs) trimmed around names
  and values.  A cookie whose first pair lacks ``=`` is left alone.  Each later
  ``Domain``/``Path`` (caseless) with an ``=`` goes through its rules, first
  match wins.  Domain: a leading dot of the value is kept aside, the rest
  compared caselessly and exactly with the pattern (whose leading dot, and the
  replacement's, are dropped at load); Domain regexes are always caseless and
  replace the whole value, dot included.  Path: case-sensitive prefix.  A
  rewritten cookie is rebuilt as its pairs joined by ``"; "``, empty ones
  kept (``a=1; ; b``, a trailing ``"; "``); any other is untouched.
* Variables, names caseless: ``$host $http_host $scheme $server_port
  $proxy_host``, ``${name}``, ``$1``..``$9`` (``$10`` is ``$1`` then ``0``) and
  named captures, known in the whole file once any of its regexes has them.
  Captures are those of the last regex that matched in the response, maybe on
  an earlier header (nginx keeps them per request; a match without groups
  leaves none).  Regexes themselves are not expanded.

``add_header``, ``proxy_hide_header`` and ``proxy_set_header`` are
:mod:`prexy.headeredits`' (kept in :attr:`HeaderRules.edits`); the values
of both are :mod:`prexy.headervars`'.

Prexy's additions: ``Content-Location`` is rewritten like Location (it names
the origin just as well) but never made absolute nor counted as "the last
Location".  ``replace_filter_headers NAME ...;`` applies ``substitute`` (the
site's body rules) to the named headers after the nginx rewrites and before
the Location is made absolute (where an nginx header filter would run);
framing and hop-by-hop headers are refused.

Deviations from nginx, on purpose:

* Regexes run on the ``regex`` package, not PCRE2: ``(?'n'...)`` and
  ``\\Q...\\E`` are translated, duplicate names and names over 32 bytes
  refused as PCRE2 does; rarer constructs may differ.  Errors read ``bad regex
  "...": <reason>``.  A match past :data:`REGEX_TIMEOUT` is no match (as a
  PCRE match-limit error is in nginx).
* Only the variables above exist: nginx's others ($uri, $http_NAME...) are
  'unknown "x" variable' (there are no such values here), reported on the
  token (nginx gives no line).  A named capture may not be called like a
  variable (nginx refuses four and lets one shadow ``$proxy_host``) nor like
  another capture but for case (nginx merges them).
* nginx keeps stale captures as offsets into a buffer that a later, shorter
  in-place rewrite may change (it then sends garbage, even a NUL); here they
  are the text as matched.
* The absolute Location stays in place (nginx sends it before all others).
  Without a Host header nginx's ``$host`` is the server_name and the absolute
  Location has the local address: here both are ``vars.host``.
* Combined rules files act as one file; nginx's "is duplicate" across files
  raises :class:`HeaderRulesConflict`.  An unbound ``default`` does nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import regex

from prexy.headeredits import HeaderEdits, HeaderEditsBuilder, is_edit
from prexy.headervars import FRAMING_HEADERS, HeaderRulesConflict, RequestVars, Token
from prexy.headervars import TCHAR as _TCHAR
from prexy.headervars import Template as _Template
from prexy.headervars import TemplateError as _Error
from prexy.headervars import compile_value as _compile_value

__all__ = ["FRAMING_HEADERS", "REGEX_TIMEOUT", "HeaderRules", "HeaderRulesBuilder",
           "HeaderRulesConflict", "RequestVars", "parse_cookie"]

#: Seconds one regex may take on one header value before it counts as no match.
REGEX_TIMEOUT = 0.1

_BUILTINS = (b"host", b"http_host", b"scheme", b"server_port", b"proxy_host")
_OURS = (b"proxy_redirect", b"proxy_cookie_domain", b"proxy_cookie_path", b"replace_filter_headers")


_NAMED = regex.compile(rb"\(\?(?:P?<(?![=!])([^>]*)>|'([^']*)')")
_GROUP_NAME = regex.compile(rb"[A-Za-z_][A-Za-z0-9_]{0,31}\Z")


def _translate(pattern: bytes) -> tuple[bytes, list[bytes]]:
    """PCRE2 syntax to the ``regex`` package's, and the group names (lower case)."""
    out = bytearray()
    names: list[bytes] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == 0x5C:  # backslash
            nxt = pattern[i + 1 : i + 2]
            if nxt == b"Q":
                end = pattern.find(b"\\E", i + 2)
                end = n if end < 0 else end
                out += regex.escape(pattern[i + 2 : end], special_only=False)
                i = end + 2
            elif nxt == b"E":
                i += 2
            else:
                out += pattern[i : i + 2]
                i += 2
            continue
        if in_class:
            if pattern.startswith(b"[:", i) and (end := pattern.find(b":]", i + 2)) >= 0:
                out += pattern[i : end + 2]
                i = end + 2
                continue
            in_class = c != 0x5D
            out.append(c)
            i += 1
            continue
        if c == 0x5B:  # '[': a leading ']' (after an optional '^') is literal
            in_class = True
            j = i + 1 + (pattern[i + 1 : i + 2] == b"^")
            j += pattern[j : j + 1] == b"]"
            out += pattern[i:j]
            i = j
            continue
        if c == 0x28 and pattern.startswith(b"(?#", i):
            end = pattern.find(b")", i)
            end = n - 1 if end < 0 else end
            out += pattern[i : end + 1]
            i = end + 1
            continue
        m = _NAMED.match(pattern, i) if c == 0x28 else None
        if m is not None:
            name = m.group(1) if m.group(1) is not None else m.group(2)
            if not _GROUP_NAME.match(name):
                raise _Error(f'bad group name "{name.decode("latin-1")}" (a letter or "_", then letters, digits, "_", at most 32)')
            if name.lower() in names:
                raise _Error(f'two named subpatterns have the same name "{name.decode("latin-1")}"')
            if name.lower() in _BUILTINS:
                raise _Error(f'the duplicate "{name.lower().decode("latin-1")}" variable', plain=True)
            names.append(name.lower())
            out += b"(?P<" + name + b">"
            i = m.end()
            continue
        out.append(c)
        i += 1
    return bytes(out), names


@attrs.frozen
class _Rewrite:
    """One rule: ``kind`` is "default", "prefix", "regex" or "domain"."""

    kind: str
    source: bytes  # FROM as written
    target: bytes  # TO as written
    pattern: _Template = ()
    compiled: regex.Pattern[bytes] | None = attrs.field(default=None, eq=False)
    replacement: _Template = ()
    from_default: bool = False

    def describe(self) -> bytes:
        if self.kind == "default" or self.from_default:
            return b"default"
        return b"\0".join((self.kind.encode(), self.source, self.target))


class _State:
    """Per response: the request's variables and the captures nginx keeps."""

    def __init__(self, vars: RequestVars) -> None:
        port = str(vars.server_port).encode()
        self.vars = {b"host": vars.host, b"http_host": vars.http_host, b"scheme": vars.scheme,
                     b"server_port": port, b"proxy_host": vars.proxy_host}
        self.captures: list[bytes] = []

    def expand(self, template: _Template) -> bytes:
        out = []
        for part in template:
            if isinstance(part, bytes):
                out.append(part)
            elif isinstance(part, int):
                out.append(self.captures[part] if part < len(self.captures) else b"")
            else:
                out.append(self.vars.get(part[0], b""))
        return b"".join(out)

    def search(self, compiled: regex.Pattern[bytes], subject: bytes) -> bool:
        try:
            m = compiled.search(subject, timeout=REGEX_TIMEOUT)
        except TimeoutError:
            return False
        if m is None:
            return False
        self.captures = [m.group(0), *m.groups(b"")]
        for name, index in compiled.groupindex.items():
            self.vars[name.lower().encode()] = m.group(index) or b""
        return True


def _first_match(rules: Sequence[_Rewrite], value: bytes, prefix: int, state: _State) -> bytes | None:
    """``value`` with the part from ``prefix`` rewritten by the first rule that matches."""
    subject = value[prefix:]
    for rule in rules:
        if rule.kind == "default":
            continue
        if rule.compiled is not None:
            if state.search(rule.compiled, subject):
                return value[:prefix] + state.expand(rule.replacement)
            continue
        pattern = state.expand(rule.pattern)
        if rule.kind == "domain":
            dot = subject[:1] == b"."
            rest = subject[1:] if dot else subject
            if len(rest) == len(pattern) and rest.lower() == pattern.lower():
                return value[:prefix] + subject[:dot] + state.expand(rule.replacement)
        elif subject.startswith(pattern):
            return value[:prefix] + state.expand(rule.replacement) + subject[len(pattern) :]
    return None


def parse_cookie(value: bytes) -> list[tuple[bytes, bytes | None]]:
    """A Set-Cookie value as nginx cuts it: (name, value or None without '=')."""
    attrs_: list[tuple[bytes, bytes | None]] = []
    for piece in value.split(b";"):
        name, eq, val = piece.partition(b"=")
        attrs_.append((name.strip(b" "), val.strip(b" ") if eq else None))
    return attrs_


@attrs.frozen
class HeaderRules:
    """The header rules of a site: immutable, shared by every response."""

    redirects: tuple[_Rewrite, ...] | None = None  # None: no proxy_redirect at all
    redirect_off: bool = False
    cookie_domains: tuple[_Rewrite, ...] = ()
    cookie_domain_off: bool = False
    cookie_paths: tuple[_Rewrite, ...] = ()
    cookie_path_off: bool = False
    filter_headers: tuple[bytes, ...] = ()  # lower case, first appearance order
    #: add_header, proxy_hide_header, proxy_set_header (``prexy.headeredits``):
    #: applied at delivery, so not part of :attr:`digest`.
    edits: HeaderEdits = HeaderEdits()

    @classmethod
    def default(cls) -> HeaderRules:
        """What a site without directives gets: ``proxy_redirect default;``."""
        return cls()

    @classmethod
    def combine(cls, parts: Sequence[HeaderRules]) -> HeaderRules:
        """Several rules files in order, as if they were one file."""
        if len(parts) == 1:
            return parts[0]
        lists: dict[str, tuple[_Rewrite, ...] | None] = {"redirect": None, "domain": None, "path": None}
        offs = {"redirect": False, "domain": False, "path": False}
        for part in parts:
            for key, off, rules in (
                ("redirect", part.redirect_off, part.redirects),
                ("domain", part.cookie_domain_off, part.cookie_domains or None),
                ("path", part.cookie_path_off, part.cookie_paths or None),
            ):
                if (off or rules is not None) and (offs[key] or (off and lists[key] is not None)):
                    directive = "proxy_redirect" if key == "redirect" else f"proxy_cookie_{key}"
                    raise HeaderRulesConflict(
                        f'"{directive}" directive is duplicate: "{directive} off" in one rules '
                        f'file and another "{directive}" in another'
                    )
                offs[key] = offs[key] or off
                if rules is not None:
                    lists[key] = (lists[key] or ()) + rules
        headers = dict.fromkeys(h for part in parts for h in part.filter_headers)
        return cls(lists["redirect"], offs["redirect"], lists["domain"] or (), offs["domain"],
                   lists["path"] or (), offs["path"], tuple(headers), HeaderEdits.combine([p.edits for p in parts]))

    def bind(self, upstream_prefix: bytes) -> HeaderRules:
        """``default`` resolved for one site: FROM ``upstream_prefix`` (e.g.
        ``b"https://www.origin.com/"``) TO ``/``."""
        if self.redirect_off:
            return self
        bound = _Rewrite("prefix", upstream_prefix, b"/", (upstream_prefix,), None, (b"/",), True)
        rules = self.redirects if self.redirects is not None else (_Rewrite("default", b"", b""),)
        return attrs.evolve(self, redirects=tuple(bound if r.kind == "default" else r for r in rules))

    @property
    def _canonical(self) -> bytes:
        redirects = self.redirects if self.redirects is not None else (_Rewrite("default", b"", b""),)
        sections = [
            b"off" if self.redirect_off else b"\1".join(r.describe() for r in redirects),
            b"off" if self.cookie_domain_off else b"\1".join(r.describe() for r in self.cookie_domains),
            b"off" if self.cookie_path_off else b"\1".join(r.describe() for r in self.cookie_paths),
            b",".join(sorted(self.filter_headers)),
        ]
        return b"\2".join(sections)

    @property
    def digest(self) -> str:
        """Short stable hex hash of what decides the output ("" when it does
        what :meth:`default` does; a bound ``default`` counts as ``default``,
        its prefix being the site's)."""
        canonical = self._canonical
        if canonical == _DEFAULT_CANONICAL:
            return ""
        return hashlib.sha256(canonical).hexdigest()[:16]

    @property
    def active(self) -> bool:
        """Whether :meth:`apply` can change anything (an unbound default cannot)."""
        redirects = () if self.redirect_off else (self.redirects or ())
        return bool(
            any(r.kind != "default" for r in redirects)
            or self.cookie_domains or self.cookie_paths or self.filter_headers
        )

    def apply(
        self,
        headers: list[tuple[bytes, bytes]],
        vars: RequestVars,
        substitute: Callable[[bytes], bytes] | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """Response header pairs (original-case names, order kept, repeats kept) rewritten."""
        state = _State(vars)
        redirects = () if self.redirect_off else (self.redirects or ())
        cookies = bool(self.cookie_domains or self.cookie_paths)
        filtered = frozenset(self.filter_headers) if substitute is not None else frozenset()
        out: list[tuple[bytes, bytes]] = []
        location: int | None = None
        for name, value in headers:
            lname = name.lower()
            new: bytes | None = None
            if lname in (b"location", b"content-location") and redirects:
                new = _first_match(redirects, value, 0, state)
                if new is not None and lname == b"location":
                    location = len(out)
            elif lname == b"refresh" and redirects:
                at = value.lower().find(b"url=")
                if at >= 0:
                    new = _first_match(redirects, value, at + 4, state)
            elif lname == b"set-cookie" and cookies:
                new = self._cookie(value, state)
            if new is not None:
                value = new
            if lname in filtered:
                assert substitute is not None
                value = substitute(value)
            out.append((name, value))
        if location is not None and out[location][1][:1] == b"/":
            name, value = out[location]
            https = vars.scheme == b"https"
            port = b"" if vars.server_port == (443 if https else 80) else b":%d" % vars.server_port
            out[location] = (name, b"%s://%s%s%s" % (b"https" if https else b"http", vars.host, port, value))
        return out

    def _cookie(self, value: bytes, state: _State) -> bytes | None:
        pairs = parse_cookie(value)
        if pairs[0][1] is None:
            return None
        changed = False
        for i in range(1, len(pairs)):
            key, val = pairs[i]
            if val is None:
                continue
            lkey = key.lower()
            rules = self.cookie_domains if lkey == b"domain" else self.cookie_paths if lkey == b"path" else ()
            new = _first_match(rules, val, 0, state) if rules else None
            if new is not None:
                pairs[i] = (key, new)
                changed = True
        if not changed:
            return None
        return b"; ".join(k if v is None else k + b"=" + v for k, v in pairs)


_DEFAULT_CANONICAL = HeaderRules()._canonical


class HeaderRulesBuilder:
    """Collects the header directives of one rules file, in order."""

    def __init__(self) -> None:
        self._lists: dict[bytes, list[_Rewrite]] = {}
        self._off: set[bytes] = set()
        self._headers: dict[bytes, None] = {}
        self._captures: set[bytes] = set()
        self._uses: list[tuple[Token, bytes, Callable[[Token, str], Exception]]] = []
        self._edits = HeaderEditsBuilder()

    def directive(self, name: Token, args: Sequence[Token], fail: Callable[[Any, str], Exception]) -> bool:
        """Take one directive; False if it is not one of ours.  A bad one
        raises ``fail(token, reason)``, in nginx's words where nginx has them."""
        key = name.value
        if is_edit(key):
            return self._edits.directive(name, args, fail)
        if key not in _OURS:
            return False
        directive = key.decode()
        if key == b"replace_filter_headers":
            self._filter_headers(name, args, fail)
            return True
        if len(args) not in (1, 2):
            raise fail(name, f'invalid number of arguments in "{directive}" directive')
        if key in self._off:
            raise fail(name, f'"{directive}" directive is duplicate')
        rules = self._lists.get(key)
        if len(args) == 1:
            value = args[0].value
            if value == b"off":
                if rules is not None:
                    raise fail(name, f'"{directive}" directive is duplicate')
                self._off.add(key)
                return True
            if value != b"default" or key != b"proxy_redirect":
                raise fail(args[0], f'invalid parameter "{value.decode("latin-1")}"')
            self._lists.setdefault(key, []).append(_Rewrite("default", b"", b""))
            return True
        self._lists.setdefault(key, []).append(self._rule(key, args[0], args[1], fail))
        return True

    def _rule(self, key: bytes, src: Token, dst: Token, fail: Callable[[Any, str], Exception]) -> _Rewrite:
        source, target = src.value, dst.value
        compiled = None
        pattern: _Template = ()
        if source[:1] == b"~":
            caseless = key == b"proxy_cookie_domain" or source[1:2] == b"*"
            text = source[2:] if key != b"proxy_cookie_domain" and source[1:2] == b"*" else source[1:]
            try:
                translated, names = _translate(text)
                compiled = regex.compile(translated, regex.IGNORECASE if caseless else 0)
            except _Error as exc:
                raise fail(src, str(exc) if exc.plain else f'bad regex "{text.decode("latin-1")}": {exc}') from None
            except regex.error as exc:
                at = f" at offset {exc.pos}" if translated == text and exc.pos is not None else ""
                raise fail(src, f'bad regex "{text.decode("latin-1")}": {exc.msg}{at}') from None
            self._captures.update(names)
            kind = "regex"
        else:
            kind = "domain" if key == b"proxy_cookie_domain" else "prefix"
            text = source[1:] if kind == "domain" and source[:1] == b"." else source
            pattern = self._value(src, text, fail)
            if kind == "domain" and target[:1] == b".":
                target = target[1:]
        replacement = self._value(dst, target, fail)
        return _Rewrite(kind, source, target, pattern, compiled, replacement)

    def _value(self, tok: Token, text: bytes, fail: Callable[[Any, str], Exception]) -> _Template:
        names: list[bytes] = []
        try:
            template = _compile_value(text, names)
        except _Error as exc:
            raise fail(tok, str(exc)) from None
        self._uses += [(tok, n, fail) for n in names]
        return template

    def _filter_headers(self, name: Token, args: Sequence[Token], fail: Callable[[Any, str], Exception]) -> None:
        if not args:
            raise fail(name, 'invalid number of arguments in "replace_filter_headers" directive')
        for tok in args:
            header = tok.value.lower()
            text = tok.value.decode("latin-1")
            if header == b"off":
                raise fail(tok, 'invalid parameter "off": replace_filter_headers lists header names (none by default)')
            if not header or any(c not in _TCHAR for c in header):
                raise fail(tok, f'invalid header name "{text}"')
            if header in FRAMING_HEADERS:
                raise fail(tok, f'"{text}" cannot be rewritten: it frames the message or belongs to one connection')
            self._headers[header] = None

    def build(self) -> HeaderRules:
        """The rules taken so far; raises ``fail`` for an unknown variable."""
        for tok, var, fail in self._uses:
            if var not in _BUILTINS and var not in self._captures:
                raise fail(tok, f'unknown "{var.decode("latin-1")}" variable')
        lists, off = self._lists, self._off
        redirects = lists.get(b"proxy_redirect")
        return HeaderRules(
            None if redirects is None else tuple(redirects), b"proxy_redirect" in off,
            tuple(lists.get(b"proxy_cookie_domain", ())), b"proxy_cookie_domain" in off,
            tuple(lists.get(b"proxy_cookie_path", ())), b"proxy_cookie_path" in off,
            tuple(self._headers), self._edits.build(),
        )
