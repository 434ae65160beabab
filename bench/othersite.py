"""A second realistic corpus, on pages and rules the transducer was not tuned on.

:mod:`realistic` is the corpus the substitution code was measured and tuned
against.  This one has the same shapes (a clone's host swaps in every form
a page carries a host, link swaps, analytics and API ids, once rules at
``</head>`` and ``<title>``, ``$&``, ``$$``, ``\\b``, ``i``) on another site
made from a seed, plus the once rules of a clone that rewrites its social
tags (``og:url``, ``canonical``) case-insensitively, which some pages do
not carry at all.  Its pages are other real HTML files that Debian
packages install (read from their system paths, never copied into the
repository): Node.js's API documentation (``nodejs``), the Nettle manual
(``nettle-dev``), Valgrind's manual (``valgrind``) and Underscore's page
(``libjs-underscore``).  :func:`corpus_digest` names the exact inputs.

Everything is deterministic for one seed (:data:`SEED`); another seed gives
another site and rule order with the same shapes.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from dataclasses import dataclass
from pathlib import Path

from realistic import RULE_COUNTS, Rule, _esc, _nginx_quote

__all__ = ["PACKAGES", "PAGES", "RULE_COUNTS", "SEED", "Site", "available_pages", "corpus_digest", "load_page", "rules_text"]

#: Debian packages the pages come from.
PACKAGES = ("nodejs", "nettle-dev", "valgrind", "libjs-underscore")

#: The seed of the default site (realistic.py's site is fixed; this one is drawn).
SEED = 20261204

#: Page name -> its file: about 30 KB, 170 KB, 550 KB and 660 KB of HTML.
PAGES = {
    "node-punycode": Path("/usr/share/doc/nodejs/api/punycode.html"),
    "valgrind-core": Path("/usr/share/doc/valgrind/html/manual-core.html"),
    "underscore": Path("/usr/share/doc/libjs-underscore/index.html"),
    "nettle": Path("/usr/share/doc/nettle-dev/nettle.html"),
    "node-fs": Path("/usr/share/doc/nodejs/api/fs.html"),
}


def available_pages() -> list[str]:
    """The pages whose files are installed here."""
    return [name for name, path in PAGES.items() if path.exists()]


_SUBDOMAINS = (
    "www m app web static cdn img media assets api auth blog help kb support my account "
    "login pay checkout basket search news community learn docs developer jobs press ir "
    "partners stores offers outlet gifts lists ratings tv live events mail updates status"
).split()
_TLDS = "de fr es it nl be at ch pl se dk no fi pt ie cz hu ro gr co.uk com.au ca jp".split()


@dataclass(frozen=True)
class Site:
    """One made-up origin site and its clone, drawn from a seed."""

    origin: str
    clone: str
    hosts: tuple[str, ...]
    link_paths: tuple[str, ...]
    ua_id: str
    gtag_id: str
    api_key: str
    seed: int

    @classmethod
    def make(cls, seed: int = SEED) -> Site:
        rng = random.Random(seed)
        name = "".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(3))
        origin, clone = f"{name}-store.com", f"{name}-copy.net"
        named = list(_SUBDOMAINS)
        rng.shuffle(named)
        hosts = [f"{h}.{origin}" for h in named]
        prefix = rng.choice(["i", "s", "c", "edge"])
        hosts += [f"{prefix}{k}.{origin}" for k in range(1, 61)]
        hosts += [f"www.{name}-store.{tld}" for tld in _TLDS]
        hosts += [f"{tld.split('.')[0]}.{origin}" for tld in _TLDS]
        hosts += [f"assets{k}.{origin}" for k in range(1, 71)]
        words = "new used blue red home audio phones laptops tools toys books games deals".split()
        paths = tuple(f"/{rng.choice(words)}/{rng.choice(words)}-{rng.randrange(10**5)}" for _ in range(60))
        alnum = string.ascii_uppercase + string.digits
        return cls(
            origin=origin,
            clone=clone,
            hosts=tuple(hosts[:225]),
            link_paths=paths,
            ua_id=f"UA-{rng.randrange(10**7, 10**8)}-{rng.randrange(1, 9)}",
            gtag_id="G-" + "".join(rng.choice(alnum) for _ in range(10)),
            api_key="AIza" + "".join(rng.choice(string.ascii_letters + string.digits + "_-") for _ in range(35)),
            seed=seed,
        )

    def clone_of(self, host: str) -> str:
        stem = self.origin.split(".")[0]
        return host.replace(self.origin, self.clone).replace(f"{stem}.", self.clone.split(".")[0] + ".")


def _pick_host(site: Site, rng: random.Random) -> str:
    return rng.choices(site.hosts, weights=[1.0 / (k + 1) for k in range(len(site.hosts))])[0]


def _absolute(site: Site, rng: random.Random, path: str) -> str:
    host = _pick_host(site, rng)
    roll = rng.random()
    if roll < 0.04:
        return f"https://www.{site.origin}{rng.choice(site.link_paths)}"
    if roll < 0.2:
        return f"//{host}/{path}"
    if roll < 0.3:
        return f"http://{host}/{path}"
    return f"https://{host}/{path}"


def _head(site: Site, rng: random.Random, social: bool) -> str:
    config = ", ".join(
        f'"{key}": "https:\\/\\/{_pick_host(site, rng)}\\/{key}"' for key in ("api", "media", "auth", "search")
    )
    tags = (
        f'<meta property="og:url" content="https://www.{site.origin}/{rng.choice(site.link_paths)[1:]}">\n'
        f'<link rel="canonical" href="https://www.{site.origin}/">\n'
        if social
        else ""
    )
    return (
        f'<script async src="https://www.googletagmanager.com/gtag/js?id={site.gtag_id}"></script>\n'
        f"<script>gtag('config','{site.gtag_id}');ga('create','{site.ua_id}','auto');</script>\n"
        f'<script type="application/json" id="cfg">{{{config}, "key": "{site.api_key}"}}</script>\n'
        f'<link rel="dns-prefetch" href="//{_pick_host(site, rng)}">\n' + tags
    )


def _promo(site: Site, rng: random.Random) -> str:
    host = _pick_host(site, rng)
    return (
        f'<aside>Visit {host.upper() if rng.random() < 0.25 else host} '
        f'<a href="https://www.{site.origin}{rng.choice(site.link_paths)}">now</a> '
        f'<img src="https://{_pick_host(site, rng)}/p/{rng.randrange(9999)}.webp" data-price="{rng.randrange(5, 500)}">'
        "</aside>\n"
    )


_HREF = re.compile(rb'(href|src)="(?!https?:|//|#|mailto:|javascript:|data:)([^"]*)"')


def load_page(name: str, site: Site | None = None) -> bytes:
    """Page ``name`` with ``site``'s furniture (default: the SEED site)."""
    site = site or Site.make()
    raw = PAGES[name].read_bytes()
    seed = int(hashlib.sha256(f"{site.seed}:{name}".encode()).hexdigest()[:8], 16)
    rng = random.Random(seed)
    social = rng.random() < 0.5
    text = _HREF.sub(
        lambda m: m.group(1) + b'="' + _absolute(site, rng, m.group(2).decode("latin-1").lstrip("./")).encode() + b'"',
        raw,
    )
    text = text.replace(b"</head>", _head(site, rng, social).encode() + b"</head>", 1)
    pieces = text.split(b"</p>")
    out = [pieces[0]]
    every = rng.randrange(4, 9)
    for k, piece in enumerate(pieces[1:]):
        out.append(b"</p>")
        if k % every == every - 1:
            out.append(_promo(site, rng).encode())
        out.append(piece)
    footer = (
        f"<footer>Copyright 2009-2026 {site.origin} | www.{site.origin.upper()} | help.{site.origin}</footer>\n</body>"
    ).encode()
    return b"".join(out).replace(b"</body>", footer, 1)


