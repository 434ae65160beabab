"""A benchmark corpus shaped like a cloning service's production traffic.

Pages are real files from Debian packages (installed by ``bench/run.py``
and ``bench/bench_transducer.py`` when missing): Python's HTML
documentation (``python3.11-doc``), jQuery (``libjs-jquery``) and the
Bootstrap 4 stylesheet (``libjs-bootstrap4``).  Into each page goes the
furniture of a real site: its relative links become absolute links on the
site's own host names (most on ``www``, the rest spread over its other
hosts the way a big site's CDN, image, API and country hosts are), some
protocol-relative (``//cdn...``), an analytics snippet (``UA-`` and
gtag ``G-`` ids), a JSON config with escaped URLs (``https:\\/\\/api...``)
and a maps API key, and bare host names in the text.

Rule sets of 10, 100 and 1000 rules rewrite that site into its clone the
way a cloning service's rules do: about 90% are literal swaps of the
site's host names in every form a page carries them (``https?://host``
with the scheme captured, ``//host``, ``https:\\/\\/host``, bare ``host``
case-insensitively), in front of them link-specific URL swaps, then the
ids (``(UA-)\\d+-\\d+`` with ``${1}``, ``G-[A-Z0-9]{10}``), the API key
pattern, a banner injected once at ``</head>``, a title rewrite once with
``$1$2$3``, ``$&`` and ``$$`` in templates, ``\\b``, ``i``, and once and
``g`` mixed.  The same host list serves every size, so a larger set
matches more of the same pages: on the 1 MB page the 1000-rule set makes
hundreds of matches.

Everything is deterministic (fixed seeds); :func:`corpus_digest` names the
exact inputs a run used.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PACKAGES",
    "PAGES",
    "RULE_COUNTS",
    "Page",
    "corpus_digest",
    "ensure_sources",
    "load_page",
    "rules_text",
    "subs_filter_directives",
]

#: Debian packages the pages come from.
PACKAGES = ("python3.11-doc", "libjs-jquery", "libjs-bootstrap4")

#: Rule counts of the realistic sets.
RULE_COUNTS = (10, 100, 1000)

ORIGIN = "origin-shop.com"
CLONE = "clone-shop.nl"

_DOC = Path("/usr/share/doc/python3.11/html")


@dataclass(frozen=True)
class Page:
    """One corpus page: a name, the packaged file it comes from, its type."""

    name: str
    source: Path
    content_type: str


#: The corpus pages: about 20 KB and about 1 MB of HTML, a script, a stylesheet.
PAGES = {
    "html-20k": Page("html-20k", _DOC / "library" / "copy.html", "text/html"),
    "html-1m": Page("html-1m", _DOC / "library" / "os.html", "text/html"),
    "html-1.7m": Page("html-1.7m", _DOC / "genindex-all.html", "text/html"),
    "jquery": Page("jquery", Path("/usr/share/javascript/jquery/jquery.js"), "application/javascript"),
    "bootstrap-css": Page(
        "bootstrap-css", Path("/usr/share/nodejs/bootstrap/dist/css/bootstrap.css"), "text/css"
    ),
}


def ensure_sources(install: bool = True) -> None:
    """Install the Debian packages the pages come from, when a page is missing."""
    if all(p.source.exists() for p in PAGES.values()):
        return
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        missing = [str(p.source) for p in PAGES.values() if not p.source.exists()]
        raise SystemExit(
            f"missing {', '.join(missing)}: install the Debian packages {' '.join(PACKAGES)}"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *PACKAGES], check=True, env=env, timeout=1200
    )


# -- the site -----------------------------------------------------------------

_NAMED = (
    "www m shop static cdn img images media assets api blog help support account login "
    "checkout cart search news forum community docs dev careers press investors partners "
    "stores deals outlet gift wishlist reviews video live events mail newsletter status"
).split()
_COUNTRIES = "de fr es it nl be at ch pl se dk no fi pt ie cz hu ro gr uk".split()


def _hosts() -> list[str]:
    """The site's host names, most used first (225: enough for 1000 rules)."""
    hosts = [f"{name}.{ORIGIN}" for name in _NAMED]
    hosts += [f"img{k}.{ORIGIN}" for k in range(1, 41)]
    hosts += [f"cdn{k}.{ORIGIN}" for k in range(1, 41)]
    hosts += [f"www.origin-shop.{tld}" for tld in _COUNTRIES]
    hosts += [f"{c}.{ORIGIN}" for c in _COUNTRIES]
    hosts += [f"static{k}.{ORIGIN}" for k in range(1, 51)]
    return hosts[:225]


HOSTS = _hosts()


def _clone_of(host: str) -> str:
    return host.replace("origin-shop.com", CLONE).replace("origin-shop.", "clone-shop.")


def _link_paths() -> list[str]:
    rng = random.Random(7)
    words = "sale summer winter shoes bags coats kids home garden gifts men women".split()
    return [f"/{rng.choice(words)}/{rng.choice(words)}-{k}" for k in range(60)]


