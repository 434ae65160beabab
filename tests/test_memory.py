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

from prexy.memory import tune_malloc

NAMES = ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX"]


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
        code = f"from prexy.memory import tune_malloc; print(tune_malloc({environ!r}))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": ":".join(sys.path)})
        return ast.literal_eval(out.stdout)  # type: ignore[no-any-return]

    def test_applied_without_the_variables(self) -> None:
        self.assertEqual(self.run_child({}), NAMES)

    def test_the_operators_variables_win(self) -> None:
        self.assertEqual(self.run_child({"MALLOC_ARENA_MAX": "4"}), NAMES[:2])
        self.assertEqual(self.run_child(dict.fromkeys(NAMES, "1")), [])

    def test_callable_in_this_process(self) -> None:
        self.assertIsInstance(tune_malloc(dict.fromkeys(NAMES, "1")), list)
