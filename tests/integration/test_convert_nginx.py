"""``prexy convert nginx`` on the benchmark's nginx + subs_filter configuration
(bench/servers.py, bench/realistic.py's rules), and the converted Prexy,
``twistd prexy --workers 2``, against that very nginx: the same bytes for
the realistic pages.

Needs nginx (``$PREXY_NGINX``, ``nginx`` on ``$PATH`` or /usr/sbin/nginx),
the subs_filter dynamic module (Debian's libnginx-mod-http-subs-filter) and
the realistic pages' Debian packages; skipped without them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import threads

from prexy.nginxconf.convert import convert
from prexy.nginxconf.parser import load

from .conftest import Cleanups
from .test_headerrules_nginx import find_nginx
from .twistd_support import Twistd, free_ports, listening, scratch_dir, stop_process

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"
SUBS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_subs_filter_module.so")
PAGES = (("html-20k", "page.html"), ("jquery", "page.js"), ("bootstrap-css", "page.css"))


def _get(port: int, path: str) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Accept-Encoding": "identity"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return bytes(answer.read())


@pytest.mark.parametrize("count", [10, 100])
@pytest_twisted.inlineCallbacks
def test_converted_prexy_answers_as_nginx(cleanup: Cleanups, count: int) -> Any:
    binary = find_nginx()
    if binary is None or not SUBS_MODULE.exists():
        pytest.skip("no nginx with the subs_filter module")
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    import realistic
    import servers

    try:
        pages = {name: realistic.load_page(name) for name, _ in PAGES}
    except OSError:
        pytest.skip("the realistic pages' Debian packages are not installed")
    d = scratch_dir("prexy-convert-nginx-")
    os.makedirs(os.path.join(d, "www"))
    os.makedirs(os.path.join(d, "tmp"))
    for name, file in PAGES:
        with open(os.path.join(d, "www", file), "wb") as f:
            f.write(pages[name])
    origin, nginx_port, prexy_port = free_ports(3)
    subs = "".join("            " + line + "\n" for line in realistic.subs_filter_directives(count).splitlines())
    origin_server = f"    server {{ listen 127.0.0.1:{origin}; root {d}/www; location / {{ }} }}\n"
    text = servers.nginx_conf(Path(d), nginx_port, servers.proxy_location(subs),
                              http_extra=servers.upstream_block(origin) + origin_server, modules=(SUBS_MODULE,))
    text = text.replace("types { text/html html; text/plain txt; }",
                        "types { text/html html; application/javascript js; text/css css; }")
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(text)
    nginx = subprocess.Popen([binary, "-p", d + "/", "-c", conf, "-e", "stderr", "-g", "daemon off;"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cleanup(lambda: stop_process(nginx))

    result = convert(load(conf), d)
    assert result.sites == ("default",)
    assert "subs_filter" not in result.files["rules/default.rules"].decode()
    out = os.path.join(d, "out")
    for path, data in result.files.items():
        os.makedirs(os.path.dirname(os.path.join(out, path)), exist_ok=True)
        with open(os.path.join(out, path), "wb") as f:
            f.write(data)
    toml = os.path.join(out, "prexy.toml")
    with open(toml) as f:
        config = f.read()
    # the same site beside nginx: its listener moved to a port of its own
    listen = f'listen = ["tcp:{nginx_port}:interface=127.0.0.1:backlog=4096"]'
    assert listen in config and "workers = 1" in config
    with open(toml, "w") as f:
        f.write(config.replace(listen, f'listen = ["tcp:{prexy_port}:interface=127.0.0.1"]')
                .replace("workers = 1", "workers = 2"))
    child = Twistd("--config", toml)
    cleanup(child.stop)
    yield listening(nginx_port)
    yield child.ready()
    for name, file in PAGES:
        theirs = yield threads.deferToThread(_get, nginx_port, "/" + file)
        ours = yield threads.deferToThread(_get, prexy_port, "/" + file)
        assert theirs != pages[name]  # subs_filter did rewrite it
        assert ours == theirs, name