LINK_PATHS = _link_paths()
UA_ID = "UA-31415926-2"
GTAG_ID = "G-7QK2M9XB4L"
API_KEY = "AIzaSyD4x8Qv1Zp7Lm3Nk9Rt5Wb2Yc6Hf0Ju8Eg"


# -- furniture ------------------------------------------------------------------


def _zipf_host(rng: random.Random) -> str:
    # Weight 1/(k+1): ``www`` takes about a sixth of the links.
    return rng.choices(HOSTS, weights=_WEIGHTS)[0]


_WEIGHTS = [1.0 / (k + 1) for k in range(len(HOSTS))]


def _absolute(rng: random.Random, path: str) -> str:
    host = _zipf_host(rng)
    roll = rng.random()
    if roll < 0.03:
        return f"https://www.{ORIGIN}{rng.choice(LINK_PATHS)}"
    if roll < 0.25:
        return f"//{host}/{path}"
    if roll < 0.32:
        return f"http://{host}/{path}"
    return f"https://{host}/{path}"


def _head_furniture(rng: random.Random) -> str:
    config = ", ".join(
        f'"{name}": "https:\\/\\/{_zipf_host(rng)}\\/{name}\\/v2"'
        for name in ("api", "cdn", "images", "search", "cart")
    )
    return (
        f'<script async src="https://www.googletagmanager.com/gtag/js?id={GTAG_ID}"></script>\n'
        "<script>window.dataLayer=window.dataLayer||[];function gtag(){dataLayer.push(arguments);}"
        f"gtag('js',new Date());gtag('config','{GTAG_ID}');</script>\n"
        "<script>(function(i,s,o,g,r,a,m){i['GoogleAnalyticsObject']=r;})"
        f"(window,document,'script','//www.google-analytics.com/analytics.js','ga');"
        f"ga('create','{UA_ID}','auto');ga('send','pageview');</script>\n"
        f'<script type="application/json" id="site-config">{{{config}, "mapsKey": "{API_KEY}", '
        f'"home": "https:\\/\\/www.{ORIGIN}\\/"}}</script>\n'
        f'<link rel="preconnect" href="//cdn.{ORIGIN}">\n'
        f'<meta property="og:url" content="https://www.{ORIGIN}/">\n'
        '<meta name="price" content="data-price=&quot;129&quot;">\n'
    )


def _body_furniture(rng: random.Random) -> str:
    host = _zipf_host(rng)
    return (
        f'<div class="promo">Shop at {host.upper() if rng.random() < 0.3 else host} '
        f'<a href="https://www.{ORIGIN}{rng.choice(LINK_PATHS)}">today</a> '
        f'<img src="//{_zipf_host(rng)}/img/p{rng.randrange(999)}.jpg" data-price="{rng.randrange(9, 999)}">'
        "</div>\n"
    )


_HREF = re.compile(rb'(href|src)="(?!https?:|//|#|mailto:|javascript:|data:)([^"]*)"')


