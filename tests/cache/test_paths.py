"""Where the cache store lives when the configuration does not say."""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from prexy.cache import paths


class DefaultCachePathTests(SynchronousTestCase):
    """One directory per user, on tmpfs when the machine has one."""

    def test_tmpfs(self) -> None:
        """With /dev/shm, the store goes there."""
        self.patch(os.path, "isdir", lambda path: path == "/dev/shm")
        self.assertEqual(paths.default_cache_path(), f"/dev/shm/prexy-cache-{os.getuid()}")

    def test_tmpdir(self) -> None:
        """Without /dev/shm, in $TMPDIR, else /tmp."""
        self.patch(os.path, "isdir", lambda path: False)
        self.patch(os, "environ", {"TMPDIR": "/var/tmp/x"})
        self.assertEqual(paths.default_cache_path(), f"/var/tmp/x/prexy-cache-{os.getuid()}")
        self.patch(os, "environ", {})
        self.assertEqual(paths.default_cache_path(), f"/tmp/prexy-cache-{os.getuid()}")
