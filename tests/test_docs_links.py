"""Every relative link in docs/*.md leads somewhere: the file exists and,
when the link names an anchor, a heading of that file makes it (GitHub's
way of turning a heading into an anchor)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from twisted.trial.unittest import SynchronousTestCase

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """``text`` without fenced blocks and code spans, where a ``#`` line or
    a ``[x](y)`` is code, not a heading or a link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub makes of a heading: its text (code spans keep
    their content, links their label), lower case, punctuation but ``-``
    and ``_`` dropped, each space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor the headings of a markdown text make; a repeated one
    gets ``-1``, ``-2``... as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    without_fences = _FENCE.sub("", text)
    for heading in _HEADING.findall(without_fences):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(text: str) -> list[str]:
    """The link targets of a markdown text, outside code."""
    return _LINK.findall(prose(text))


def broken(page: Path) -> list[str]:
    """The relative links of ``page`` that lead nowhere, each with why."""
    problems = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # http:, https:, mailto:: not checked here
        path, _, fragment = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            problems.append(f"{page.name}: {target}: no such file")
            continue
        if fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{page.name}: {target}: no heading makes #{fragment}")
    return problems


class SlugTests(SynchronousTestCase):
    def test_headings_become_github_anchors(self) -> None:
        cases = {
            "Site files (`include`)": "site-files-include",
            "Where the module's engine is not Perl": "where-the-modules-engine-is-not-perl",
            "add_header, proxy_hide_header, proxy_set_header": "add_header-proxy_hide_header-proxy_set_header",
            "Invalidation: PURGE and bans": "invalidation-purge-and-bans",
            "`[sites.NAME]`": "sitesname",
            "HTTP/2": "http2",
        }
        for heading, anchor in cases.items():
            self.assertEqual(slug(heading), anchor, heading)

    def test_repeated_headings_are_numbered_and_code_is_no_heading(self) -> None:
        text = "# A\n## Keys\n```toml\n# not = 1\n```\n## Keys\n"
        self.assertEqual(anchors(text), {"a", "keys", "keys-1"})

    def test_links_in_code_are_not_links(self) -> None:
        text = "[a](a.md) `[b](b.md)`\n```\n[c](c.md)\n```\n![img](i.png) [d](d.md#x \"t\")\n"
        self.assertEqual(links(text), ["a.md", "d.md#x"])

    def test_a_broken_link_and_a_missing_anchor_are_reported(self) -> None:
        directory = Path(self.mktemp())
        directory.mkdir()
        (directory / "b.md").write_text("# Title\n## Part two\n", encoding="utf-8")
        page = directory / "a.md"
        page.write_text("[ok](b.md#part-two) [self](#top) [no](c.md) [gone](b.md#part-three)\n# Top\n",
                        encoding="utf-8")
        self.assertEqual(broken(page), ["a.md: c.md: no such file",
                                        "a.md: b.md#part-three: no heading makes #part-three"])


class DocsLinkTests(SynchronousTestCase):
    def test_every_relative_link_in_docs_leads_somewhere(self) -> None:
        """docs/*.md and the README."""
        pages = sorted(DOCS.glob("*.md"))
        assert pages, f"no pages in {DOCS}"
        problems = [problem for page in [*pages, ROOT / "README.md"] for problem in broken(page)]
        assert not problems, "broken links in docs/ and README.md:\n" + "\n".join(problems)
