"""The figure for stored ACME certificates: start-up and memory with
10,000 of them, and a handshake served from ACME storage.

Two configurations of ``twistd -n prexy --workers 2`` (this interpreter and
checkout) with the same ``--sites`` sites of ``--hosts`` listed names each
(10,000 names by default: 1,000 sites of 10 names):

* *none*: no ``[acme]``, the sites without ``tls``: what a node with no
  ACME certificate pays;
* *acme*: ``[acme]`` (a directory nobody answers: every certificate is
  stored and valid, so none is ordered) and every site ``tls = "acme"``,
  the storage filled with a certificate per name (EC P-256 leaves signed
  by a test CA, made once per run in a temporary directory, removed at
  the end).

Each round starts one then the other (the order alternates) and times the
start to the master's ``READY=1`` (sd_notify), then reads each worker's
and the master's resident memory; the figures are the medians of the
rounds.  Targets: start-up at most 2 s slower, at most 100 MB more per
worker.

Then, on the *acme* server (plus one site with a static certificate
file), handshakes on new connections: *first* (a name never asked, read
from storage), *memo* (names asked several times already: from the
worker's memo), and *static* (the site with its own file), the last two
interleaved.

``python bench/acme_bench.py [--sites N] [--hosts H] [--rounds R] [--handshakes K] [--challenges C]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402
from sni_bench import TWISTD, client_context, free_port, handshake, stop  # noqa: E402

from tests.pki import TestCA  # noqa: E402


def name_of(site: int, host: int) -> str:
    return f"h{host}.s{site}.test"


def fill_storage(storage: Path, names: list[str]) -> float:
    """A certificate file per name in ``storage/certs`` (as
    prexy.acme.storage writes them: key, then leaf and CA); seconds taken."""
    started = time.perf_counter()
    certs = storage / "certs"
    certs.mkdir(parents=True, mode=0o700)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench ACME CA")])
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=90))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        path = certs / f"{name}.pem"
        path.write_bytes(key_pem + leaf.public_bytes(serialization.Encoding.PEM) + ca_pem)
        path.chmod(0o600)
    return time.perf_counter() - started


def write_configs(work: Path, sites: int, hosts: int, challenges: str) -> tuple[Path, Path, int, int]:
    """The two configurations (none, acme) and their TLS ports."""
    TestCA().issue("default.test").write(str(work), "default")
    TestCA().issue("static.test").write(str(work), "static")
    paths, ports = [], []
    for label in ("none", "acme"):
        port = free_port()
        text = (
            f"[server]\nlisten = ['ssl:{port}:interface=127.0.0.1', 'tcp:{free_port()}:interface=127.0.0.1']\n"
            "access_log = 'off'\nworkers = 2\ntls_certificate = 'default.crt'\ntls_key = 'default.key'\n"
        )
        if label == "acme":
            text += f"[acme]\ndirectory = 'https://127.0.0.1:9/dir'\nstorage = 'storage'\nchallenges = {challenges.split(',')!r}\n"
        text += ("[sites.static]\nupstream = 'http://127.0.0.1:9'\nhosts = ['static.test']\n"
                 "tls_certificate = 'static.crt'\ntls_key = 'static.key'\n")
        tls = "tls = 'acme'\n" if label == "acme" else ""
        for s in range(sites):
            names = [name_of(s, h) for h in range(hosts)]
            text += f"[sites.s{s}]\nupstream = 'http://127.0.0.1:9'\nhosts = {names!r}\n{tls}"
        path = work / f"{label}.toml"
        path.write_text(text)
        paths.append(path)
        ports.append(port)
    return paths[0], paths[1], ports[0], ports[1]


def start_ready(config: Path, log: Path, timeout: float = 300.0) -> tuple[subprocess.Popen[bytes], float]:
    """A started server and the seconds from its start to READY=1."""
    notify = str(config.parent / f"notify-{config.stem}-{time.monotonic_ns()}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify)
    sock.settimeout(1.0)
    env = dict(os.environ, PYTHONPATH=str(REPO), NOTIFY_SOCKET=notify)
    try:
        started = time.perf_counter()
        with log.open("wb") as out:
            child = subprocess.Popen(
                [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "prexy", "--config", str(config)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                cwd=str(config.parent),
            )
        deadline = started + timeout
        while time.perf_counter() < deadline:
            if child.poll() is not None:
                raise RuntimeError(f"twistd exited {child.returncode}:\n{log.read_text()[-3000:]}")
            try:
                data = sock.recv(4096)
            except TimeoutError:
                continue
            if b"READY=1" in data.split(b"\n"):
                return child, time.perf_counter() - started
        stop(child)
        raise RuntimeError(f"no READY=1 in {timeout} s:\n{log.read_text()[-3000:]}")
    finally:
        sock.close()
        os.unlink(notify)


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def workers_of(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def handshakes(port: int, names: list[str]) -> list[float]:
    context = client_context()
    return [handshake(context, port, name)[0] for name in names]


def measure(sites: int, hosts: int, rounds: int, count: int, challenges: str = "http-01,tls-alpn-01") -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="prexy-bench-acme-"))
    children: list[subprocess.Popen[bytes]] = []
    try:
        names = [name_of(s, h) for s in range(sites) for h in range(hosts)]
        made = fill_storage(work / "storage", names)
        per_file = statistics.mean(p.stat().st_size for p in list((work / "storage" / "certs").iterdir())[:100])
        none, acme, _none_port, acme_port = write_configs(work, sites, hosts, challenges)
        ready: dict[str, list[float]] = {"none": [], "acme": []}
        worker_rss: dict[str, list[float]] = {"none": [], "acme": []}
        master_rss: dict[str, list[float]] = {"none": [], "acme": []}
        for r in range(rounds):
            for label in (["none", "acme"] if r % 2 == 0 else ["acme", "none"]):
                config = none if label == "none" else acme
                child, seconds = start_ready(config, work / f"{label}-{r}.log")
                children.append(child)
                time.sleep(0.5)  # the workers' last allocations after READY
                ready[label].append(seconds)
                pids = workers_of(child.pid)
                worker_rss[label].append(statistics.mean(rss_mib(p) for p in pids) if pids else 0.0)
                master_rss[label].append(rss_mib(child.pid))
                stop(child)
                children.remove(child)
        figures: dict[str, Any] = {
            "sites": sites, "hosts": hosts, "names": len(names), "rounds": rounds,
            "storage_fill_s": made, "cert_file_bytes": per_file,
            "ready_s": {k: statistics.median(v) for k, v in ready.items()},
            "ready_rounds_s": ready,
            "worker_rss_mib": {k: statistics.median(v) for k, v in worker_rss.items()},
            "master_rss_mib": {k: statistics.median(v) for k, v in master_rss.items()},
        }
        # Handshakes on the acme server.
        child, _ = start_ready(acme, work / "acme-handshakes.log")
        children.append(child)
        time.sleep(3.0)  # the master's cooperative read of the stored certificates
        fresh = names[::max(1, len(names) // count)][:count]
        first = handshakes(acme_port, fresh)
        for _ in range(3):  # each worker asked each name
            handshakes(acme_port, fresh)
        # Interleaved, one of each in turn: the machine's load moves both alike.
        memo, static = [], []
        for name in fresh:
            memo += handshakes(acme_port, [name])
            static += handshakes(acme_port, ["static.test"])
        figures["handshake_ms"] = {
            "first": statistics.median(first) * 1e3,
            "memo": statistics.median(memo) * 1e3,
            "static": statistics.median(static) * 1e3,
        }
        figures["master_rss_after_load_mib"] = rss_mib(child.pid)
        figures["worker_rss_after_handshakes_mib"] = [rss_mib(p) for p in workers_of(child.pid)]
        return figures
    finally:
        for child in children:
            stop(child)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=10, help="listed names per site")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--handshakes", type=int, default=100)
    parser.add_argument("--challenges", default="http-01,tls-alpn-01", help="[acme] challenges, comma-separated")
    args = parser.parse_args()
    f = measure(args.sites, args.hosts, args.rounds, args.handshakes, args.challenges)
    none, acme = f["ready_s"]["none"], f["ready_s"]["acme"]
    wn, wa = f["worker_rss_mib"]["none"], f["worker_rss_mib"]["acme"]
    print(f"{f['names']} names ({f['sites']} sites x {f['hosts']}), {f['rounds']} rounds, medians;"
          f" storage filled in {f['storage_fill_s']:.1f} s, {f['cert_file_bytes']:.0f} bytes a file")
    print("| configuration | start to READY=1 | RSS per worker | RSS master |")
    print("|---|---|---|---|")
    print(f"| no ACME, empty storage | {none:.2f} s | {wn:.0f} MiB | {f['master_rss_mib']['none']:.0f} MiB |")
    print(f"| ACME, {f['names']} stored | {acme:.2f} s | {wa:.0f} MiB | {f['master_rss_mib']['acme']:.0f} MiB |")
    print(f"\nstart-up {acme - none:+.2f} s ({'met' if acme - none <= 2 else 'missed'}: at most 2 s);"
          f" RSS per worker {wa - wn:+.1f} MiB ({'met' if wa - wn <= 100 else 'missed'}: at most 100 MB)")
    h = f["handshake_ms"]
    print(f"handshake (median): first, from storage {h['first']:.2f} ms; later, from the memo {h['memo']:.2f} ms;"
          f" static site certificate {h['static']:.2f} ms (memo / static {h['memo'] / h['static']:.2f}x)")
    print(json.dumps(f, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
