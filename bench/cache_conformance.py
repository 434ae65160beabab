"""Run the HTTP caching conformance suite (cache-tests.fyi) against Prexy,
Varnish and nginx, and print which tests each passes.

    python bench/cache_conformance.py --suite /path/to/cache-tests
    PREXY_CACHE_TESTS=/path/to/cache-tests python bench/cache_conformance.py \
        [--servers prexy,varnish,nginx] [--workers 1] [--failures prexy]
    python bench/cache_conformance.py --compare     # tables from the last saved run

The suite is the ``http-tests/cache-tests`` repository (its test server
plays the origin, its CLI client runs the tests against a base URL and
prints JSON results); it is not part of Prexy and is never copied here: give
its checkout with ``--suite`` or ``PREXY_CACHE_TESTS``.  Node.js runs it
(``npm install`` is run in the checkout when ``node_modules`` is missing).

The script starts the suite's origin on a free port of 127.0.0.1, then for
each server in turn: Prexy (``twistd -n prexy --config`` from this working
tree, cache on, ``--workers`` workers), Varnish (``varnishd -F`` with a VCL
that has only the backend, so the built-in VCL decides) and nginx
(``proxy_cache`` with ``proxy_cache_revalidate``), each on a free port of
127.0.0.1, runs the client against it and stops it.  Results go to
``bench/.work/cache-conformance/<server>.json`` and the tables to stdout:
passed tests per server, by the suite's kinds (required / optimal / check),
then every test where the servers differ, with the failure messages.

A test passes when its result is ``true``; the suite's website also greys
out tests whose ``depends_on`` failed, which is shown as a second figure.
Tests marked ``browser_only`` are not run against a proxy and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import servers  # noqa: E402
from harness import LOCAL, WORK  # noqa: E402

OUT = WORK / "cache-conformance"
SERVERS = ("prexy", "varnish", "nginx")
#: The binary each peer needs (a missing one is skipped with a note).
BINARIES = {"varnish": "varnishd", "nginx": "nginx"}
KINDS = ("required", "optimal", "check")

#: Reads the suite's test list and prints, per test: id, kind, suite,
#: browser_only and depends_on (our code, run by node inside the checkout).
LIST_TESTS_JS = """
const suites = (await import(process.argv[1] + '/tests/index.mjs')).default
const out = []
for (const s of suites) for (const t of s.tests) out.push({
  id: t.id, kind: t.kind || 'required', suite: s.id, name: t.name,
  browser_only: t.browser_only === true, depends_on: t.depends_on || [] })
console.log(JSON.stringify(out))
"""

TWISTD = "import sys; sys.argv[0] = 'twistd'; from twisted.scripts.twistd import run; run()"


@dataclass(frozen=True)
class Test:
    """One test of the suite, as its index lists it."""

    id: str
    kind: str
    suite: str
    name: str
    browser_only: bool
    depends_on: tuple[str, ...]


# --------------------------------------------------------------------------
# The suite


def suite_dir(option: str | None) -> Path:
    """The suite checkout from ``--suite`` or ``PREXY_CACHE_TESTS``, checked."""
    path = option or os.environ.get("PREXY_CACHE_TESTS")
    if not path:
        raise SystemExit("give the cache-tests checkout with --suite or PREXY_CACHE_TESTS")
    root = Path(path).resolve()
    for needed in ("tests/index.mjs", "test-engine/cli.mjs", "test-engine/server/server.mjs"):
        if not (root / needed).exists():
            raise SystemExit(f"{root} is not a cache-tests checkout (no {needed})")
    if not (root / "node_modules").exists():
        harness.log(f"npm install in {root}")
        subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=root, check=True, timeout=600)
    return root


def list_tests(root: Path) -> dict[str, Test]:
    run = subprocess.run(["node", "--input-type=module", "-e", LIST_TESTS_JS, str(root)],
                         capture_output=True, text=True, check=True, timeout=120)
    return {t["id"]: Test(t["id"], t["kind"], t["suite"], t["name"], t["browser_only"],
                          tuple(t["depends_on"]))
            for t in json.loads(run.stdout)}


def start_origin(root: Path) -> tuple[harness.Child, int]:
    """The suite's test server, which plays the origin, on 127.0.0.1."""
    port = harness.free_port()
    env = dict(os.environ, npm_config_port=str(port), npm_config_host=LOCAL,
               npm_config_protocol="http", npm_config_pidfile=str(OUT / "origin.pid"))
    child = harness.spawn("cache-tests-origin", ["node", "test-engine/server/server.mjs"], cwd=root, env=env)
    harness.wait_port(child, port, timeout=60)
    return child, port


