"""Where the machine-wide cache store lives when the configuration does not
say (``[cache] path``).  Pure: the master, the workers, the cluster node and
the demo all resolve the same directory from here."""

from __future__ import annotations

import os


def default_cache_path() -> str:
    """The store's directory unless configured: on tmpfs (``/dev/shm``)
    when the machine has one, else in ``$TMPDIR`` (``/tmp``), one per user."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
    return os.path.join(base, f"prexy-cache-{os.getuid()}")
