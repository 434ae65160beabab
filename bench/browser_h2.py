"""A real browser through Prexy over HTTP/2 and over HTTP/1.1.

Debian's headless Chromium, driven over its DevTools protocol, opens the
first of ``--pages`` pages through ``twistd prexy`` on TLS; each page has
``--assets`` assets (images, stylesheets and scripts, the text ones
rewritten by a rule; the origin sends the 20 KB images at 20 KB/s) and a
script in its head that navigates to the next page after 100 or 300 ms, so
every page is left while its images are still loading: the browser cancels those streams
(RST_STREAM over HTTP/2), as it does when a person clicks on.  The same walk runs with ``[server] http2 = true`` and
``false``, alternating, ``--rounds`` times each.  Printed per run: the
walk's time, the requests in the access log by protocol and status, and
any line of Prexy's log that mentions a GOAWAY, a flood or an error (a
false positive of the rapid-reset cap would show there, and the walk
would stall).

Run it with the Python that has Prexy installed (the development venv)::

    python bench/browser_h2.py [--pages 40] [--assets 100] [--rounds 2]

It installs ``chromium`` from Debian when it is missing (as root), serves
the pages from a private nginx and needs ``openssl`` for the certificate
and the ``websockets`` package (the test extra) for the DevTools socket.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import servers  # noqa: E402
from harness import LOCAL, WORK  # noqa: E402

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63f8cfc0f01f0005000201ab3ba7d90000000049454e44ae426082"
)
ORIGIN_HOST = "www.origin-shop.com"
RULES = f"replace_filter_types text/html text/css application/javascript;\n" \
        f"replace_filter '{re.escape(ORIGIN_HOST)}' 'www.clone-shop.nl' gi;\n"
#: The origin sends images at 20 KB/s each (nginx limit_rate): a page is
#: left while most of its images are still coming.
SLOW_IMAGES = "        location /img/ { limit_rate 20k; }\n"
#: An access-log line's protocol and status.
REQUEST = re.compile(rb'"[A-Z]+ \S+ (HTTP/[0-9.]+)" ([0-9]{3}) ')
#: Lines of Prexy's log that would mean trouble for a browser.
TROUBLE = re.compile(rb"goaway|calm|flood|too many|closed:|traceback|error", re.IGNORECASE)


def write_site(www: Path, pages: int, assets: int) -> None:
    """``pages`` pages of ``assets`` assets each; page k moves on to k+1."""
    (www / "img").mkdir(parents=True, exist_ok=True)
    images, styles, scripts = assets * 6 // 10, assets * 2 // 10, assets - assets * 8 // 10
    for k in range(images):  # 20 KB each, sent slowly (SLOW_IMAGES): in flight when the page is left
        (www / "img" / f"{k}.png").write_bytes(PNG + bytes(20_000))
    for k in range(styles):
        (www / f"s{k}.css").write_text(f".c{k} {{ background: url(//{ORIGIN_HOST}/b{k}.png) }}\n" * 200)
    for k in range(scripts):
        (www / f"j{k}.js").write_text(f"var site{k} = 'https://{ORIGIN_HOST}/';\n" * 200)
    for n in range(pages):
        tags = "".join(f'<link rel="stylesheet" href="/s{k}.css?p={n}">' for k in range(styles))
        body = "".join(f'<script src="/j{k}.js?p={n}"></script>' for k in range(scripts))
        body += "".join(f'<img src="/img/{k}.png?p={n}">' for k in range(images))
        if n + 1 < pages:
            delay = 100 if n % 2 else 300
            tags += f'<script>setTimeout(function () {{ location.href = "/p{n + 1}.html"; }}, {delay});</script>'
        else:
            body += '<script>document.title = "done";</script>'
        (www / f"p{n}.html").write_text(
            f"<html><head><title>page {n} {ORIGIN_HOST}</title>{tags}</head>"
            f"<body><p>{ORIGIN_HOST}, page {n}</p>{body}</body></html>"
        )


def certificate(where: Path) -> tuple[Path, Path]:
    key, cert = where / "key.pem", where / "cert.pem"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "2", "-subj", "/CN=localhost"], check=True, capture_output=True, timeout=60)
    return key, cert


def ensure_chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SystemExit("chromium is missing: apt-get install chromium")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env, timeout=1800)
    return shutil.which("chromium") or "/usr/bin/chromium"


async def walk(chromium: str, url: str, profile: Path, timeout: float) -> tuple[float, str]:
    """Open ``url`` in a fresh headless Chromium and wait until the last
    page says it is done; (seconds, where it ended)."""
    shutil.rmtree(profile, ignore_errors=True)
    port = harness.free_port()
    browser = subprocess.Popen(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--ignore-certificate-errors", f"--remote-debugging-port={port}",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    import websockets

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{LOCAL}:{port}/json", timeout=5) as answer:
                    tabs = json.load(answer)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        page = next(t for t in tabs if t["type"] == "page")
        async with websockets.connect(page["webSocketDebuggerUrl"], max_size=None) as ws:
            ids = iter(range(1, 1 << 30))

            async def call(method: str, **params: object) -> dict[str, object]:
                my = next(ids)
                await ws.send(json.dumps({"id": my, "method": method, "params": params}))
                while True:
                    message = json.loads(await ws.recv())
                    if message.get("id") == my:
                        return message

            began = time.monotonic()
            await call("Page.navigate", url=url)
            where = ""
            while time.monotonic() - began < timeout:
                answer = await call("Runtime.evaluate", expression="document.title + ' ' + location.pathname")
                where = str(answer.get("result", {}).get("result", {}).get("value", ""))  # type: ignore[union-attr]
                if where.startswith("done"):
                    return time.monotonic() - began, where
                await asyncio.sleep(0.1)
            return time.monotonic() - began, f"stalled at {where!r}"
    finally:
        browser.terminate()
        try:
            browser.wait(10)
        except subprocess.TimeoutExpired:
            browser.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=40)
    parser.add_argument("--assets", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--twistd", default=str(Path(sys.executable).with_name("twistd")))
    parser.add_argument("--max-resets", type=int, default=None,
                        help="[http2] max_resets for the run (default: Prexy's); a low one shows the cap at work")
    args = parser.parse_args()
    harness.install_cleanup()
    chromium = ensure_chromium()
    base = WORK / "browser-h2"
    www = base / "www"
    shutil.rmtree(www, ignore_errors=True)
    write_site(www, args.pages, args.assets)
    key, cert = certificate(base)
    (base / "site.rules").write_text(RULES)
    origin = servers.start_nginx("browser-h2-origin", servers.origin_body(www) + SLOW_IMAGES)
    rows = []
    try:
        for round_ in range(args.rounds):
            for http2 in (True, False):
                name = f"browser-h2-prexy-{'h2' if http2 else 'h1'}"
                port = harness.free_port()
                run = base / name
                run.mkdir(parents=True, exist_ok=True)
                log = run / "access.log"
                log.unlink(missing_ok=True)
                (run / "prexy.toml").write_text(
                    f'[server]\nlisten = ["ssl:{port}:interface={LOCAL}"]\nworkers = 1\n'
                    f'http2 = {"true" if http2 else "false"}\n'
                    f'tls_certificate = "{cert}"\ntls_key = "{key}"\naccess_log = "{log}"\n'
                    + (f"[http2]\nmax_resets = {args.max_resets}\n" if args.max_resets else "")
                    + f'[sites.shop]\nupstream = "http://{LOCAL}:{origin.port}"\nrules = ["{base}/site.rules"]\n')
                child = harness.spawn(name, [args.twistd, "-n", "--pidfile=", "prexy", "--config", str(run / "prexy.toml")],
                                      cwd=run, env=dict(os.environ, PYTHONUNBUFFERED="1"))
                try:
                    harness.wait_port(child, port, timeout=120)
                    seconds, where = asyncio.run(walk(chromium, f"https://{LOCAL}:{port}/p0.html", run / "profile",
                                                      args.timeout))
                finally:
                    harness.stop(child)
                lines = log.read_bytes().splitlines() if log.exists() else []
                found = [REQUEST.search(line) for line in lines]
                protocols = Counter(m.group(1).decode() if m else "?" for m in found)
                statuses = Counter(m.group(2).decode() if m else "?" for m in found)
                trouble = [t.decode("utf-8", "replace").strip()[:160]
                           for t in child.logfile.read_bytes().splitlines() if TROUBLE.search(t)]
                rows.append([str(round_ + 1), "HTTP/2" if http2 else "HTTP/1.1", f"{seconds:.1f} s", where,
                             ", ".join(f"{k} {v}" for k, v in sorted(protocols.items())),
                             ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())),
                             str(len(trouble)) + (f" ({trouble[0]})" if trouble else "")])
                harness.log(" | ".join(rows[-1]))
    finally:
        harness.stop(origin.child)
    print(harness.markdown_table(
        ["round", "Prexy", "walk", "ended", "requests by protocol", "statuses", "trouble lines in Prexy's log"], rows))


if __name__ == "__main__":
    main()