def rules(count: int, site: Site | None = None) -> list[Rule]:
    """The clone set of ``count`` rules for ``site`` (default: the SEED site)."""
    site = site or Site.make()
    rng = random.Random(site.seed + count)
    origin, clone = site.origin, site.clone
    special = [
        Rule(r"(UA-)\d+-\d+", "${1}11111-1", "g"),
        Rule("</head>", '<script src="/copy.js"></script></head>', "", "</head>"),
        Rule(r'(<meta property="og:url" content=")([^"]*)"', f'$1https://www.{clone}/"', "i"),
    ]
    if count >= 100:
        special += [
            Rule(r'(<link rel="canonical" href=")([^"]*)"', f'$1https://www.{clone}/"', "i"),
            Rule(r"G-[A-Z0-9]{10}", "G-COPY000000", "g"),
            Rule(r"AIza[0-9A-Za-z_-]{35}", "AIzaCOPYKEY", "g"),
            Rule(r"(<title>)([^<]*)(</title>)", "$1$2 - Copy$3", ""),
            Rule(r"Copyright \d{4}-\d{4}", "$& Copy Ltd", "g"),
            Rule(r'data-price="(\d+)"', 'data-price="$$$1"', "g"),
            Rule(r"\bhelp\." + _esc(origin) + r"\b", "help." + clone, "gi"),
        ]
    links = []
    for path in site.link_paths[: count // 20 if count >= 100 else 0]:
        url = f"https://www.{origin}{path}"
        links.append(Rule(_esc(url), f"https://www.{clone}{path.replace('-', '_')}", "g", url))
    host_rules = []
    for host in site.hosts[: max(2, (count - len(special) - len(links)) // 4)]:
        new = site.clone_of(host)
        json_form = f"https:\\/\\/{host}"
        forms = [
            Rule(_esc(json_form), f"https:\\/\\/{new}", "g", json_form),
            Rule(r"(https?://)" + _esc(host), "${1}" + new, "g"),
            Rule(_esc("//" + host), "//" + new, "g", "//" + host),
            Rule(_esc(host), new, "gi", host),
        ]
        # The bare host must come last (it is inside the others); the other
        # three in an order of the seed's choosing.
        head = forms[:3]
        rng.shuffle(head)
        host_rules += [*head, forms[3]]
    out = links + host_rules + special
    if len(out) > count:
        out = out[: count - len(special)] + special
    while len(out) < count:
        k = len(out)
        url = f"https://www.{origin}/item/{k}"
        out.insert(0, Rule(_esc(url), f"https://www.{clone}/item/{k}", "g", url))
    return out


def rules_text(count: int, site: Site | None = None) -> str:
    """The set as a Prexy / replace_filter rules file."""
    lines = [f"# untuned clone rules ({count}), generated by bench/othersite.py",
             "replace_filter_types text/html;"]
    for r in rules(count, site):
        flags = f" {r.flags}" if r.flags else ""
        lines.append(f"replace_filter {_nginx_quote(r.pattern)} {_nginx_quote(r.replacement)}{flags};")
    return "\n".join(lines) + "\n"


def corpus_digest(site: Site | None = None) -> str:
    """A short hash of every installed page and rule set of the corpus."""
    h = hashlib.sha256()
    for name in available_pages():
        h.update(name.encode())
        h.update(load_page(name, site))
    for count in RULE_COUNTS:
        h.update(rules_text(count, site).encode())
    return h.hexdigest()[:12]
