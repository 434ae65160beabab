"""The C allocator's settings for a serving process (``prexy.memory``):
applied where the environment does not set them, left to the operator
where it does."""

from __future__ import annotations

import ast
import ctypes
import ctypes.util
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from prexy.memory import trim, tune_malloc

NAMES = ["MALLOC_ARENA_MAX"]


def has_mallopt() -> bool:
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or None), "mallopt")
    except OSError:
        return False


class TuneMallocTests(SynchronousTestCase):
    def setUp(self) -> None:
        if not has_mallopt():
            self.skipTest("no mallopt in this C library")

    def run_child(self, environ: dict[str, str]) -> list[str]:
        """``tune_malloc(environ)`` in a process of its own (the settings
        are the process's)."""
        code = f"from prexy.memory import trim, tune_malloc; print(tune_malloc({environ!r}))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": ":".join(sys.path)})
        return ast.literal_eval(out.stdout)  # type: ignore[no-any-return]

    def test_applied_without_the_variables(self) -> None:
        self.assertEqual(self.run_child({}), NAMES)

    def test_the_operators_variables_win(self) -> None:
        self.assertEqual(self.run_child({"MALLOC_ARENA_MAX": "4"}), [])
        self.assertEqual(self.run_child({"MALLOC_MMAP_THRESHOLD_": "65536"}), NAMES)

    def test_callable_in_this_process(self) -> None:
        self.assertIsInstance(tune_malloc(dict.fromkeys(NAMES, "1")), list)


class TrimTests(SynchronousTestCase):
    def test_freed_pages_go_back(self) -> None:
        """Pages freed between blocks still in use are handed back: the
        process's anonymous memory falls by most of what it freed."""
        if not hasattr(ctypes.CDLL(ctypes.util.find_library("c") or None), "malloc_trim"):
            self.skipTest("no malloc_trim in this C library")
        code = (
            "from prexy.memory import trim\n"
            "def anon():\n"
            "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('RssAnon'))\n"
            "blocks = [bytes(100_000) for _ in range(600)]\n"  # (below the mmap threshold once it rose)
            "keep = blocks[::10]\n"
            "del blocks\n"
            "before = anon()\n"
            "trim()\n"
            "print(before - anon())\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": ":".join(sys.path)})
        released_kib = int(out.stdout)
        self.assertGreater(released_kib, 20_000)  # of the 54 MB freed between kept blocks

    def test_callable_in_this_process(self) -> None:
        self.assertIsInstance(trim(), bool)
