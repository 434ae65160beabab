"""The page-view mix: what a site's traffic costs each whole proxy stack.

A page view is one rewritten HTML page (the realistic 20 KB page of the
``subs`` scenario, 10 realistic rules) and the 30 assets it loads:
scripts, stylesheets, images and fonts of realistic sizes, passed through
unchanged (the rules apply to ``text/html`` only) and cached.  The site
has 2,000 URLs, 200 pages and 1,800 assets, with Zipf popularity
(exponent 1 over a seeded ranking of all 2,000): each view draws its page
and its assets, kind by kind, by that popularity.  5% of the requests,
chosen with the same seed, carry a query never sent before, so they miss
the cache; after a warm-up that fetched every URL once the other 95% hit.

The request list (``VIEWS`` views of 31 requests, fixed seed) is played by
wrk's Lua ``request()``, each thread from its own offset; a miss's query
is unique per run, thread and request.

Prexy (``--workers 2``, its shared cache, access log on) against the stack
it replaces: Varnish (built-in VCL, the same default TTL) in front of
nginx + subs_filter with the same rules.  The figure is CPU per page view
of each whole stack, from the processes' own CPU time: Prexy's master and
workers; varnishd (manager and child) plus the nginx subs_filter instance
(master and worker).  Neither the origin nor wrk is counted; varnishncsa,
which writes Varnish's access log from its shared memory, is measured
beside the stack and given in a note, not counted (the stack measured is
varnishd and nginx).  The origin
counts the requests that reach it (``stub_status``), so each run's hit
ratio is measured rather than assumed.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import content
import harness
import realistic
import servers
from harness import LOCAL, WORK, fmt, markdown_table
from scenarios import Bench, Report, target
from servers import MissingFlag, Server

SEED = 34
PAGES = 200
ASSETS_PER_VIEW = 30
VIEWS = 1000
MISS_SHARE = 0.05
ZIPF_EXPONENT = 1.0
#: The two ways the request list is played: as it is, and with no miss.
MODES = {"mix": "95% hits", "hits": "hits only"}
PREXY, PEER = "Prexy", "Varnish + nginx + subs_filter"
#: Seconds a stack keeps what the origin gives without freshness of its own.
TTL = 3600


@dataclass(frozen=True)
class AssetKind:
    """One kind of asset: how many a view loads, how many URLs the site has,
    and the log-normal size distribution (median bytes, sigma) of its files."""

    ext: str
    per_view: int
    urls: int
    median: int
    sigma: float


#: 30 assets a view, 1,800 asset URLs; sizes about those the HTTP Archive
#: reports for pages' requests of each type.
KINDS = (
    AssetKind("js", 8, 480, 22_000, 0.9),
    AssetKind("css", 3, 180, 10_000, 0.8),
    AssetKind("jpg", 10, 600, 18_000, 1.0),
    AssetKind("png", 7, 420, 5_000, 1.0),
    AssetKind("woff2", 2, 120, 24_000, 0.4),
)
MIN_ASSET, MAX_ASSET = 200, 256 * 1024
REQUESTS_PER_VIEW = 1 + ASSETS_PER_VIEW
assert sum(k.per_view for k in KINDS) == ASSETS_PER_VIEW


@dataclass(frozen=True)
class Site:
    """The mix's site: every URL with its body size (pages: None, rewritten),
    and the request list, views one after another; ``True`` marks a miss."""

    pages: tuple[str, ...]
    assets: dict[str, int]
    requests: tuple[tuple[str, bool], ...]

    @property
    def urls(self) -> list[str]:
        return [*self.pages, *self.assets]

    def bytes_per_view(self, page_bytes: int) -> float:
        """Mean body bytes a view fetches, with pages of ``page_bytes``."""
        sizes = [page_bytes if path.startswith("/p/") else self.assets[path]
                 for path, _ in self.requests]
        return sum(sizes) / (len(self.requests) / REQUESTS_PER_VIEW)


def make_site(views: int = VIEWS, seed: int = SEED) -> Site:
    """The URLs, their sizes and the request list, all from ``seed``."""
    rng = random.Random(seed)
    pages = [f"/p/{i}.html" for i in range(PAGES)]
    assets: dict[str, int] = {}
    by_kind: dict[str, list[str]] = {}
    for kind in KINDS:
        paths = [f"/a/{kind.ext}/{i:04d}.{kind.ext}" for i in range(kind.urls)]
        by_kind[kind.ext] = paths
        for path in paths:
            size = round(rng.lognormvariate(math.log(kind.median), kind.sigma))
            assets[path] = min(MAX_ASSET, max(MIN_ASSET, size))
    everything = [*pages, *assets]
    ranking = everything[:]
    rng.shuffle(ranking)
    weight = {url: 1.0 / (rank + 1) ** ZIPF_EXPONENT for rank, url in enumerate(ranking)}

    def draw(urls: list[str], count: int) -> list[str]:
        weights = [weight[u] for u in urls]
        chosen: list[str] = []
        while len(chosen) < count:  # a view loads an asset once
            url = rng.choices(urls, weights)[0]
            if url not in chosen:
                chosen.append(url)
        return chosen

    requests: list[tuple[str, bool]] = []
    for _ in range(views):
        view = draw(pages, 1)
        for kind in KINDS:
            view += draw(by_kind[kind.ext], kind.per_view)
        head, rest = view[0], view[1:]
        rng.shuffle(rest)
        requests += [(url, rng.random() < MISS_SHARE) for url in (head, *rest)]
    return Site(tuple(pages), assets, tuple(requests))


def write_assets(site: Site, www: Path) -> None:
    """The asset files: scripts and stylesheets cut from the corpus's jQuery
    and Bootstrap (text as a site serves it), images and fonts as
    incompressible bytes."""
    rng = random.Random(SEED + 1)
    texts = {"js": realistic.load_page("jquery"), "css": realistic.load_page("bootstrap-css")}
    for path, size in site.assets.items():
        ext = path.rsplit(".", 1)[1]
        if ext in texts:
            text = texts[ext]
            start = rng.randrange(len(text))
            body = (text[start:] + text)[:size]
            while len(body) < size:
                body += text[: size - len(body)]
        else:
            body = rng.randbytes(size)
        content.write(www / path.lstrip("/"), body)


def lua_script(site: Site) -> Path:
    """wrk's Lua: the request list as text, parsed once per thread; each
    thread starts at its own offset (moved each round); a miss gets
    ``?miss=RUN-THREAD-N``, unless the run plays hits only."""
    listing = "\n".join(("!" if miss else "") + path for path, miss in site.requests)
    body = f"""-- generated by bench/mix_bench.py: {len(site.requests)} requests, {len(site.requests) // REQUESTS_PER_VIEW} page views
local listing = [[
{listing}
]]
{harness.LUA_THREAD_IDS}init = function(args)
  run = args[1] or "0"
  local round = tonumber(args[2] or "0")
  hits_only = args[3] == "hits"
  paths, misses = {{}}, {{}}
  for line in listing:gmatch("[^\\n]+") do
    if line:sub(1, 1) == "!" then
      paths[#paths + 1] = line:sub(2)
      misses[#paths] = true
    else
      paths[#paths + 1] = line
    end
  end
  -- each thread starts at a view of its own, another one each round
  i = ((tid * 397 + round * 211) * {REQUESTS_PER_VIEW}) % #paths
  n = 0
end
request = function()
  i = i + 1
  if i > #paths then i = 1 end
  local path = paths[i]
  if misses[i] and not hits_only then
    n = n + 1
    path = path .. "?miss=" .. run .. "-" .. tid .. "-" .. n
  end
  return wrk.format("GET", path)
end
"""
    return harness.wrk_script("wrk-mix", body)


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def first_last(error: Exception) -> str:
    """An error's first and last lines (a start failure carries the log's tail)."""
    lines = [x.strip() for x in str(error).splitlines() if x.strip()] or [repr(error)]
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def origin_requests(origin: Server) -> int:
    """Requests the origin has handled so far (nginx ``stub_status``,
    this request included)."""
    got = harness.get_once(origin.port, "/__requests", timeout=10)
    return int(got.body.decode().splitlines()[2].split()[2])


@dataclass
class Stack:
    """A proxy stack under test: the URL it serves and its processes."""

    name: str
    front: Server
    parts: dict[str, Server]
    #: Processes measured beside the stack but not counted in its figure.
    beside: dict[str, Server] = field(default_factory=dict)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each part, and of each process beside it."""
        return {name: server.cpu() for name, server in (self.parts | self.beside).items()}


def _first_hit(stack: Stack, path: str) -> tuple[bytes, str]:
    """The body of a hit on ``path`` (a miss first) and what says it is one."""
    harness.get_once(stack.front.port, path)
    got = harness.get_once(stack.front.port, path)
    if got.status != 200:
        raise RuntimeError(f"{stack.name} {path}: status {got.status}")
    state = got.headers.get("cache-status") or (
        f"X-Varnish {got.headers.get('x-varnish')!r}, Age {got.headers.get('age')}")
    return got.body, state


def scenario_mix(bench: Bench) -> Report:
    """CPU per page view: Prexy against Varnish + nginx + subs_filter."""
    module = harness.subs_module_path()
    if module is None:
        raise RuntimeError("libnginx-mod-http-subs-filter is not installed")
    notes: list[str] = []
    install = bench.prexy()
    if install is None:
        notes.append(bench.install_error)
    site = make_site()
    www = WORK / "www-mix"
    realistic.ensure_sources()
    page = realistic.load_page("html-20k")
    content.write(www / "page.html", page)
    write_assets(site, www)
    origin = servers.start_nginx("nginx-mix-origin", f"""        root {www};
        types {{ text/html html; text/css css; application/javascript js; image/jpeg jpg;
                 image/png png; font/woff2 woff2; }}
        etag on;
        open_file_cache max=4096 inactive=1h;
        open_file_cache_valid 1h;
        location / {{ }}
        location /p/ {{ rewrite ^ /page.html break; }}
        location = /__requests {{ stub_status; }}
""", workers=2)
    rules10 = realistic.rules_text(10)
    html_only = "replace_filter_types text/html;"
    rules = content.write(WORK / "rules" / "rules-mix-10.conf", "\n".join(
        html_only if line.startswith("replace_filter_types") else line
        for line in rules10.splitlines()) + "\n")
    subs = "\n".join("subs_filter_types text/html;" if line.startswith("subs_filter_types") else line
                     for line in realistic.subs_filter_directives(10).splitlines())
    # The store in a directory of its own (Prexy keeps files beside it too),
    # on tmpfs like Prexy's default, removed at the end.
    scratch = Path("/dev/shm" if Path("/dev/shm").is_dir() else WORK) / f"prexy-bench-mix-{os.getpid()}"
    cache_dir = scratch / "cache"
    scratch.mkdir(parents=True, exist_ok=True)
    started: list[Server] = [origin]
    try:
        nginx = servers.start_nginx_proxy(
            "nginx-mix-subs", origin.port, modules=(module,),
            location_extra="            proxy_set_header Accept-Encoding \"\";\n"
            + "".join(f"            {line}\n" for line in subs.splitlines()))
        started.append(nginx)
        varnish = servers.start_varnish("varnish-mix", nginx.port, default_ttl=TTL)
        started.append(varnish)
        # varnishncsa writes the access log Varnish itself keeps only in
        # shared memory: measured for the notes, not counted in the stack.
        ncsa = Server("varnishncsa", 0, harness.spawn("varnishncsa-mix", [
            shutil.which("varnishncsa") or "/usr/bin/varnishncsa", "-n", str(WORK / "varnish-mix"),
            "-w", str(WORK / "varnish-mix" / "access.log")]))
        started.append(ncsa)
        stacks = [Stack(PEER, varnish, {"varnishd": varnish, "nginx + subs_filter": nginx},
                        {"varnishncsa": ncsa})]
        try:
            if install is None:
                raise MissingFlag(bench.install_error)
            prexy = servers.start_prexy_config(install, "prexy-mix", f"""[server]
listen = ["tcp:{{port}}:interface={LOCAL}"]
access_log = "{WORK / 'prexy-mix' / 'access.log'}"
[cache]
size = "256M"
path = "{cache_dir}"
[sites.bench]
upstream = "http://{LOCAL}:{origin.port}"
rules = ["{rules}"]
cache = true
cache_ttl = {TTL}
""", workers=2)
            started.append(prexy)
            stacks.insert(0, Stack(PREXY, prexy, {"Prexy": prexy}))
        except (MissingFlag, RuntimeError) as error:
            if install is not None:
                notes.append(f"Prexy not measured: {first_last(error)}")
        report = _measure(bench, site, origin, stacks, page, notes)
    finally:
        for server in reversed(started):
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report.notes.append(
        f"Rules: the realistic 10-rule set (bench/realistic.py), on text/html only; Prexy "
        f"`--workers 2`, `[cache] size = \"256M\"`, `cache_ttl = {TTL}`, access log to a file; "
        f"Varnish built-in VCL, `-s malloc,256m -t {TTL}` (its shared-memory log read by varnishncsa "
        "into a file: see its own note), in front of nginx + subs_filter (1 worker, buffered access log, "
        "upstream keep-alive); the origin nginx (2 workers) is not counted.")
    return report


def _measure(bench: Bench, site: Site, origin: Server, stacks: list[Stack], page: bytes,
             notes: list[str]) -> Report:
    s = bench.settings
    # Every URL once through each stack: the cache holds the whole site.
    for stack in stacks:
        client = harness.Client(stack.front.port, 30)
        try:
            for url in site.urls:
                got = client.get(url)
                if got.status != 200:
                    raise RuntimeError(f"{stack.name} {url}: status {got.status}")
        finally:
            client.close()
    # The rewritten page and an asset: the same bytes from both stacks?
    top_page = site.requests[0][0]
    asset = next(path for path, _ in site.requests if path.startswith("/a/"))
    bodies: dict[str, bytes] = {}
    for stack in stacks:
        body, state = _first_hit(stack, top_page)
        bodies[stack.name] = body
        notes.append(f"{stack.name}: second GET of {top_page}: {state}")
        asset_body, _ = _first_hit(stack, asset)
        if asset_body != (WORK / "www-mix" / asset.lstrip("/")).read_bytes():
            notes.append(f"{stack.name} changed the asset {asset}: the mix is not what it should be")
    prexy_page, stack_page = bodies.get(PREXY), bodies[PEER]
    if prexy_page is None:
        same = "not compared"
    elif prexy_page == stack_page:
        same = f"identical ({len(prexy_page):,} bytes"
        same += ", rewritten)" if prexy_page != page else ", but not rewritten!)"
    else:
        at = next((i for i, (a, b) in enumerate(zip(prexy_page, stack_page, strict=False)) if a != b),
                  min(len(prexy_page), len(stack_page)))
        same = f"differ at byte {at} ({len(prexy_page):,} vs {len(stack_page):,} bytes)"
        notes.append(f"The two stacks' rewritten pages differ ({same}): the stacks do not do "
                     "the same work, compare with care.")
    script = lua_script(site)
    connections = max(s.connections)
    rounds = s.rounds
    cells = [(stack, mode) for mode in MODES for stack in stacks]
    runs: dict[tuple[str, str], list[dict[str, float]]] = {(st.name, mode): [] for st, mode in cells}
    run_id = 0

    def one(stack: Stack, mode: str, seconds: float, round_: int) -> tuple[harness.WrkResult, dict[str, float], int]:
        nonlocal run_id
        run_id += 1
        before, origin_before = stack.cpu(), origin_requests(origin)
        result = harness.wrk(stack.front.url("/"), seconds=seconds, connections=connections, threads=2,
                             script=script, script_args=(f"{run_id}.{time.monotonic_ns() % 10**6}", str(round_), mode))
        after, origin_after = stack.cpu(), origin_requests(origin)
        cpu = {name: after[name] - before[name] for name in before}
        return result, cpu, origin_after - origin_before - 1

    for stack in stacks:  # warm-up: connection pools, lazy imports
        one(stack, "mix", 1, 0)
    for r in range(rounds):
        for stack, mode in cells if r % 2 == 0 else list(reversed(cells)):
            result, cpu, reached = one(stack, mode, s.seconds, r)
            if result.errors or result.non2xx:
                notes.append(f"{stack.name} ({mode}): {result.errors} socket errors/timeouts, "
                             f"{result.non2xx} non-2xx answers in a run")
            views = result.requests / REQUESTS_PER_VIEW
            figures = {
                "rps": result.rps, "views_s": result.rps / REQUESTS_PER_VIEW, "p99_ms": result.p99_ms,
                "cpu_view_us": sum(cpu[name] for name in stack.parts) / views * 1e6 if views else math.nan,
                "hit_ratio": 1 - reached / result.requests if result.requests else math.nan,
                **{f"cpu_view_us {name}": value / views * 1e6 if views else math.nan
                   for name, value in cpu.items()},
            }
            runs[(stack.name, mode)].append(figures)
            harness.log(f"  {mode} {stack.name}: {result.rps:,.0f} req/s, {figures['cpu_view_us']:,.0f} µs "
                        f"CPU per view, hits {figures['hit_ratio']:.1%}")
    med = {key: {figure: statistics.median(run[figure] for run in r) for figure in r[0]}
           for key, r in runs.items() if r}
    rows = []
    ratios: dict[str, tuple[float | None, float | None]] = {}
    for mode in MODES:
        for stack in stacks:
            m = med.get((stack.name, mode))
            if m is None:
                continue
            parts = " + ".join(f"{name} {m[f'cpu_view_us {name}']:,.0f}" for name in stack.parts) \
                if len(stack.parts) > 1 else "-"
            rows.append([stack.name, MODES[mode], fmt(m["rps"]), fmt(m["views_s"]), fmt(m["p99_ms"], 2),
                         fmt(m["cpu_view_us"]), parts, fmt(m["cpu_view_us"] / REQUESTS_PER_VIEW, 1),
                         f"{m['hit_ratio']:.1%}"])
        prexy, peer = med.get((PREXY, mode)), med.get((PEER, mode))
        ratios[mode] = ((prexy["cpu_view_us"] / peer["cpu_view_us"], prexy["rps"] / peer["rps"])
                        if prexy and peer else (None, None))
    cpu_ratio = ratios["mix"][0]
    for stack in stacks:
        for name in stack.beside:
            per_view = [f"{fmt(med[(stack.name, mode)][f'cpu_view_us {name}'])} µs ({MODES[mode]})"
                        for mode in MODES if (stack.name, mode) in med]
            notes.append(f"{name}, writing the access log of {stack.name} beside it, used "
                         + ", ".join(per_view) + " of CPU per page view, not counted in the stack's figure.")
    table = markdown_table(
        ["stack", "traffic", "req/s", "page views/s", "p99 ms", "CPU µs per page view", "of which (µs)",
         "CPU µs per request", "hits (origin count)"], rows)
    table += "\n\nPrexy / the stack: " + "; ".join(
        f"{MODES[mode]}: CPU per page view {_times(cpu)}, req/s {_times(rps)}"
        for mode, (cpu, rps) in ratios.items()) + f". The rewritten page: {same}."
    targets = [target(
        "Page-view mix: Prexy's CPU per page view at most 1.0x the Varnish + nginx + subs_filter "
        f"stack's ({_times(cpu_ratio)})", None if cpu_ratio is None else cpu_ratio <= 1.0)]
    notes.insert(0, (
        f"{len(site.urls):,} URLs ({PAGES} pages, {len(site.assets):,} assets: "
        + ", ".join(f"{k.per_view} {k.ext} of median {k.median / 1000:g} KB" for k in KINDS)
        + f"), Zipf popularity (s = {ZIPF_EXPONENT:g}); {VIEWS:,} page views of {REQUESTS_PER_VIEW} "
        f"requests (seed {SEED}), {site.bytes_per_view(len(page)) / 1000:,.0f} KB of bodies per view; "
        f"{MISS_SHARE:.0%} of the requests with a new query (misses), played as they are ('95% hits') "
        f"and with those queries left off ('hits only'). wrk -t2 -c{connections}, "
        f"{s.seconds:g} s per run, medians of {rounds} interleaved runs after a 1 s warm-up and "
        "one GET of every URL per stack. CPU per page view: the stack's processes' utime+stime "
        f"over the run / (requests / {REQUESTS_PER_VIEW}); hits: 1 - the origin's requests "
        "(stub_status) / the requests."))
    data = {"median": {" ".join(k): v for k, v in med.items()},
            "runs": {" ".join(k): v for k, v in runs.items()},
            "ratios": ratios, "page": same}
    return Report("mix: page views, Prexy vs Varnish + nginx + subs_filter", table, notes, data,
                  targets)
