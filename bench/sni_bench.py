"""The SNI figure: a TLS handshake through the server-name callback
against a one-certificate listener's handshake.

Two ``twistd -n prexy`` processes (one worker each, this interpreter and
checkout) run side by side on loopback, both with an ``ssl:`` listener and
the same default certificate:

* *one certificate*: one site without a certificate of its own: every
  handshake stays on the listener's context (the callback finds the site
  and keeps it);
* *SNI*: ``--sites`` sites, each with its own certificate file (a test CA,
  EC P-256 leaves with their names in subjectAltName): every handshake
  looks its name up and switches to that site's context.

Each round times ``--handshakes`` handshakes on new TCP connections
against one server then the other (the order alternates by round), with
SNI names drawn across the sites, and keeps each round's median; the
figure is the median of the rounds, and the ratio SNI / one certificate
(target: within 1.1x).  The first handshake against each server is checked
to present the expected certificate.  Resident memory of each process
family is printed beside.

``python bench/sni_bench.py [--sites N] [--rounds R] [--handshakes H]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.pki import TestCA  # noqa: E402

TWISTD = "import sys; sys.argv[0] = 'twistd'; from twisted.scripts.twistd import run; run()"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_setup(work: Path, sites: int) -> tuple[str, str]:
    """The two configurations' paths (one certificate, SNI)."""
    ca = TestCA()
    tls = work / "tls"
    tls.mkdir()
    ca.issue("default.test").write(str(tls), "default")
    server = "[server]\nlisten = ['ssl:{port}:interface=127.0.0.1']\naccess_log = 'off'\nworkers = 1\n" \
             "tls_certificate = 'tls/default.crt'\ntls_key = 'tls/default.key'\n"
    one = work / "one.toml"
    one.write_text(server.format(port=free_port()) +
                   "[sites.s0]\nupstream = 'http://127.0.0.1:9'\nhosts = ['s0.test']\n")
    sni_sites = []
    for i in range(sites):
        ca.issue(f"s{i}.test").write(str(tls), f"s{i}")
        sni_sites.append(f"[sites.s{i}]\nupstream = 'http://127.0.0.1:9'\nhosts = ['s{i}.test']\n"
                         f"tls_certificate = 'tls/s{i}.crt'\ntls_key = 'tls/s{i}.key'\n")
    sni = work / "sni.toml"
    sni.write_text(server.format(port=free_port()) + "".join(sni_sites))
    return str(one), str(sni)


def port_of(config: str) -> int:
    text = Path(config).read_text()
    return int(text.split("ssl:", 1)[1].split(":", 1)[0])


def start(config: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "prexy", "--config", config],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )


def client_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def handshake(context: ssl.SSLContext, port: int, name: str) -> tuple[float, str]:
    """Seconds for one TCP connect and TLS handshake with SNI ``name``; the
    certificate's subject."""
    started = time.perf_counter()
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with context.wrap_socket(raw, server_hostname=name) as tls:
        seconds = time.perf_counter() - started
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    subject = x509.load_der_x509_certificate(der).subject.rfc4514_string() if der else ""
    return seconds, subject


def wait_ready(child: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    context = client_context()
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"twistd exited {child.returncode}:\n{log.read_text()[-3000:]}")
        try:
            handshake(context, port, "s0.test")
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"not ready in {timeout} s:\n{log.read_text()[-3000:]}")


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its children, MiB."""
    pids = [pid]
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                pids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        os.killpg(child.pid, 15)
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            child.wait()


def measure(sites: int, rounds: int, handshakes: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="prexy-bench-sni-"))
    children: list[subprocess.Popen[bytes]] = []
    try:
        one, sni = write_setup(work, sites)
        servers = {"one": (one, port_of(one)), "sni": (sni, port_of(sni))}
        for label, (config, port) in servers.items():
            log = work / f"{label}.log"
            child = start(config, log)
            children.append(child)
            wait_ready(child, port, log)
        context = client_context()
        _, subject = handshake(context, servers["one"][1], "s0.test")
        assert subject == "CN=default.test", subject
        _, subject = handshake(context, servers["sni"][1], f"s{sites - 1}.test")
        assert subject == f"CN=s{sites - 1}.test", subject
        rng = random.Random(32)
        medians: dict[str, list[float]] = {"one": [], "sni": []}
        for r in range(rounds):
            order = ["one", "sni"] if r % 2 == 0 else ["sni", "one"]
            for label in order:
                port = servers[label][1]
                times = []
                for _ in range(handshakes):
                    name = "s0.test" if label == "one" else f"s{rng.randrange(sites)}.test"
                    times.append(handshake(context, port, name)[0])
                medians[label].append(statistics.median(times))
        result = {label: statistics.median(values) for label, values in medians.items()}
        return {
            "sites": sites, "rounds": rounds, "handshakes": handshakes,
            "one_ms": result["one"] * 1e3, "sni_ms": result["sni"] * 1e3,
            "ratio": result["sni"] / result["one"],
            "rounds_ms": {label: [v * 1e3 for v in values] for label, values in medians.items()},
            "rss_mib": {"one": rss_mib(children[0].pid), "sni": rss_mib(children[1].pid)},
        }
    finally:
        for child in children:
            stop(child)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=200, help="sites with their own certificate (default 200)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--handshakes", type=int, default=100, help="per round and server")
    args = parser.parse_args()
    figures = measure(args.sites, args.rounds, args.handshakes)
    print("| listener | handshake (median of round medians) | RSS, master + worker |")
    print("|---|---|---|")
    print(f"| one certificate | {figures['one_ms']:.3f} ms | {figures['rss_mib']['one']:.0f} MiB |")
    print(f"| SNI, {figures['sites']} certificates | {figures['sni_ms']:.3f} ms | {figures['rss_mib']['sni']:.0f} MiB |")
    verdict = "within" if figures["ratio"] <= 1.1 else "over"
    print(f"\nratio SNI / one certificate: {figures['ratio']:.3f}x ({verdict} the 1.1x target)")
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
