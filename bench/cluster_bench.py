"""The cluster speed lines: how fast a PURGE reaches every node, and
what the cluster code costs a cache hit.

1. Three ``twistd -n prexy`` nodes (one worker each, own store, own ports)
   in front of one origin, one ``redis-server`` on loopback.  Each round
   warms one object on all three nodes (a hit on each), sends PURGE to
   node A, then asks B and C (and A) at once, each on a kept-alive
   connection and again until the answer is a miss: the time from the
   PURGE's answer to the sending of the first probe that missed, the
   slowest of the three nodes (so the resolution is one hit's time, and
   the figure includes the probe threads' own start on a busy machine);
   and in how many rounds the first probe on every node was already a miss.  Run twice: with
   the default ``confirm_timeout`` (A answers once the other live nodes
   acknowledged, so the object is gone everywhere before the answer) and
   with ``confirm_timeout = 0`` (A answers as soon as Redis took the entry:
   the bare propagation through Redis).  Target: p99 under 100 ms.
2. A cache hit in memory (the proxy's resource, the LMDB store, a client
   on a fake transport, no sockets), with and without ``[cluster]`` (the
   cache layer's ``announce`` set as a node's worker sets it), interleaved
   rounds, medians: the cluster code's cost per hit.  Target: under 5 us.
   None is expected: the hit path runs no cluster code (a worker has no
   Redis connection; PURGEs go to the master).

``python bench/cluster_bench.py [--quick]`` runs both with this
interpreter and checkout; ``python bench/run.py --only cluster`` runs them
on the bench's Prexy install and nginx origin.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import LOCAL, markdown_table  # noqa: E402

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"


# -- part 2: the hit, in memory ------------------------------------------------------


def hit_cost(rounds: int = 31, hits: int = 1000) -> dict[str, Any]:
    """Microseconds per in-memory cache hit, without and with [cluster]."""
    from twisted.internet import defer
    from twisted.internet.address import IPv4Address
    from twisted.internet.error import ConnectionDone
    from twisted.internet.testing import MemoryReactorClock, StringTransport
    from twisted.python.failure import Failure

    from prexy.cache.policy import CachePolicy
    from prexy.cache.store import Store
    from prexy.cluster.relay import WorkerRelay
    from prexy.config import Config, SiteConfig, UpstreamURL
    from prexy.metrics import Metrics
    from prexy.proxy.caching import CacheLayer
    from prexy.proxy.events import NoEvents
    from prexy.proxy.pool import UpstreamPool
    from prexy.proxy.resource import ProxyResource, ProxySite
    from prexy.runtime import build_runtime

    upstream: list[Any] = []

    class Endpoint:
        def connect(self, factory: Any) -> Any:
            protocol = factory.buildProtocol(None)
            protocol.makeConnection(StringTransport())
            upstream.append(protocol)
            return defer.succeed(protocol)

    def proxy(clustered: bool) -> Any:
        clock = MemoryReactorClock()
        clock.advance(1_700_000_000)
        config = Config(listen=("tcp:0",), default_site="s", access_log=None,
                        sites=(SiteConfig("s", UpstreamURL.parse("http://o.test"), cache=CachePolicy()),))
        metrics = Metrics()
        pool = UpstreamPool(clock, config.timeouts, endpoint_factory=lambda k, t: Endpoint(), limits=config.limits)
        resource = ProxyResource(clock, pool, build_runtime(config), metrics)
        store = Store.open(tempfile.mkdtemp(prefix="prexy-bench-hit-"), 64 << 20, clock=clock.seconds)
        resource.cache = CacheLayer(clock, store, metrics)
        if clustered:  # as a worker of a node with [cluster] sets it
            resource.cache.announce = WorkerRelay(clock, lambda message: None, NoEvents(), 3.0)
        site = ProxySite(resource, config.max_request_body, metrics, reactor=clock)
        site.log = lambda request: None
        return site, clock

    request = b"GET /hit HTTP/1.1\r\nHost: o.test\r\n\r\n"

    def one(wired: Any, origin_answers: bool = False) -> bytes:
        site, clock = wired
        channel = site.buildProtocol(IPv4Address("TCP", "10.0.0.1", 5555))
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(request)
        if origin_answers:
            upstream[-1].dataReceived(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=3600\r\n"
                b"Content-Length: 12\r\n\r\nhello world!"
            )
        clock.advance(0)
        out: bytes = transport.value()
        channel.connectionLost(Failure(ConnectionDone()))
        return out

    # Three proxies: alone, a second one alone (the A/A control: the noise
    # floor of the comparison), and one with [cluster] as a worker has it.
    sites = {"alone": proxy(False), "control": proxy(False), "cluster": proxy(True)}
    for name, site in sites.items():
        one(site, origin_answers=True)  # the miss that stores it
        answer = one(site)
        assert b"Cache-Status: prexy; hit" in answer, (name, answer[:300])
    per_hit: dict[str, list[float]] = {name: [] for name in sites}
    names = list(sites)
    for r in range(rounds):
        order = names[r % 3 :] + names[: r % 3]  # each one first as often as the others
        for name in order:
            site = sites[name]
            start = time.process_time()  # this process's CPU: less swayed by the neighbours
            for _ in range(hits):
                one(site)
            per_hit[name].append((time.process_time() - start) / hits * 1e6)
    alone = per_hit["alone"]
    added = [c - a for c, a in zip(per_hit["cluster"], alone, strict=True)]
    control = [c - a for c, a in zip(per_hit["control"], alone, strict=True)]
    return {
        "alone_us": statistics.median(alone), "cluster_us": statistics.median(per_hit["cluster"]),
        "added_us": statistics.median(added), "control_us": statistics.median(control),
        "rounds": rounds, "hits": hits,
    }


# -- part 1: PURGE across three nodes ---------------------------------------------------


def _wait_line(child: harness.Child, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in child.logfile.read_text(errors="replace"):
            return
        if not child.alive():
            raise RuntimeError(f"{child.name} exited: {child.logfile.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"{child.name}: no {text!r} in {timeout} s")


class Node:
    def __init__(self, name: str, port: int, admin: int, child: harness.Child) -> None:
        self.name = name
        self.port = port
        self.admin = admin
        self.child = child
        self.conn = http.client.HTTPConnection(LOCAL, port, timeout=10)

    def ask(self, method: str, path: str) -> tuple[int, str, bytes]:
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, headers={"Host": "bench"})
                response = self.conn.getresponse()
                return response.status, response.getheader("Cache-Status") or "", response.read()
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(LOCAL, self.port, timeout=10)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def start_fleet(python: str, env: dict[str, str], origin_port: int, redis_port: int, work: Path,
                confirm_timeout: float | None, tag: str) -> list[Node]:
    nodes = []
    for name in "abc":
        port, admin = harness.free_port(), harness.free_port()
        conf = work / f"{tag}-{name}.toml"
        conf.write_text(
            f"[server]\nlisten = ['tcp:{port}:interface={LOCAL}']\nadmin = 'tcp:{admin}:interface={LOCAL}'\n"
            f"workers = 1\naccess_log = 'off'\n[cache]\nsize = '64M'\npath = '{work / (tag + '-store-' + name)}'\n"
            f"[cluster]\nredis = 'redis://{LOCAL}:{redis_port}/0'\nnode = '{name}'\nkey = '{tag}'\n"
            + (f"confirm_timeout = {confirm_timeout}\n" if confirm_timeout is not None else "")
            + f"[sites.bench]\nupstream = 'http://{LOCAL}:{origin_port}'\ncache_ttl = 3600\n"
        )
        argv = [python, "-c", "import sys; sys.argv[0] = 'twistd'; from twisted.scripts.twistd import run; run()",
                "-n", "--pidfile=", "prexy", "--config", str(conf)]
        child = harness.spawn(f"cluster-{tag}-{name}", argv, cwd=work, env=env)
        nodes.append(Node(name, port, admin, child))
    for node in nodes:
        _wait_line(node.child, "cluster: node", 60)
        harness.wait_http(node.child, node.port, timeout=60)
    return nodes


def _probe(node: Node, target: str, answered: float, gone: dict[str, float], looks: dict[str, int],
           stuck: list[str]) -> None:
    """Ask ``node`` for ``target`` until a miss (at most 2 s after the PURGE's answer)."""
    deadline = answered + 2.0
    status = ""
    while time.perf_counter() < deadline:
        asked = time.perf_counter()
        status = node.ask("GET", target)[1]
        looks[node.name] = looks.get(node.name, 0) + 1
        if not status.startswith("prexy; hit"):
            # Gone by the time this probe was sent (its own miss to the
            # origin is not propagation).
            gone[node.name] = max(0.0, asked - answered) * 1000
            return
    gone[node.name] = float("inf")
    stuck.append(f"{target}: {node.name} still answers {status!r} 2 s after the PURGE's answer")


def purge_rounds(nodes: list[Node], rounds: int, path: str) -> dict[str, Any]:
    """Per round: warm all, PURGE on A, then every node asked until a miss."""
    a = nodes[0]
    answer_ms: list[float] = []
    gone_ms: list[float] = []
    notes = set()
    stuck: list[str] = []
    first_look = 0
    for r in range(rounds):
        target = f"{path}?r={r}"
        for node in nodes:
            node.ask("GET", target)
            status = node.ask("GET", target)[1]
            assert status.startswith("prexy; hit"), (node.name, status)
        sent = time.perf_counter()
        code, _, body = a.ask("PURGE", target)
        answered = time.perf_counter()
        assert code == 200 and b"purged 1" in body, body
        notes.add(body.decode().splitlines()[-1].split(";")[0])
        answer_ms.append((answered - sent) * 1000)
        gone: dict[str, float] = {}
        looks: dict[str, int] = {}

        threads = [threading.Thread(target=_probe, args=(n, target, answered, gone, looks, stuck)) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        gone_ms.append(max(gone.values()))
        if all(n == 1 for n in looks.values()):
            first_look += 1

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    return {
        "rounds": rounds,
        "purge_answer_ms": {"p50": pct(answer_ms, 0.5), "p99": pct(answer_ms, 0.99), "max": max(answer_ms)},
        "gone_everywhere_ms": {"p50": pct(gone_ms, 0.5), "p99": pct(gone_ms, 0.99), "max": max(gone_ms)},
        "notes": sorted(notes),
        "stuck": stuck,
        "first_look_miss": first_look,
    }


def purge_propagation(python: str, env: dict[str, str], origin_port: int, path: str, rounds: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="prexy-bench-cluster-"))
    redis_port = harness.free_port()
    redis = harness.spawn("cluster-redis", [REDIS, "--port", str(redis_port), "--bind", LOCAL, "--save", "",
                                            "--appendonly", "no"], cwd=work)
    out: dict[str, Any] = {}
    try:
        _wait_line(redis, "Ready to accept connections", 30)
        for tag, confirm in (("confirmed", None), ("unconfirmed", 0)):
            nodes = start_fleet(python, env, origin_port, redis_port, work, confirm, tag)
            try:
                out[tag] = purge_rounds(nodes, rounds, path)
            finally:
                for node in nodes:
                    harness.stop(node.child)
    finally:
        harness.stop(redis)
    return out


def _python_origin(work: Path) -> tuple[int, harness.Child]:
    (work / "www").mkdir(parents=True, exist_ok=True)
    (work / "www" / "small.txt").write_text("hello from the origin\n")
    port = harness.free_port()
    child = harness.spawn("cluster-origin", [sys.executable, "-m", "http.server", str(port), "--bind", LOCAL,
                                             "--directory", str(work / "www")], cwd=work)
    harness.wait_port(child, port, timeout=30)
    return port, child


def report(purge: dict[str, Any], hit: dict[str, Any]) -> tuple[str, list[str]]:
    rows = []
    for tag, label in (("confirmed", "PURGE waits for the other nodes' acks (default)"),
                       ("unconfirmed", "PURGE answered once Redis has it (confirm_timeout = 0)")):
        p = purge[tag]
        rows.append([label, f"{p['purge_answer_ms']['p50']:.2f} / {p['purge_answer_ms']['p99']:.2f}",
                     f"{p['gone_everywhere_ms']['p50']:.2f} / {p['gone_everywhere_ms']['p99']:.2f}",
                     f"{p['first_look_miss']} / {p['rounds']}"])
    table = markdown_table(["3 nodes, 1 Redis", "PURGE answer p50 / p99 (ms)",
                            "answer -> gone on every node p50 / p99 (ms)",
                            "rounds with a miss at the first look on all 3"], rows)
    table += "\n\n" + markdown_table(
        ["in-memory cache hit (CPU per hit)", "alone (us)", "with [cluster] (us)", "added (us)",
         "alone vs alone (noise, us)"],
        [["12 B object, LMDB store", f"{hit['alone_us']:.1f}", f"{hit['cluster_us']:.1f}", f"{hit['added_us']:+.2f}",
          f"{hit['control_us']:+.2f}"]],
    )
    worst = max(purge[t]["gone_everywhere_ms"]["p99"] for t in purge)
    targets = [
        f"PURGE gone on all 3 nodes, p99 < 100 ms: {'met' if worst < 100 else 'MISSED'} ({worst:.2f} ms, worst run)",
        f"cluster cost per hit < 5 us: {'met' if hit['added_us'] < 5 else 'MISSED'} ({hit['added_us']:+.2f} us, "
        f"median of the paired differences of {hit['rounds']} interleaved rounds of {hit['hits']} hits; "
        f"the same comparison between two proxies alone: {hit['control_us']:+.2f} us)",
    ]
    return table, targets


def scenario_cluster(bench: Any) -> Any:
    """bench/run.py's ``cluster`` scenario, on the bench's Prexy install."""
    from scenarios import Report

    install = bench.prexy()
    if install is None:
        raise RuntimeError(bench.install_error)
    if not os.path.exists(REDIS):
        raise RuntimeError("needs redis-server (Debian: apt-get install redis-server)")
    origin = bench.origin()
    quick = bench.settings.quick
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    purge = purge_propagation(str(install.python), env, origin.port, "/small.txt", 30 if quick else 200)
    raw = subprocess.run([str(install.python), __file__, "--hit-only"], capture_output=True, text=True,
                         check=True, env=env, cwd=str(harness.REPO))
    hit = json.loads(raw.stdout.strip().splitlines()[-1])
    table, targets = report(purge, hit)
    return Report("Cluster: PURGE across three nodes, cost per hit", table, targets=targets,
                  data={"purge": purge, "hit": hit}, notes=[f"PURGE answers: {purge['confirmed']['notes']}"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hit-only", action="store_true", help="print the in-memory hit figures as JSON")
    args = parser.parse_args()
    if args.hit_only:
        print(json.dumps(hit_cost()))
        return 0
    hit = hit_cost(rounds=13 if args.quick else 31)
    work = Path(tempfile.mkdtemp(prefix="prexy-bench-cluster-origin-"))
    origin_port, origin = _python_origin(work)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(harness.REPO))
    try:
        purge = purge_propagation(sys.executable, env, origin_port, "/small.txt", 30 if args.quick else 200)
    finally:
        harness.stop(origin)
    table, targets = report(purge, hit)
    print(table)
    print()
    for t in targets:
        print(f"- {t}")
    print(json.dumps({"purge": purge, "hit": hit}, indent=1))
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    raise SystemExit(main())
