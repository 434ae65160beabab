"""Map files go live on reload, as rules files do (and as nginx's maps do):
through ``twistd prexy`` with a pool of workers and in one process, a
changed map file is not taken until a reload; a reload takes it, validated
first; a broken one is refused with its file and line and the old map keeps
serving."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from .conftest import Cleanups
from .origin import Origin, origin_site
from .test_service import RawClient, connect
from .twistd_support import Twistd, free_port


@defer.inlineCallbacks
def request(port: int, raw: bytes) -> Any:
    client = RawClient(raw)
    yield connect(port, client)
    return bytes(client.data)


@pytest.mark.parametrize("workers", ["2", "0"])
@pytest_twisted.inlineCallbacks
def test_map_changes_go_live_on_reload(workers: str, cleanup: Cleanups) -> Any:
    """A changed map is not served before a reload, is after it (SIGHUP for
    the pool, POST /reload for both); a broken map is refused on reload
    (409 naming the file and line) and the old one keeps serving."""
    origin_port = reactor.listenTCP(0, origin_site(Origin()), interface="127.0.0.1")
    cleanup(origin_port.stopListening)
    folder = tempfile.mkdtemp(prefix="prexy-maps-")
    cleanup(shutil.rmtree, folder, True)
    map_path = os.path.join(folder, "old.map")

    def write_map(text: str, stamp: float) -> None:
        with open(map_path, "w") as f:
            f.write(text)
        os.utime(map_path, (stamp, stamp))  # a different mtime, whatever the clock

    write_map("/old /new-one;\n", 1_000_000)
    port, admin = free_port(), free_port()
    child = Twistd(
        "--listen", f"tcp:{port}:interface=127.0.0.1", "--upstream", f"http://127.0.0.1:{origin_port.getHost().port}",
        "--map", map_path, "--workers", workers, "--admin", f"tcp:{admin}:interface=127.0.0.1",
    )
    cleanup(child.stop)
    yield child.ready()

    @defer.inlineCallbacks
    def location() -> Any:
        raw = yield request(port, b"GET /old HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        for line in raw.split(b"\r\n"):
            if line.lower().startswith(b"location: "):
                return line[10:]
        return raw[:200]

    def reload() -> Any:
        return request(admin, b"POST /reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    assert (yield location()) == b"http://t/new-one"
    write_map("/old /new-two;\n", 2_000_000)
    # Not taken without a reload: no timer of the service reads the file
    # (tests/test_reload.py lets an hour pass on a fake clock to show it).
    assert (yield location()) == b"http://t/new-one", child.output()

    if workers != "0":  # the pool's master reloads on SIGHUP and says READY=1 when done
        reloaded = child.notified("READY=1")
        os.kill(child.process.pid, signal.SIGHUP)
        yield reloaded
    else:
        answer = yield reload()
        assert answer.startswith(b"HTTP/1.1 200"), answer
    assert (yield location()) == b"http://t/new-two", child.output()

    write_map("/old /new-three;\n~^/(broken /x;\n", 3_000_000)
    answer = yield reload()
    assert answer.startswith(b"HTTP/1.1 409"), answer
    assert f"{map_path}:2:".encode() in answer, answer
    assert (yield location()) == b"http://t/new-two"

    write_map("/old /new-four;\n", 4_000_000)
    answer = yield reload()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert (yield location()) == b"http://t/new-four"