def _html(raw: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    text = _HREF.sub(
        lambda m: m.group(1) + b'="' + _absolute(rng, m.group(2).decode("latin-1").lstrip("./")).encode()
        + b'"',
        raw,
    )
    text = text.replace(b"</head>", _head_furniture(rng).encode() + b"</head>", 1)
    pieces = text.split(b"</p>")
    out = [pieces[0]]
    for k, piece in enumerate(pieces[1:]):
        out.append(b"</p>")
        if k % 6 == 5:
            out.append(_body_furniture(rng).encode())
        out.append(piece)
    footer = (
        f'<footer>&copy; Copyright 2001-2023 www.{ORIGIN} | <a href="https://www.{ORIGIN}/legal">legal</a> '
        f'| WWW.{ORIGIN.upper()} | help.{ORIGIN}</footer>\n</body>'
    ).encode()
    return b"".join(out).replace(b"</body>", footer, 1)


def _script(raw: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    lines = raw.split(b"\n")
    out = [
        f"/*! served by https://static.{ORIGIN}/js/ -- config "
        f'{{"cdn":"https:\\/\\/cdn.{ORIGIN}\\/js","key":"{API_KEY}"}} */'.encode()
    ]
    for k, line in enumerate(lines):
        out.append(line)
        if k % 120 == 119:
            host = _zipf_host(rng)
            out.append(
                f'\t// assets: "//{host}/js/chunk-{k}.js" (https://{_zipf_host(rng)}/js/) {UA_ID}'.encode()
            )
    return b"\n".join(out)


def _css(raw: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    rules = raw.split(b"}\n")
    out = [f"/*! https://static.{ORIGIN}/css/site.css */\n".encode()]
    for k, rule in enumerate(rules):
        out.append(rule)
        out.append(b"}\n")
        if k % 40 == 39:
            out.append(
                f".bg-{k}{{background-image:url(//{_zipf_host(rng)}/img/bg-{k}.png)}}\n".encode()
            )
    return b"".join(out)


def load_page(name: str) -> bytes:
    """The corpus page ``name`` (see :data:`PAGES`), furniture included."""
    page = PAGES[name]
    raw = page.source.read_bytes()
    seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    if page.content_type == "text/html":
        return _html(raw, seed)
    if page.content_type == "text/css":
        return _css(raw, seed)
    return _script(raw, seed)


# -- the rules ------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One rule: pattern (sregex), replacement, flags, and whether it is a
    plain string (for subs_filter, which takes those without ``r``)."""

    pattern: str
    replacement: str
    flags: str
    literal: str | None = None


def _esc(text: str) -> str:
    return re.sub(r"([.\\/?*+()\[\]{}|^$])", r"\\\1", text)


def rules(count: int) -> list[Rule]:
    """The realistic set of ``count`` rules (10, 100 or 1000)."""
    special: list[Rule] = [
        Rule(r"(UA-)\d+-\d+", "${1}99999-9", "g"),
        Rule("</head>", '<script src="/clone-banner.js"></script></head>', "", "</head>"),
    ]
    if count >= 100:
        special += [
            Rule(r"G-[A-Z0-9]{10}", "G-CL0NE00000", "g"),
            Rule(r"AIza[0-9A-Za-z_-]{35}", "AIzaCLONEKEY", "g"),
            Rule(r"(<title>)([^<]*)(</title>)", "$1$2 | Clone Shop$3", ""),
            Rule(r"Copyright \d{4}-\d{4}", "$& Clone Shop BV", "g"),
            Rule(r'data-price="(\d+)"', 'data-price="$$$1"', "g"),
            Rule(r"\bhelp\." + _esc(ORIGIN) + r"\b", "help." + CLONE, "gi"),
        ]
    links: list[Rule] = []
    link_count = max(0, count // 20) if count >= 100 else 0
    for path in LINK_PATHS[:link_count]:
        new = path.replace("sale", "aanbieding").replace("-", "_")
        url = f"https://www.{ORIGIN}{path}"
        links.append(Rule(_esc(url), f"https://www.{CLONE}{new}", "g", url))
    host_rules: list[Rule] = []
    hosts = max(2, (count - len(special) - len(links)) // 4)
    for host in HOSTS[:hosts]:
        new = _clone_of(host)
        json_form = f"https:\\/\\/{host}"
        host_rules += [
            Rule(_esc(json_form), f"https:\\/\\/{new}", "g", json_form),
            Rule(r"(https?://)" + _esc(host), "${1}" + new, "g"),
            Rule(_esc("//" + host), "//" + new, "g", "//" + host),
            Rule(_esc(host), new, "gi", host),
        ]
    out = links + host_rules + special
    if len(out) > count:
        out = out[: count - len(special)] + special
    while len(out) < count:  # fill with more link swaps of the generated kind
        k = len(out)
        url = f"https://www.{ORIGIN}/p/{k}"
        out.insert(0, Rule(_esc(url), f"https://www.{CLONE}/p/{k}", "g", url))
    return out


def _nginx_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def rules_text(count: int) -> str:
    """The realistic set as a Prexy / replace_filter rules file."""
    lines = [f"# realistic clone rules ({count}), generated by bench/realistic.py",
             "replace_filter_types text/html text/css application/javascript;"]
    for r in rules(count):
        flags = f" {r.flags}" if r.flags else ""
        lines.append(f"replace_filter {_nginx_quote(r.pattern)} {_nginx_quote(r.replacement)}{flags};")
    return "\n".join(lines) + "\n"


def subs_filter_directives(count: int) -> str:
    """The same set for nginx subs_filter: literal rules as strings, the rest
    as regexes (``r``).  subs_filter has no once-rules with several rules in
    one pass nor ``$&``/``$$``; its output is compared, not required equal."""
    lines = ["subs_filter_types text/html text/css application/javascript;"]
    for r in rules(count):
        # subs_filter: g (all, its default), o (once), i, r (regex).
        flags = ("g" if "g" in r.flags else "o") + ("i" if "i" in r.flags else "")
        if r.literal is not None:
            lines.append(f"subs_filter {_nginx_quote(r.literal)} {_nginx_quote(r.replacement)} {flags};")
        else:
            # nginx reads one digit after $ as a capture ($199 is $1 then 99),
            # has no ${1}, and no escape for a literal $: subs_filter gets none.
            # It has no $0 either: the whole match becomes group 1.
            pattern, repl = r.pattern, r.replacement.replace("${1}", "$1").replace("$$", "")
            if "$&" in repl:
                pattern = f"({pattern})"
                repl = re.sub(r"\$(\d)", lambda m: f"${int(m.group(1)) + 1}", repl).replace("$&", "$1")
            lines.append(f"subs_filter {_nginx_quote(pattern)} {_nginx_quote(repl)} {flags}r;")
    return "\n".join(lines) + "\n"


def corpus_digest() -> str:
    """A short hash of every page and rule set of the corpus."""
    h = hashlib.sha256()
    for name in PAGES:
        h.update(load_page(name))
    for count in RULE_COUNTS:
        h.update(rules_text(count).encode())
    return h.hexdigest()[:12]
