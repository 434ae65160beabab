"""Imports prexy modules while some top-level packages cannot be imported.

Run as a script (not as ``-m``: the ``tests`` package is not loaded)::

    python tests/blockedimports.py lmdb,re2,hyperscan,twisted prexy.http1 ...

For each module named, every ``prexy`` module is first dropped from
``sys.modules`` (so each one is imported from scratch, with all it pulls
in), then the module is imported with a meta-path finder that refuses the
blocked packages, and its smoke check (``SMOKE``), when it has one, is run.
One JSON object per module is printed: ``{"module", "error", "blocked"}``,
``error`` being None when both worked and ``blocked`` the blocked packages
found loaded anyway (none, unless something had loaded them before).
"""

from __future__ import annotations

import importlib
import importlib.abc
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


class Refuse(importlib.abc.MetaPathFinder):
    """Makes ``import NAME`` (and its submodules) fail for the ``blocked``
    top-level names, as if they were not installed."""

    def __init__(self, blocked: frozenset[str]) -> None:
        self.blocked = blocked

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if fullname.partition(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)
        return None


def _limits() -> Any:
    from prexy.config import Limits

    return Limits()


#: A call per module showing that what was imported works, not only that
#: the import statement ran.  Each returns True when the module behaved.
SMOKE: dict[str, Callable[[Any], bool]] = {
    "prexy.http1": lambda m: [type(e).__name__ for e in m.ResponseReader().receive_data(
        b"HTTP/1.1 204 No Content\r\n\r\n")] == ["Head", "End"],
    "prexy.h2server": lambda m: m.ServerConnection().open == set(),
    "prexy.requesthead": lambda m: m.check_target(b"GET", b"http://a/b") == (b"/b", b"a"),
    "prexy.h1server": lambda m: m.RequestReader(_limits()).feed(
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")[0].head.method == b"GET",
    "prexy.exchange": lambda m: m.derived_etag(b'"v1"', "d").startswith(b'"v1'),
    "prexy.cache.policy": lambda m: m.request_decision(m.CachePolicy(), b"GET", b"/", []).action == m.Action.LOOKUP,
    "prexy.cache.flow": lambda m: isinstance(m.wanted(followers=0, head=False, claimed=False, storing=False),
                                             m.Wanted),
    "prexy.cluster.core": lambda m: m.NodeCore("a", None).phase == m.Phase.IDLE,
    "prexy.clienthello": lambda m: isinstance(m.ClientHelloReader().feed(b"GET / HTTP/1.1\r\n\r\n"), m.NotAHello),
    "prexy.hostnames": lambda m: m.normalise("Example.COM.") == "example.com",
    "prexy.codec": lambda m: m.parse_codings([b"gzip, br"]) == (b"gzip", b"br"),
    "prexy.config": lambda m: m.Limits().max_request_line > 0,
}


def check(module: str, blocked: frozenset[str]) -> dict[str, Any]:
    for name in [n for n in sys.modules if n == "prexy" or n.startswith("prexy.")]:
        del sys.modules[name]
    try:
        loaded = importlib.import_module(module)
        smoke = SMOKE.get(module)
        error = None if smoke is None or smoke(loaded) else "its smoke check failed"
    except Exception:
        error = traceback.format_exc(limit=-8)
    found = sorted(name for name in sys.modules if name.partition(".")[0] in blocked)
    return {"module": module, "error": error, "blocked": found}


def main(argv: Sequence[str]) -> int:
    # Run as a script, this file's directory (tests/) comes first on the
    # path, where tests/acme would hide the ``acme`` library.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    blocked = frozenset(argv[0].split(","))
    for name in [n for n in sys.modules if n.partition(".")[0] in blocked]:
        del sys.modules[name]
    sys.meta_path.insert(0, Refuse(blocked))
    for module in argv[1:]:
        print(json.dumps(check(module, blocked)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
