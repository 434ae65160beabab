"""prexy.nginxconf.parser against nginx itself: the arguments it reads are
the ones nginx reads.

Each token under test is the text of a ``return 200 TOKEN;`` in its own
``location``; nginx answers with the argument as it read it, which must be
the argument :func:`~prexy.nginxconf.parser.parse` gives.  The tokens are
hand-written ones (backslashes outside quotes, escapes in both quotes,
``#`` and ``}`` inside a token) and random words written by
:func:`~prexy.nginxconf.parser.dump`, so its quoting is checked too.

nginx comes from ``$PREXY_NGINX``, ``nginx`` on ``$PATH`` or
``/usr/sbin/nginx``; skipped only without one.
"""

from __future__ import annotations

import os
import random
import subprocess
import urllib.request
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import threads

from prexy.nginxconf.parser import Directive, dump, parse

from .test_headerrules_nginx import find_nginx
from .twistd_support import free_port, listening, scratch_dir, stop_process

WRITTEN = [
    r"x\ y", r"\;b", r'"t\tn\r"', r"'it\'s'", r'"back\\slash"', r'"\d+"', "a#b", "'x # y'",
    r'"q\"q"', r'a\"b', r"'\\\''", r'"a\xb"', "'a}b'", "x}y", '""', "'a\nb'", "(a)",
]


def _random_words(count: int) -> list[str]:
    rng = random.Random(36)
    alphabet = "ab \t\n\\\"';{}#()x~^*é"
    return [dump((Directive("w", ("".join(rng.choice(alphabet) for _ in range(rng.randrange(12))),),
                            None, "", 0),))[2:-2] for _ in range(count)]


@pytest_twisted.inlineCallbacks
def test_arguments_are_the_ones_nginx_reads() -> Any:
    nginx = find_nginx()
    if nginx is None:
        pytest.skip("nginx is not installed")
    d = scratch_dir("prexy-nginxconf-")
    port = free_port()
    tokens = WRITTEN + _random_words(60)
    locations = "".join(f"location = /{i} {{ return 200 {t}; }}\n" for i, t in enumerate(tokens))
    temp = " ".join(f"{x}_temp_path {d};" for x in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    text = (f"daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;\n"
            f"error_log {d}/error.log;\nevents {{ worker_connections 64; }}\n"
            f"http {{ access_log off; {temp}\nserver {{ listen 127.0.0.1:{port};\n{locations}}} }}\n")
    path = os.path.join(d, "nginx.conf")
    with open(path, "w") as f:
        f.write(text)
    http = next(x for x in parse(text, path) if x.name == "http")
    server = next(x for x in http.block or () if x.name == "server")
    ours = [(loc.block or ())[0].args[1] for loc in server.block or () if loc.name == "location"]
    assert len(ours) == len(tokens)

    process = subprocess.Popen([nginx, "-p", d + "/", "-c", path],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield listening(port)

        def fetch_all() -> list[str]:
            return [urllib.request.urlopen(f"http://127.0.0.1:{port}/{i}", timeout=10).read().decode("utf-8")
                    for i in range(len(tokens))]

        theirs = yield threads.deferToThread(fetch_all)
    finally:
        stop_process(process)
    for token, mine, nginx_read in zip(tokens, ours, theirs, strict=True):
        assert mine == nginx_read, token
