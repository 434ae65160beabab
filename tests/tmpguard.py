"""A test run's temporary directory of its own, and what the run left in it.

Every test removes what it creates.  To keep it so, a run gets a new
directory as ``TMPDIR`` (which ``tempfile`` and the child processes the
tests start use), and whatever is left there when the run ends is reported
as a failure, then removed.  A private directory makes the count exact on
a shared machine: nothing else writes there.

The unit tier runs under it as a wrapper (tox does this)::

    python -m tests.tmpguard python -m twisted.trial tests.proxy

which exits with the command's status, or 3 when the command passed but
left something behind.  The integration tier's conftest does the same
inside pytest, with :class:`PrivateTmp`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence

#: The exit status of a run that passed but left files behind.
LEFT_FILES = 3


class PrivateTmp:
    """A new directory made the temporary directory of this process (and
    of the children it starts) until :meth:`close`."""

    def __init__(self, prefix: str = "prexy-tests-") -> None:
        self._saved = (os.environ.get("TMPDIR"), tempfile.tempdir)
        self.path = tempfile.mkdtemp(prefix=prefix)
        os.environ["TMPDIR"] = self.path
        tempfile.tempdir = self.path

    def leftovers(self, ignore: Callable[[str], bool] = lambda name: False) -> list[str]:
        """What is in the directory now (names at its top, sorted), less
        what ``ignore`` accepts."""
        return sorted(name for name in os.listdir(self.path) if not ignore(name))

    def close(self) -> None:
        """Remove the directory and everything in it, and use the previous
        temporary directory again."""
        environ, tempdir = self._saved
        if environ is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = environ
        tempfile.tempdir = tempdir
        shutil.rmtree(self.path, ignore_errors=True)


def describe(leftovers: Sequence[str], where: str) -> str:
    """The report of what a run left in ``where``."""
    shown = "\n".join(f"  {name}" for name in leftovers[:50])
    more = f"\n  ... and {len(leftovers) - 50} more" if len(leftovers) > 50 else ""
    return (
        f"the tests left {len(leftovers)} entr{'y' if len(leftovers) == 1 else 'ies'} in their "
        f"temporary directory {where} (every test must remove what it creates):\n{shown}{more}"
    )


def main(argv: Sequence[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python -m tests.tmpguard COMMAND [ARG...]\n")
        return 2
    private = PrivateTmp()
    try:
        try:
            status = subprocess.call(list(argv))
        except KeyboardInterrupt:
            status = 130
        left = private.leftovers()
    finally:
        private.close()
    if left:
        sys.stderr.write(f"tmpguard: {describe(left, private.path)}\n")
        if status == 0:
            return LEFT_FILES
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
