"""The systemd install steps at the top of ``conf/prexy.service``, run as
written in a scratch root (a temporary folder standing for ``/``).

The steps are read from the unit's comment, so the documentation and this
test cannot drift apart.  Each is run as written, with absolute paths under
/etc, /opt and /usr taken inside the scratch root (and ``ROOT`` set, which
``conf/install.sh`` installs under), except:

* ``python3 -m venv /opt/prexy && /opt/prexy/bin/pip install .``: pip
  would download the dependencies, which a test cannot; a virtualenv made
  in the scratch root sees this test run's packages and checkout instead
  (a ``.pth`` file) and gets the ``twistd`` script pip would write;
* ``useradd``: no user is made in a scratch root;
* ``systemctl daemon-reload && systemctl enable --now ...``: there is no
  systemd to talk to, so ``systemd-analyze verify`` checks the installed
  units (every ``Exec*`` program must exist in the scratch root), and the
  unit's own commands are run: ``ExecStartPre`` (``--check``) on the
  installed files, ``ExecStart`` with the socket ``prexy.socket`` names
  passed as systemd passes it, and ``ExecReload``, which must succeed, and
  fail when the reload is refused.

Commands are taken from the installed unit with ``/opt/prexy`` and
``/etc/prexy`` moved into the scratch root.  The installed configuration
is changed in two places a test machine needs: a free admin port instead of
9080, and two workers.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import site
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread

from .conftest import Cleanups
from .test_service import RawClient, connect
from .twistd_support import REPO_ROOT, exited, free_port, listen_notify, stop_process

UNIT = REPO_ROOT / "conf" / "prexy.service"
ENABLE_STEP = re.compile(r"systemctl daemon-reload && systemctl enable --now ((?:[\w.-]+\.(?:socket|service) ?)+)$")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
#: The host's packaged units (targets the Prexy units name), copied into
#: the scratch root: ``verify --root`` looks for them there.
SYSTEM_UNITS = next((p for p in ("/usr/lib/systemd/system", "/lib/systemd/system") if os.path.isdir(p)), None)


def install_steps() -> list[str]:
    """The command lines of the comment block that opens the unit file,
    after its ``Install`` line, up to the first line that is not a command."""
    steps: list[str] = []
    started = False
    for line in UNIT.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not started:
            started = "Install" in line
            continue
        if not line.startswith("#   "):
            break
        steps.append(line[4:].strip())
    return steps


def unit_settings(path: Path) -> dict[str, list[str]]:
    """``Key=value`` settings of a unit file, every value of each key."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


class Scratch:
    """A scratch root and the steps run in it."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="prexy-install-"))
        # What any systemd machine has before the steps.
        for folder in ("etc/systemd/system", "opt", "usr/local/share/doc"):
            (self.root / folder).mkdir(parents=True)

    def path(self, absolute: str) -> str:
        """``absolute`` (a path under /) inside the scratch root."""
        return str(self.root / absolute.lstrip("/"))

    def command(self, line: str) -> list[str]:
        """A unit's command line with /opt/prexy and /etc/prexy in the root."""
        words = shlex.split(line)
        return [re.sub(r"^/(opt|etc)/prexy\b", lambda m: self.path(m.group(0)), w) for w in words]

    def make_venv(self) -> None:
        """The venv step's stand-in (see the module docstring)."""
        venv = self.root / "opt" / "prexy"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        packages = [str(REPO_ROOT), *site.getsitepackages(), *[p for p in sys.path if p.endswith("site-packages")]]
        (venv / "lib" / version / "site-packages" / "prexy-test.pth").write_text("\n".join(dict.fromkeys(packages)) + "\n")
        twistd = venv / "bin" / "twistd"
        twistd.write_text(f"#!{venv}/bin/python\nimport sys\nfrom twisted.scripts.twistd import run\nsys.exit(run())\n")
        twistd.chmod(0o755)

    def env(self) -> dict[str, str]:
        """The service's environment: nothing of this test run's Python."""
        return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "LISTEN_"))}

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def scratch(cleanup: Cleanups) -> Scratch:
    made = Scratch()
    cleanup(made.remove)
    return made