def run_client(root: Path, port: int, name: str) -> dict[str, object]:
    """Run every test against ``http://127.0.0.1:PORT``; the JSON results."""
    env = dict(os.environ, npm_config_base=f"http://{LOCAL}:{port}", npm_config_id="")
    harness.log(f"{name}: running the suite against port {port}")
    run = subprocess.run(["node", "--no-warnings", "test-engine/cli.mjs"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=900)
    if run.returncode != 0 or not run.stdout.lstrip().startswith("{"):
        raise RuntimeError(f"the suite's client failed against {name}:\n{run.stderr[-3000:]}")
    results: dict[str, object] = json.loads(run.stdout)
    return results


# --------------------------------------------------------------------------
# The servers under test


def start_prexy(origin: int, workers: int, twistd: str | None, settings: list[str],
                tree: Path) -> servers.Server:
    """Prexy from a source ``tree`` (this working tree by default; or an
    installed ``twistd``), cache on, the site's defaults otherwise;
    ``settings`` are extra ``key = value`` lines for the site (``--prexy-set``)."""
    rundir = WORK / "cache-conformance-prexy"
    rundir.mkdir(parents=True, exist_ok=True)
    port = harness.free_port()
    conf = rundir / "prexy.toml"
    conf.write_text(
        "# generated by bench/cache_conformance.py\n"
        f'[server]\nlisten = ["tcp:{port}:interface={LOCAL}"]\nworkers = {workers}\naccess_log = "off"\n'
        f'[cache]\nsize = "64M"\npath = "{rundir}/store"\n'
        f'[sites.suite]\nupstream = "http://{LOCAL}:{origin}"\n'
        + "".join(f"{line}\n" for line in settings)
    )
    for stale in rundir.glob("store*"):
        if stale.is_file():
            stale.unlink()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if twistd:
        argv = [twistd]
        env.pop("PYTHONPATH", None)
    else:
        argv = [sys.executable, "-c", TWISTD]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH")) if p)
    child = harness.spawn("cache-conformance-prexy",
                          [*argv, "-n", "--pidfile=", "prexy", "--config", str(conf)], cwd=rundir, env=env)
    harness.wait_port(child, port, timeout=120)
    harness.wait_http(child, port, timeout=120)
    return servers.Server("prexy", port, child)


def start_varnish(origin: int) -> servers.Server:
    """varnishd -F with a VCL that only names the backend: the built-in VCL decides."""
    workdir = WORK / "cache-conformance-varnish"
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)
    vcl = workdir / "default.vcl"
    vcl.write_text(f'vcl 4.1;\nbackend suite {{ .host = "{LOCAL}"; .port = "{origin}"; }}\n')
    port = harness.free_port()
    child = harness.spawn("cache-conformance-varnish", [
        shutil.which("varnishd") or "/usr/sbin/varnishd", "-F", "-a", f"{LOCAL}:{port}", "-f", str(vcl), "-n", str(workdir),
        "-s", "malloc,64m", "-T", "none",
    ])
    harness.wait_port(child, port, timeout=120)
    return servers.Server("varnish", port, child)


def start_nginx(origin: int) -> servers.Server:
    """nginx with proxy_cache: what an operator writes for a caching proxy."""
    prefix = WORK / "cache-conformance-nginx"
    cache = prefix / "cache"
    location = f"""        location / {{
            proxy_pass http://{LOCAL}:{origin};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache suite;
            proxy_cache_revalidate on;
            proxy_cache_use_stale error timeout updating http_500 http_502 http_503 http_504;
        }}
"""
    http_extra = f"    proxy_cache_path {cache} levels=1:2 keys_zone=suite:10m max_size=64m inactive=1h use_temp_path=off;\n"
    return servers.start_nginx("cache-conformance-nginx", location, http_extra=http_extra)


# --------------------------------------------------------------------------
# Tables


def passed(result: object) -> bool:
    return result is True


def passed_with_dependencies(tests: dict[str, Test], results: dict[str, object], test_id: str,
                             seen: frozenset[str] = frozenset()) -> bool:
    """Passed, and so did every test it depends on (as the suite's site shows it)."""
    if not passed(results.get(test_id)) or test_id in seen:
        return passed(results.get(test_id))
    test = tests.get(test_id)
    return test is None or all(
        passed_with_dependencies(tests, results, dep, seen | {test_id}) for dep in test.depends_on)


def message(result: object) -> str:
    if result is True:
        return "pass"
    if result is None:
        return "not run"
    if isinstance(result, list) and len(result) == 2:
        return f"{result[0]}: {result[1]}"
    return str(result)


