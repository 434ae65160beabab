"""Deterministic benchmark inputs: origin pages, rule sets and URL maps.

Pages look like real HTML (head, scripts, navigation, paragraphs, links)
and carry the things sites rewrite: the site's domain and an analytics id.
Rule sets are the issue's mix: the domain, the analytics id, then generated
regexes such as ``word[0-9]+token`` that rarely match.  The same rules text
is valid for replace_filter (Prexy) and, translated, for subs_filter.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

DOMAIN = "www.example.com"
NEW_DOMAIN = "www.example.org"
ANALYTICS_ID = "UA-12345678-1"
NEW_ANALYTICS_ID = "UA-00000000-0"
SMALL_BODY = b"Hello world\n"  # 12 bytes

WORDS = (
    "about account archive article author banner browse button cache card category "
    "channel comment community content cookie daily data design detail digital "
    "discuss document download editor email event feature field footer forum gallery "
    "global guide header help history home image index issue item journal label "
    "latest layout library link local login market media member menu message module "
    "network news notice online option order page panel photo policy portal post "
    "press price print privacy product profile project public question quick radio "
    "record region report review search section select service share shop sidebar "
    "signup site social source sport store story style support system table team "
    "theme today token topic travel update upload user video view weather widget word "
    "world"
).split()


def _paragraph(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(40, 90))]
    words[0] = words[0].capitalize()
    for i in range(8, len(words), rng.randint(9, 14)):
        words[i] += ","
    text = " ".join(words)
    if rng.random() < 0.5:
        slug = "-".join(rng.choice(WORDS) for _ in range(3))
        text += f' See <a href="https://{DOMAIN}/{slug}/">{slug.replace("-", " ")}</a>.'
    return f"<p>{text}.</p>\n"


def html_page(size: int, seed: int = 1) -> bytes:
    """An HTML page of exactly ``size`` bytes with the domain and the analytics id.

    A handful of ``word<digits>token`` strings appear too, so the generated
    rules match rarely but not never.
    """
    rng = random.Random(seed)
    head = (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>Example news and forum</title>\n<link rel=\"canonical\" href=\"https://{DOMAIN}/\">\n"
        f"<link rel=\"stylesheet\" href=\"https://{DOMAIN}/static/site.css\">\n"
        "<script async src=\"https://www.google-analytics.com/analytics.js\"></script>\n"
        "<script>window.ga=window.ga||function(){(ga.q=ga.q||[]).push(arguments)};"
        f"ga('create','{ANALYTICS_ID}','auto');ga('send','pageview');</script>\n"
        "</head>\n<body>\n<header><nav>\n"
        + "".join(
            f'<a href="https://{DOMAIN}/{w}/">{w.capitalize()}</a>\n'
            for w in rng.sample(WORDS, 8)
        )
        + "</nav></header>\n<main>\n"
    )
    tail = (
        f"</main>\n<footer><p>&copy; Example Ltd, <a href=\"https://{DOMAIN}/privacy/\">privacy"
        f"</a></p><!-- {ANALYTICS_ID} --></footer>\n</body>\n</html>\n"
    )
    parts = [head]
    length = len(head) + len(tail)
    article = 0
    while True:
        if rng.random() < 0.08:
            article += 1
            chunk = (
                f"<article id=\"a{article}\"><h2>{rng.choice(WORDS).capitalize()} "
                f"{rng.choice(WORDS)}</h2>\n"
            )
        elif rng.random() < 0.01:
            chunk = f"<p class=\"ref\">ref word{rng.randint(1, 99999)}token</p>\n"
        else:
            chunk = _paragraph(rng)
        if length + len(chunk) > size - 16:
            break
        parts.append(chunk)
        length += len(chunk)
    pad = size - length
    filler = "" if pad <= 0 else ("\n" if pad == 1 else "<!--" + " " * (pad - 8) + "-->\n")
    page = ("".join(parts) + filler + tail).encode()
    assert len(page) == size, (len(page), size)
    return page


@dataclass(frozen=True)
class Rule:
    """One global regex substitution."""

    pattern: str
    replacement: str


def rule_set(count: int) -> list[Rule]:
    """The issue's rule mix: domain, analytics id, then rarely matching regexes."""
    rules = [Rule(DOMAIN.replace(".", r"\."), NEW_DOMAIN)]
    if count >= 2:
        rules.append(Rule(r"UA-\d+-\d+", NEW_ANALYTICS_ID))
    suffixes = ("token", "tok", "ref", "id", "key")
    words = ["word", *(w for w in WORDS if w != "word")]
    n = 0
    while len(rules) < count:
        block = n // len(words)
        word = words[n % len(words)]
        digit = str(block) if block else ""
        suffix = suffixes[block % len(suffixes)]
        rules.append(Rule(f"{word}{digit}[0-9]+{suffix}", f"{word.upper()}-{n}"))
        n += 1
    return rules[:count]


def _nginx_quote(text: str) -> str:
    """Quote for the nginx config tokenizer (same for both modules)."""
    return "'" + text.replace("\\\\", "\\\\\\\\").replace("'", "\\'") + "'"


def replace_filter_rules(rules: list[Rule]) -> str:
    """A Prexy/replace_filter rules file."""
    lines = ["# generated by bench/run.py", "replace_filter_types text/html;"]
    lines += [
        f"replace_filter {_nginx_quote(r.pattern)} {_nginx_quote(r.replacement)} g;"
        for r in rules
    ]
    return "\n".join(lines) + "\n"


def subs_filter_directives(rules: list[Rule]) -> str:
    """The same rules as nginx subs_filter directives (regex, global)."""
    lines = ["subs_filter_types text/html;"]
    lines += [
        f"subs_filter {_nginx_quote(r.pattern)} {_nginx_quote(r.replacement)} gr;"
        for r in rules
    ]
    return "\n".join(lines) + "\n"


def md5_chain(count: int, seed: str = "hello world") -> list[str]:
    """Iterated md5 hex digests of ``seed`` (the urlmap issue's generator)."""
    out: list[str] = []
    value = seed
    for _ in range(count):
        value = hashlib.md5(value.encode()).hexdigest()
        out.append(value)
    return out


def regex_map(count: int) -> tuple[str, list[str]]:
    """A map file body of ``count`` regex entries and the hashes used."""
    hashes = md5_chain(count)
    lines = [f"~^/hello/world/{h}\\b(\\?[^/]*)*/?$  /;" for h in hashes]
    return "\n".join(lines) + "\n", hashes


def write(path: Path, data: bytes | str) -> Path:
    """Write a file (creating parents) only if its content changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    if not path.exists() or path.read_bytes() != raw:
        path.write_bytes(raw)
    return path
