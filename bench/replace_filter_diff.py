"""Differential: Prexy's transducer against a real nginx + replace-filter build.

Usage::

    python bench/replace_filter_diff.py --module /path/ngx_http_replace_filter_module.so \\
        [--groups issue15,conformance,sregex,realistic] [--timing] [--json FILE]

The module (openresty's ``replace-filter-nginx-module`` on ``sregex``, built
as a dynamic module for the nginx that is installed) is not part of Prexy
and is not built here: give its path, or the script says so and exits 0.
It is not part of the default test run.

How the bytes are compared: nginx (its own prefix under ``bench/.work``,
one worker, a free port of 127.0.0.1) serves every case body as a static
file from one location per (rule set, chunk size), with ``sendfile off`` and
``output_buffers 2 N``, so the filter sees the body in buffers of exactly
``N`` bytes, the last one carrying the end of the body.  Prexy's
:class:`Transducer` is fed the same pieces, the last with the end of the
body (``finish(last)``).  Rule sets are written once as nginx directives and
read by both sides (nginx's tokenizer and Prexy's ``parse_rules``).  A rule
set nginx refuses at ``nginx -t`` is taken out and reported, with whether
Prexy refuses it too.

Groups: ``issue15`` (the examples in issue 15's text and neighbours),
``conformance`` (``shared/conformance/replace_filter_cases.json``),
``sregex`` (``sregex_cases.json``: each regex, or list of regexes, as
``g`` rules with a capturing template ``<$&>`` and a fixed one ``#``) and
``realistic`` (bench/realistic.py's pages and 10/100/1000-rule sets).
``--timing`` also times single requests for the 20 KB page through nginx
against Prexy's ``rewrite`` of the same body in process.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402
import realistic  # noqa: E402
import servers  # noqa: E402

from prexy.substitution.rules import RulesError, parse_rules  # noqa: E402
from prexy.substitution.transducer import Transducer  # noqa: E402

#: Chunk sizes per group; 0 means the whole body in one buffer.
CHUNKINGS = {
    "issue15": (1, 2, 3, 5, 7, 16, 1024, 0),
    "conformance": (1, 2, 3, 5, 7, 16, 0),
    "sregex": (1, 3, 0),
    "realistic": (1024, 4096, 32768, 0),
}

#: The 20 KB page is also cut small.  (Not the larger pages: the module keeps
#: every buffer's bookkeeping until the response ends, and 7-byte buffers of
#: the 1 MB page at 1000 rules grew one nginx worker past 9 GB.)
SMALL_CUTS = (7, 100)


@dataclass
class Case:
    """One rule set and one body, compared at several chunk sizes."""

    group: str
    name: str
    directives: bytes  # replace_filter* lines, as in a rules file
    body: bytes
    content_type: str = "text/html"
    chunkings: Sequence[int] = ()
    notes: list[str] = field(default_factory=list)


def nginx_quote(raw: bytes) -> bytes:
    """Quote ``raw`` so that nginx's tokenizer (and Prexy's) gives ``raw`` back."""
    out = raw.replace(b"\\", b"\\\\").replace(b"'", b"\\'")
    out = out.replace(b"\n", b"\\n").replace(b"\r", b"\\r").replace(b"\t", b"\\t")
    return b"'" + out + b"'"


def rule_line(pattern: bytes, replacement: bytes, flags: str = "") -> bytes:
    tail = b" " + flags.encode() if flags else b""
    return b"replace_filter " + nginx_quote(pattern) + b" " + nginx_quote(replacement) + tail + b";\n"


def _l1(text: str) -> bytes:
    return text.encode("latin-1")


# -- the groups -------------------------------------------------------------


def issue15_cases() -> list[Case]:
    """The examples of issue 15 and their neighbours."""
    c = []

    def add(name: str, rules: list[tuple[bytes, bytes, str]], body: bytes,
            extra: bytes = b"") -> None:
        directives = b"".join(rule_line(*r) for r in rules) + extra
        c.append(Case("issue15", name, directives, body))

    add("caret after later rule", [(b"^b", b"X", "g"), (b"\n", b"N\n", "g")], b"a\nb")
    add("caret after later rule, earlier once", [(b"^b", b"X", ""), (b"\n", b"N\n", "g")], b"a\nb")
    add("\\bc after replaced b", [(b"\\bc", b"X", "g"), (b"b", b"Y", "g")], b"bc")
    add("\\Bx after replaced b", [(b"\\Bx", b"X", "g"), (b"b", b"Y", "g")], b"bx")
    add("\\bc after replaced b (rule first)", [(b"b", b"Y", "g"), (b"\\bc", b"X", "g")], b"bc")
    add("\\Bx after replaced b (rule first)", [(b"b", b"Y", "g"), (b"\\Bx", b"X", "g")], b"bx")
    add("blank-line squeezer after leading space",
        [(b"^[ \t]+", b"", "g"), (b"\\s*\n\\s*\n", b"\n", "g")], b"\n\n ")
    add("caret after earlier rule not ending a line",
        [(b"\\s*\n\\s*\n", b"\n", "g"), (b"<!--.*?-->", b"", "g"), (b"^[ \t]+", b"", "g")],
        b"\n\n<!----> ")
    add("caret after earlier rule, body around",
        [(b"\\s*\n\\s*\n", b"\n", "g"), (b"<!--.*?-->", b"", "g"), (b"^[ \t]+", b"", "g")],
        b"x\n\n<!-- c --> y\n  z\n<!---->\tw\n")
    big = b"<t>" + b"a\n " * 3400 + b"</t>\n q"
    add("bail-out: caret rule and lazy element",
        [(b"^ +", b"", "g"), (b"<t>.*?</t>", b"T", "g")], big)
    add("bail-out: line comment bracketed",
        [(b"//[^\n]*", b"[$&]", "g")], b"x//" + b"a" * 10000 + b"\ny")
    add("bail-out: line comment, fixed replacement",
        [(b"//[^\n]*", b"C", "g")], b"x//" + b"a" * 10000 + b"\ny")
    add("bail-out: captures elsewhere",
        [(b"(q)z", b"$1", "g"), (b"//[^\n]*", b"C", "g")], b"qz x//" + b"a" * 10000 + b"\ny qz")
    add("bail-out: once and g mixed",
        [(b"q", b"Q", ""), (b"//[^\n]*", b"C", "g")], b"q x//" + b"a" * 10000 + b"\ny q")
    add("bail-out: under the limit", [(b"//[^\n]*", b"C", "g")], b"x//" + b"a" * 8000 + b"\ny")
    add("bail-out: small limit", [(b"<t>.*?</t>", b"T", "g")],
        b"a<t>" + b"b" * 40 + b"</t>c<t>d</t>", b"replace_filter_max_buffered_size 16;\n")
    add("quoted string with escapes", [(b'"(?:\\\\.|[^"\\\\])*"', b"S", "g")],
        b'x = "a\\"b" + "c\\\\" + "unterminated ' + b"z" * 3000)
    add("bounded repeat of lazy group", [(b"(?:<b>.*?</b>){2}", b"B", "g")],
        b"<b>1</b><b>2</b><b>3</b>")
    return c


def conformance_cases() -> list[Case]:
    from tests.substitution.shared import load_cases

    cases = load_cases("replace_filter_cases.json") or []
    out = []
    for case in cases:
        lines = [rule_line(_l1(r["pattern"]), _l1(r["replacement"]), r["flags"])
                 for r in case["rules"]]
        if case.get("types"):
            lines.append(b"replace_filter_types " + " ".join(case["types"]).encode() + b";\n")
        limit = case.get("max_buffered_size")
        if limit is not None:
            lines.append(b"replace_filter_max_buffered_size %d;\n" % limit)
        out.append(Case("conformance", f"{case['file']}:{case['name']}", b"".join(lines),
                        _l1("".join(case["chunks"])), case["content_type"]))
    return out


def sregex_cases() -> list[Case]:
    from tests.substitution.shared import load_cases

    cases = load_cases("sregex_cases.json") or []
    out = []
    for i, case in enumerate(cases):
        exp = case["expected"]
        if "error" in exp or "error_like" in exp:
            continue
        regexes = case["regex"] if case["multi"] else [case["regex"]]
        flags = case["flags"] if isinstance(case["flags"], list) else [case["flags"]] * len(regexes)
        body = _l1(case["input"])
        for template in (b"<$&>", b"#"):
            directives = b"".join(
                rule_line(_l1(rx), template, "g" + (f or "")) for rx, f in zip(regexes, flags, strict=True)
            )
            out.append(Case("sregex", f"{i}:{case['file']}:{case['name']}:{template.decode()}",
                            directives, body))
    return out


#: Left out of the realistic group unless ``--big``: through the module, the
#: 1000-rule set on the 1 MB page grew one nginx worker past 6.7 GB in five
#: minutes, unfinished (sregex keeps a capture vector for every rule in each
#: of its threads).
BIG = {("html-1m", 1000)}


def realistic_cases(big: bool = False) -> list[Case]:
    realistic.ensure_sources()
    out = []
    for n in realistic.RULE_COUNTS:
        directives = realistic.rules_text(n).encode()
        for page in ("html-20k", "html-1m", "jquery", "bootstrap-css"):
            if (page, n) in BIG and not big:
                continue
            case = Case("realistic", f"{page}/{n}", directives, realistic.load_page(page),
                        realistic.PAGES[page].content_type)
            if page == "html-20k":
                case.chunkings = SMALL_CUTS + CHUNKINGS["realistic"]
            out.append(case)
    return out


GROUPS = {
    "issue15": issue15_cases,
    "conformance": conformance_cases,
    "sregex": sregex_cases,
    "realistic": realistic_cases,
}


# -- the two sides ----------------------------------------------------------


def pieces_of(body: bytes, size: int) -> list[bytes]:
    if size == 0 or size >= len(body):
        return [body]
    return [body[i:i + size] for i in range(0, len(body), size)]


def prexy_output(directives: bytes, body: bytes, size: int) -> tuple[bytes | None, str]:
    """Prexy's bytes for ``body`` cut like nginx's buffers; None if the rules do not load."""
    try:
        ruleset = parse_rules(directives, "<diff>")
    except RulesError as exc:
        return None, str(exc)
    return run_prexy(ruleset, body, size), ""


def run_prexy(ruleset: object, body: bytes, size: int) -> bytes:
    pieces = pieces_of(body, size)
    t = Transducer(ruleset)  # type: ignore[arg-type]
    out = [t.feed(p) for p in pieces[:-1]]
    out.append(t.finish(pieces[-1]))
    return b"".join(out)


def _location(key: str, case: Case, size: int, root: Path) -> bytes:
    buf = size if size else max(len(case.body), 1)
    return (
        b"location /" + key.encode() + b"/ {\n"
        + b"    alias " + str(root).encode() + b"/;\n"
        + b"    types { }\n"
        + b"    default_type " + case.content_type.encode() + b";\n"
        + b"    sendfile off;\n"
        + b"    output_buffers 2 %d;\n" % buf
        + case.directives
        + b"}\n"
    )


def _start_nginx(name: str, server_body: bytes, module: Path) -> servers.Server:
    """servers.start_nginx, with the configuration written as bytes (latin-1):
    rule sets and bodies may hold any byte."""
    import shutil

    prefix = harness.WORK / name
    if prefix.exists():
        shutil.rmtree(prefix)
    (prefix / "tmp").mkdir(parents=True)
    port = harness.free_port()
    conf = servers.nginx_conf(prefix, port, server_body.decode("latin-1"), modules=(module,))
    conf_path = prefix / "nginx.conf"
    conf_path.write_bytes(conf.encode("latin-1"))
    child = harness.spawn(name, [
        "/usr/sbin/nginx", "-p", f"{prefix}/", "-c", str(conf_path), "-e", "stderr",
        "-g", "daemon off; master_process on;",
    ])
    harness.wait_port(child, port, timeout=120)
    return servers.Server(name, port, child)


class Nginx:
    """A private nginx serving every (case, chunking) from its own location."""

    def __init__(self, module: Path, cases: Sequence[Case], name: str = "replace-filter-diff",
                 extra: bytes = b""):
        self.module = module
        self.root = harness.WORK / (name + "-docroot")
        self.root.mkdir(parents=True, exist_ok=True)
        self.refused: dict[int, str] = {}
        blocks: dict[int, list[tuple[str, bytes]]] = {}
        for i, case in enumerate(cases):
            (self.root / f"b{i}").write_bytes(case.body)
            blocks[i] = [(f"c{i}n{size}", _location(f"c{i}n{size}", case, size, self.root))
                         for size in case.chunkings]
        self.name = name
        self.blocks = blocks
        self._drop_refused()
        body = b"".join(loc for i, locs in blocks.items() if i not in self.refused for _, loc in locs)
        body += extra
        self.server = _start_nginx(name, body, module)
        self.conn = http.client.HTTPConnection(harness.LOCAL, self.server.port, timeout=120)

    def _drop_refused(self) -> None:
        """Take out, one at a time, the rule sets ``nginx -t`` refuses."""
        import subprocess

        prefix = harness.WORK / (self.name + "-check")
        (prefix / "tmp").mkdir(parents=True, exist_ok=True)
        nginx = "/usr/sbin/nginx"
        while True:
            lines: list[bytes] = []
            owner: list[int] = []
            for i, locs in self.blocks.items():
                if i in self.refused:
                    continue
                for _, loc in locs:
                    part = loc.split(b"\n")
                    lines.extend(part)
                    owner.extend([i] * len(part))
            conf = servers.nginx_conf(prefix, harness.free_port(), "", modules=(self.module,))
            head, tail = conf.split("server_name _;\n", 1)
            head_b = (head + "server_name _;\n").encode("latin-1")
            offset = head_b.count(b"\n")
            path = prefix / "nginx.conf"
            path.write_bytes(head_b + b"\n".join(lines) + b"\n" + tail.encode("latin-1"))
            proc = subprocess.run([nginx, "-t", "-p", f"{prefix}/", "-c", str(path), "-e", "stderr"],
                                  capture_output=True, timeout=600)
            if proc.returncode == 0:
                return
            # (warnings such as a repeated MIME type come first; the error is
            # the [emerg] line)
            err = "\n".join(line for line in proc.stderr.decode("latin-1").splitlines()
                             if "[emerg]" in line) or proc.stderr.decode("latin-1")
            first = err.strip().splitlines()[0]
            who = self._culprit(err, lines, owner, offset)
            if who is None:
                raise RuntimeError(err)
            self.refused[who] = first[first.find("]") + 1:].strip()

    def _culprit(self, err: str, lines: list[bytes], owner: list[int], offset: int) -> int | None:
        """The case a failed ``nginx -t`` complains about.

        Regex errors are reported when the location is merged, at the end of
        the http block, so they are found by the regex text in the message.
        """
        import re

        m = re.search(r'marked by <-- HERE in "(.*) <-- HERE (.*)" in /', err, re.S)
        text = None
        if m:
            text = (m.group(1) + m.group(2)).encode("latin-1")
        else:
            m = re.search(r'failed to parse regex "(.*)"( and its siblings)? in /', err, re.S)
            if m:
                text = m.group(1).encode("latin-1")
        if text is not None:
            needle = b"replace_filter " + nginx_quote(text) + b" "
            for line, who in zip(lines, owner, strict=True):
                if line.startswith(needle):
                    return who
        m = re.search(r"nginx\.conf:(\d+)", err)
        if m:
            line = int(m.group(1)) - 1 - offset
            if 0 <= line < len(owner):
                return owner[line]
        return None

    def get(self, key: str, i: int) -> bytes:
        self.conn.request("GET", f"/{key}/b{i}")
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{key}: status {resp.status}")
        return data

    def stop(self) -> None:
        self.conn.close()
        self.server.stop()


@dataclass
class Difference:
    case: Case
    size: int
    nginx: bytes
    prexy: bytes | None
    note: str = ""

    def summary(self) -> str:
        def show(b: bytes | None) -> str:
            if b is None:
                return "(refused)"
            r = repr(b)
            return r if len(r) < 160 else f"{r[:70]}...{r[-70:]} ({len(b)} bytes)"

        return (f"[{self.case.group}] {self.case.name} @ {self.size or 'whole'}: "
                f"nginx {show(self.nginx)} prexy {show(self.prexy)} {self.note}")


def run_diff(module: Path, groups: Iterable[str], big: bool = False) -> dict[str, object]:
    cases: list[Case] = []
    for g in groups:
        made = realistic_cases(big) if g == "realistic" else GROUPS[g]()
        for case in made:
            case.chunkings = case.chunkings or CHUNKINGS[g]
            cases.append(case)
    harness.log(f"{len(cases)} cases, {sum(len(c.chunkings) for c in cases)} comparisons")
    ng = Nginx(module, cases)
    diffs: list[Difference] = []
    refused_both = refused_nginx_only = compared = 0
    try:
        for i, case in enumerate(cases):
            if i in ng.refused:
                prexy, why = prexy_output(case.directives, b"", 0)
                if prexy is None:
                    refused_both += 1
                else:
                    refused_nginx_only += 1
                    diffs.append(Difference(case, 0, b"", b"", f"nginx refuses: {ng.refused[i]}"))
                continue
            try:
                ruleset = parse_rules(case.directives, "<diff>")
            except RulesError as exc:
                ruleset = None
                why = str(exc)
            if case.group == "realistic":
                harness.log(f"{case.name}")
            for size in case.chunkings:
                got = ng.get(f"c{i}n{size}", i)
                compared += 1
                if ruleset is None:
                    diffs.append(Difference(case, size, got, None, f"prexy refuses: {why}"))
                    continue
                if not ruleset.applies_to(case.content_type) or not case.body:
                    mine = case.body
                else:
                    mine = run_prexy(ruleset, case.body, size)
                if mine != got:
                    diffs.append(Difference(case, size, got, mine))
    finally:
        ng.stop()
    return {
        "cases": len(cases),
        "compared": compared,
        "refused_by_both": refused_both,
        "refused_by_nginx_only": refused_nginx_only,
        "differences": diffs,
    }


# -- timing -----------------------------------------------------------------


def _prexy_server(name: str, origin_port: int, rules: Path) -> servers.Server:
    """``twistd prexy`` from the interpreter running this script (the
    working tree), one worker, in front of ``origin_port`` with ``rules``."""
    bindir = Path(sys.executable).parent
    install = servers.PrexyInstall(
        twistd=bindir / "twistd", python=Path(sys.executable),
        flags=frozenset({"--listen", "--upstream", "--rules", "--workers"}),
        help_text="", revision="working tree")
    return servers.start_prexy(install, name, origin_port, args=("--rules", str(rules)), workers=1)


def run_timing(module: Path, rounds: int = 21) -> list[dict[str, object]]:
    """Single requests for the 20 KB page at 10/100/1000 rules, interleaved.

    One keep-alive GET each, in turn, per round: nginx with the module (one
    worker; the static page in one buffer, the end of the body with it),
    ``twistd prexy`` (one worker) in front of the same nginx serving the
    page unfiltered, and Prexy's transducer alone on the page in this
    process.  Medians of ``rounds`` rounds (the 1000-rule request through
    the module takes seconds).
    """
    page = realistic.load_page("html-20k")
    cases = []
    for n in realistic.RULE_COUNTS:
        case = Case("timing", f"html-20k/{n}", realistic.rules_text(n).encode(), page, "text/html")
        case.chunkings = (32768,)
        cases.append(case)
    name = "replace-filter-timing"
    root = harness.WORK / (name + "-docroot")
    origin = (b"location /origin/ {\n    alias " + str(root).encode() + b"/;\n"
              b"    types { }\n    default_type text/html;\n}\n")
    ng = Nginx(module, cases, name=name, extra=origin)
    prexies = []
    rows = []
    try:
        for i, case in enumerate(cases):
            rules = harness.WORK / f"{name}-{i}.rules"
            rules.write_bytes(case.directives)
            prexies.append(_prexy_server(f"{name}-prexy{i}", ng.server.port, rules))
        conns = [http.client.HTTPConnection(harness.LOCAL, p.port, timeout=120) for p in prexies]

        def via_prexy(i: int) -> bytes:
            conns[i].request("GET", "/origin/b0")
            resp = conns[i].getresponse()
            return resp.read()

        rulesets = [parse_rules(c.directives, "<timing>") for c in cases]
        for i, rs in enumerate(rulesets):  # warm, and check all three agree
            want = ng.get(f"c{i}n32768", i)
            if via_prexy(i) != want or run_prexy(rs, page, 0) != want:
                raise RuntimeError(f"timing: outputs differ at {cases[i].name}")
        samples: dict[str, list[float]] = {}
        for _ in range(rounds):
            for i, rs in enumerate(rulesets):
                t0 = time.perf_counter()
                ng.get(f"c{i}n32768", i)
                t1 = time.perf_counter()
                via_prexy(i)
                t2 = time.perf_counter()
                run_prexy(rs, page, 0)
                t3 = time.perf_counter()
                samples.setdefault(f"nginx{i}", []).append(t1 - t0)
                samples.setdefault(f"prexy{i}", []).append(t2 - t1)
                samples.setdefault(f"core{i}", []).append(t3 - t2)
        for i, count in enumerate(realistic.RULE_COUNTS):
            n = statistics.median(samples[f"nginx{i}"])
            p = statistics.median(samples[f"prexy{i}"])
            c = statistics.median(samples[f"core{i}"])
            rows.append({"rules": count, "nginx_ms": n * 1e3, "prexy_ms": p * 1e3,
                         "transducer_ms": c * 1e3, "prexy_over_nginx": p / n})
        for conn in conns:
            conn.close()
    finally:
        for server in prexies:
            server.stop()
        ng.stop()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", type=Path, help="path of ngx_http_replace_filter_module.so")
    parser.add_argument("--groups", default="issue15,conformance,sregex,realistic")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--big", action="store_true", help="also the 1 MB page at 1000 rules")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--show", type=int, default=40, help="differences to print")
    args = parser.parse_args(argv)
    if args.module is None:
        print("replace_filter_diff: skipped (no --module given; the module is built outside Prexy)")
        return 0
    if not args.module.exists():
        print(f"replace_filter_diff: {args.module} does not exist", file=sys.stderr)
        return 2
    harness.install_cleanup()
    result = run_diff(args.module.resolve(), [g for g in args.groups.split(",") if g], args.big)
    diffs: list[Difference] = result["differences"]  # type: ignore[assignment]
    print(f"cases {result['cases']}, comparisons {result['compared']}, "
          f"refused by both {result['refused_by_both']}, "
          f"refused by nginx only {result['refused_by_nginx_only']}, "
          f"differences {len(diffs)}")
    for d in diffs[: args.show]:
        print(d.summary())
    payload: dict[str, object] = {k: v for k, v in result.items() if k != "differences"}
    payload["differences"] = [d.summary() for d in diffs]
    if args.timing:
        rows = run_timing(args.module.resolve())
        for r in rows:
            print(f"html-20k {r['rules']:>4} rules: nginx + replace-filter {r['nginx_ms']:.3f} ms, "
                  f"twistd prexy {r['prexy_ms']:.3f} ms (transducer alone "
                  f"{r['transducer_ms']:.3f} ms), prexy/nginx {r['prexy_over_nginx']:.3f}")
        payload["timing"] = rows
    if args.json:
        args.json.write_text(json.dumps(payload, indent=1))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