def install(scratch: Scratch) -> list[str]:
    """Run the documented steps in the scratch root; the units the last
    one enables.  Absolute paths under /etc, /opt and /usr in a step are
    taken inside the root, and every step sees ``ROOT`` (``conf/install.sh``
    installs there); a user is not made in a scratch root."""
    steps = install_steps()
    assert steps, f"no install steps at the top of {UNIT}"
    units: list[str] = []
    for step in steps:
        if step.startswith("useradd "):
            continue
        if step.startswith("python3 -m venv /opt/prexy &&"):
            assert "/opt/prexy/bin/pip install " in step, step
            scratch.make_venv()
            continue
        enable = ENABLE_STEP.match(step)
        if enable is not None:
            units = enable.group(1).split()
            continue
        assert not step.startswith("systemctl"), f"a systemctl step this test does not know: {step}"
        command = re.sub(r"(?<![\w.])/(etc|opt|usr)/", lambda m: scratch.path(m.group(0)) + "/", step)
        result = subprocess.run(
            ["bash", "-euc", command], cwd=REPO_ROOT, env={**os.environ, "ROOT": str(scratch.root)},
            capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, f"{step}: {result.stdout}{result.stderr}"
    assert units, f"no 'systemctl ... enable --now UNITS' step in {steps}"
    return units


def test_install_steps_give_a_unit_that_verifies_and_a_config_that_checks(scratch: Scratch) -> None:
    """After the steps, ``ExecStartPre`` (``--check``) accepts the installed
    configuration, which listens on the socket ``prexy.socket`` names; the
    units pass ``systemd-analyze verify`` with every program they run
    installed; the file ``Documentation=`` names is installed."""
    units = install(scratch)
    assert sorted(units) == ["prexy.service", "prexy.socket"]
    service = Path(scratch.path("/etc/systemd/system/prexy.service"))
    socket_unit = Path(scratch.path("/etc/systemd/system/prexy.socket"))
    settings = unit_settings(service)

    (check,) = settings["ExecStartPre"]
    assert check.endswith("--check")
    result = subprocess.run(scratch.command(check), env=scratch.env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    names = unit_settings(socket_unit)["FileDescriptorName"]
    assert f"listening on systemd:domain=INET:name={names[0]}" in result.stdout, result.stdout

    for doc in settings["Documentation"]:
        for url in doc.split():
            if url.startswith("file://"):
                assert os.path.isfile(scratch.path(url[len("file://"):])), f"{url} is not installed"

    if SYSTEMD_ANALYZE is None or SYSTEM_UNITS is None:
        pytest.skip("no systemd-analyze (Debian: apt-get install systemd)")
    shutil.copytree(SYSTEM_UNITS, scratch.path("/usr/lib/systemd/system"), symlinks=True)
    verify = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", f"--root={scratch.root}", *[f"/etc/systemd/system/{u}" for u in units]],
        capture_output=True, text=True, timeout=120,
    )
    assert verify.returncode == 0 and not verify.stdout + verify.stderr, verify.stdout + verify.stderr


#: Passes the listening socket as systemd does (fd 3, LISTEN_FDS,
#: LISTEN_PID of the process it execs, LISTEN_FDNAMES), then execs the unit's
#: command line.
LAUNCHER = (
    "import os, sys\n"
    "os.dup2(int(sys.argv[1]), 3)\n"
    "os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid()), LISTEN_FDNAMES=sys.argv[2])\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)


@pytest_twisted.inlineCallbacks
def test_installed_service_starts_serves_and_reloads(scratch: Scratch, cleanup: Cleanups) -> Any:
    """The installed ``ExecStart`` serves on the socket ``prexy.socket``
    describes (an IPv6 dual-stack socket, as ``ListenStream=PORT`` gives;
    here on a free port); ``ExecReload`` succeeds, and exits non-zero with
    the file and line when a rules file is broken, the site serving on."""
    install(scratch)
    settings = unit_settings(Path(scratch.path("/etc/systemd/system/prexy.service")))
    socket_settings = unit_settings(Path(scratch.path("/etc/systemd/system/prexy.socket")))
    assert socket_settings["ListenStream"] == ["80"]
    config = Path(scratch.path("/etc/prexy/prexy.toml"))
    admin = free_port()
    text = re.sub(r'(?m)^admin = .*$', f'admin = "tcp:{admin}:interface=127.0.0.1"', config.read_text())
    config.write_text(re.sub(r"(?m)^# workers = 2$", "workers = 2", text))

    port = free_port()
    try:  # what systemd makes of ListenStream=PORT: one socket for IPv6 and IPv4
        listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("::", port))
    except OSError:  # a machine without IPv6: systemd makes it IPv4
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", port))
    listener.listen(128)
    log_dir = tempfile.mkdtemp(prefix="prexy-install-log-")
    cleanup(shutil.rmtree, log_dir, True)
    notify_path, notifications, notify_port = listen_notify(log_dir)
    cleanup(notify_port.stopListening)
    ready = notifications.next("READY=1")
    (start,) = settings["ExecStart"]
    log_path = os.path.join(log_dir, "out.log")
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(listener.fileno()), socket_settings["FileDescriptorName"][0],
         *scratch.command(start)],
        pass_fds=(listener.fileno(),), stdout=log, stderr=subprocess.STDOUT, cwd=log_dir,
        env={**scratch.env(), "NOTIFY_SOCKET": notify_path},
    )
    listener.close()
    cleanup(log.close)
    cleanup(stop_process, process)

    def output() -> str:
        return Path(log_path).read_text(errors="replace")

    started = defer.DeferredList([ready, exited(process)], fireOnOneCallback=True, fireOnOneErrback=True)
    _, which = yield started.addTimeout(60, reactor).addErrback(lambda f: pytest.fail(f"no READY=1:\n{output()}"))
    assert which == 0, f"the service exited before READY=1:\n{output()}"

    @defer.inlineCallbacks
    def status() -> Any:
        client = RawClient(b"GET / HTTP/1.1\r\nHost: blog.example.nl\r\nConnection: close\r\n\r\n")
        yield connect(port, client)
        return bytes(client.data).split(b"\r\n", 1)[0]

    # The example site's origin (127.0.0.1:8001) is not there: Prexy answers 502.
    assert (yield status()).startswith(b"HTTP/1.1 502 "), output()
    (reload_line,) = settings["ExecReload"]

    def reload() -> subprocess.CompletedProcess[str]:
        return subprocess.run(scratch.command(reload_line), env=scratch.env(), capture_output=True, text=True,
                              timeout=120)

    result = yield deferToThread(reload)
    assert result.returncode == 0, result.stdout + result.stderr + output()
    assert "reloaded" in result.stdout
    rules = Path(scratch.path("/etc/prexy/shop.rules"))
    lines = len(rules.read_text().splitlines())
    with rules.open("a") as f:
        f.write("replace_filter 'a' 'b' q;\n")
    result = yield deferToThread(reload)
    assert result.returncode != 0
    assert f"{rules}:{lines + 1}:" in result.stderr, result.stderr
    assert "Usage" not in result.stdout + result.stderr
    assert (yield status()).startswith(b"HTTP/1.1 502 ")