def counts_table(tests: dict[str, Test], runs: dict[str, dict[str, object]]) -> str:
    run_ids = [t.id for t in tests.values() if not t.browser_only]
    header = ["server", "passed (all)", *[f"{k}" for k in KINDS], "passed, dependencies honoured"]
    rows = [["tests", str(len(run_ids)),
             *[str(sum(1 for i in run_ids if tests[i].kind == k)) for k in KINDS], ""]]
    for name, results in runs.items():
        row = [name, str(sum(passed(results.get(i)) for i in run_ids))]
        for kind in KINDS:
            row.append(str(sum(passed(results.get(i)) for i in run_ids if tests[i].kind == kind)))
        row.append(str(sum(passed_with_dependencies(tests, results, i) for i in run_ids)))
        rows.append(row)
    return harness.markdown_table(header, rows)


def differences_table(tests: dict[str, Test], runs: dict[str, dict[str, object]]) -> str:
    names = list(runs)
    rows = []
    for test in tests.values():
        if test.browser_only:
            continue
        marks = [passed(runs[n].get(test.id)) for n in names]
        if len(set(marks)) > 1:
            rows.append([test.kind, test.id, *("pass" if m else "FAIL" for m in marks)])
    rows.sort(key=lambda r: (KINDS.index(r[0]), r[1]))
    return harness.markdown_table(["kind", "test", *names], rows) if rows else "(no differences)"


def failures_list(tests: dict[str, Test], runs: dict[str, dict[str, object]], server: str) -> str:
    results = runs[server]
    others = [n for n in runs if n != server]
    lines = []
    for test in sorted(tests.values(), key=lambda t: (KINDS.index(t.kind), t.id)):
        if test.browser_only or passed(results.get(test.id)):
            continue
        by = [n for n in others if passed(runs[n].get(test.id))]
        also = f" (passed by {', '.join(by)})" if by else ""
        lines.append(f"- {test.kind} `{test.id}`{also}: {message(results.get(test.id))}")
    return "\n".join(lines) if lines else "(none)"


def report(tests: dict[str, Test], runs: dict[str, dict[str, object]], failures: list[str]) -> str:
    parts = ["## Passed tests per server\n", counts_table(tests, runs),
             "\n## Tests where the servers differ\n", differences_table(tests, runs)]
    for name in failures:
        if name in runs:
            parts += [f"\n## Tests {name} does not pass\n", failures_list(tests, runs, name)]
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", help="the cache-tests checkout (default: $PREXY_CACHE_TESTS)")
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help="comma-separated, from prexy,varnish,nginx (default: all)")
    parser.add_argument("--workers", type=int, default=1, help="Prexy workers (default 1)")
    parser.add_argument("--prexy-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a site setting for Prexy, in TOML (e.g. cache_grace=0); the run"
                             " is then named prexy[KEY=VALUE]")
    parser.add_argument("--prexy-twistd", help="an installed twistd to run instead of a source tree")
    parser.add_argument("--prexy-tree", type=Path, default=harness.REPO,
                        help="the Prexy source tree to run (default: this working tree; e.g. an older"
                             " commit from `git archive`), with this interpreter's packages")
    parser.add_argument("--failures", default="prexy",
                        help="comma-separated servers whose failures are listed (default prexy)")
    parser.add_argument("--compare", action="store_true",
                        help="run nothing: print the tables from the JSON of the last run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = [s for s in args.servers.split(",") if s]
    unknown = set(wanted) - set(SERVERS)
    if unknown:
        raise SystemExit(f"unknown server(s): {', '.join(sorted(unknown))}")
    root = suite_dir(args.suite)
    OUT.mkdir(parents=True, exist_ok=True)
    tests = list_tests(root)
    runs: dict[str, dict[str, object]] = {}
    prexy_name = "prexy" + "".join(f"[{s.replace(' ', '')}]" for s in args.prexy_set)
    label = {"prexy": prexy_name, "varnish": "varnish", "nginx": "nginx"}
    if args.compare:
        for name in wanted:
            path = OUT / f"{label[name]}.json"
            if path.exists():
                runs[label[name]] = json.loads(path.read_text())
    else:
        harness.install_cleanup()
        origin, origin_port = start_origin(root)
        try:
            for name in wanted:
                binary = BINARIES.get(name)
                if binary and not (shutil.which(binary) or Path(f"/usr/sbin/{binary}").exists()):
                    harness.log(f"{name}: skipped, no {binary} (apt-get install {name})")
                    continue
                if name == "prexy":
                    server = start_prexy(origin_port, args.workers, args.prexy_twistd, args.prexy_set,
                                         args.prexy_tree.resolve())
                elif name == "varnish":
                    server = start_varnish(origin_port)
                else:
                    server = start_nginx(origin_port)
                try:
                    runs[label[name]] = run_client(root, server.port, label[name])
                finally:
                    server.stop()
                (OUT / f"{label[name]}.json").write_text(json.dumps(runs[label[name]], indent=1) + "\n")
        finally:
            harness.stop(origin)
    failures = [label.get(s, s) for s in args.failures.split(",") if s]
    text = report(tests, runs, failures)
    (OUT / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
