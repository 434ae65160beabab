"""Two ``twistd prexy --workers 2`` nodes with one ``redis-server`` and
Debian's ``pebble``: a ``tls = "acme"`` site with a listed host on both
nodes is ordered once across the fleet (the nodes' order counters sum to
1), and both nodes serve the same certificate (same serial number, from a
Python TLS client verifying it against pebble's root).

pebble validates HTTP-01 on one port; a small front in its place answers
only when every node answers the challenge alike, as a load balancer
sending the CA's request to any node needs: the ordering node shared its
answer through Redis before it asked the CA to validate."""

from __future__ import annotations

import os
from typing import Any

import pytest
import pytest_twisted
from cryptography import x509
from twisted.internet import defer, reactor, threads
from twisted.internet.error import ConnectionRefusedError
from twisted.web import resource, server
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers

from tests.pki import TestCA

from .conftest import Cleanups
from .origin import Origin, origin_site
from .pebble import CHALLTESTSRV, PEBBLE, start_pebble
from .test_acme_twistd import fetch, handshake
from .test_cluster import REDIS, Redis
from .twistd_support import Twistd, free_port, scratch_dir

pytestmark = [
    pytest.mark.skipif(
        PEBBLE is None or CHALLTESTSRV is None, reason="needs pebble and pebble-challtestsrv (Debian: apt-get install pebble)"
    ),
    pytest.mark.skipif(REDIS is None, reason="needs redis-server (Debian: apt-get install redis-server)"),
    pytest.mark.filterwarnings("ignore:Using readBody with a transport"),
]


class Front(resource.Resource):
    """Answers a challenge request only when every node that is up (accepts
    connections) answers it alike, as the CA's request could reach any of
    them behind a load balancer: the answer, else 404."""

    isLeaf = True

    def __init__(self, ports: list[int]) -> None:
        super().__init__()
        self.ports = ports
        self.agent = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))
        self.answered: list[tuple[bytes, list[int]]] = []

    def render_GET(self, request: Any) -> Any:
        @defer.inlineCallbacks
        def ask() -> Any:
            codes, bodies = [], set()
            for port in self.ports:
                try:
                    response = yield self.agent.request(
                        b"GET", b"http://127.0.0.1:%d%s" % (port, request.uri),
                        Headers({b"host": [request.getHeader(b"host") or b"x"]}),
                    )
                except ConnectionRefusedError:
                    continue  # a node not started yet: out of the balancer
                bodies.add((yield readBody(response)))
                codes.append(response.code)
            self.answered.append((request.uri, codes))
            if codes and codes == [200] * len(codes) and len(bodies) == 1:
                request.write(bodies.pop())
            else:
                request.setResponseCode(404)
            request.finish()

        ask().addErrback(lambda f: (request.setResponseCode(502), request.finish()))
        return server.NOT_DONE_YET


@pytest_twisted.inlineCallbacks
def test_two_nodes_order_once(cleanup: Cleanups) -> Any:
    redis = Redis(cleanup)
    yield redis.start()
    directory = scratch_dir("prexy-acme-fleet-")
    TestCA().issue("default.test").write(directory, "default")
    front_port = free_port()
    nodes = {n: (free_port(), free_port(), free_port()) for n in "ab"}
    front = Front([p[0] for p in nodes.values()])
    listening = reactor.listenTCP(front_port, server.Site(front), interface="127.0.0.1")
    cleanup(listening.stopListening)
    pebble = yield start_pebble(cleanup, http_port=front_port, tls_port=free_port())
    upstream = reactor.listenTCP(0, origin_site(Origin()), interface="127.0.0.1")
    cleanup(upstream.stopListening)
    children = {}
    for name, (plain, tls, admin) in nodes.items():
        config = os.path.join(directory, f"{name}.toml")
        with open(config, "w") as f:
            f.write(
                f"[server]\nlisten = ['tcp:{plain}:interface=127.0.0.1', 'ssl:{tls}:interface=127.0.0.1']\n"
                f"admin = 'tcp:{admin}:interface=127.0.0.1'\naccess_log = 'off'\n"
                "tls_certificate = 'default.crt'\ntls_key = 'default.key'\n"
                f"[acme]\ndirectory = '{pebble.directory}'\nca_bundle = '{pebble.ca_bundle}'\n"
                f"storage = 'acme-{name}'\nchallenges = ['http-01']\n"
                f"[cluster]\nredis = '{redis.url}'\nnode = '{name}'\nkey = 'acmefleet'\n"
                f"[sites.shop]\nupstream = 'http://127.0.0.1:{upstream.getHost().port}'\n"
                "hosts = ['shop.test']\ntls = 'acme'\n"
            )
        child = Twistd("--config", config, "--workers", "2")
        cleanup(child.stop)
        children[name] = child
    stored = [c.notified("STATUS=ACME certificate stored: shop.test", 90) for c in children.values()]
    yield defer.gatherResults([c.ready(60) for c in children.values()])
    yield defer.gatherResults(stored)
    root = yield threads.deferToThread(fetch_bytes, pebble.roots_url, pebble.ca_bundle)
    root_file = os.path.join(directory, "pebble-root.pem")
    with open(root_file, "wb") as f:
        f.write(root)
    serials: dict[str, set[int]] = {}
    orders = 0
    for name, (_plain, tls, admin) in nodes.items():
        serials[name] = set()
        for _ in range(3):
            cert, answer = yield threads.deferToThread(handshake, tls, "shop.test", root_file)
            assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName) == ["shop.test"]
            assert answer.endswith(b"hello world!"), answer
            serials[name].add(cert.serial_number)
        metrics = yield threads.deferToThread(fetch, f"http://127.0.0.1:{admin}/metrics")
        line = next(ln for ln in metrics.splitlines() if ln.startswith("prexy_acme_orders_total "))
        orders += int(line.split()[1])
    acme_lines = {n: [ln for ln in c.output().splitlines() if "ACME" in ln or "cluster" in ln] for n, c in children.items()}
    assert orders == 1, (acme_lines, front.answered)
    assert len(serials["a"]) == 1 and serials["a"] == serials["b"], serials
    taken = sum(c.output().count("ACME: certificate for shop.test taken from the fleet") for c in children.values())
    assert taken == 1
    assert front.answered and all(set(codes) == {200} for _uri, codes in front.answered), front.answered


def fetch_bytes(url: str, ca_bundle: str) -> bytes:
    import requests

    return requests.get(url, verify=ca_bundle, timeout=5).content
