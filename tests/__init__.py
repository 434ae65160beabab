"""Prexy's tests: the unit tier (trial) and the real-socket tier (pytest).

Importing this package registers the hypothesis profiles, so every runner
(trial for the unit tier, pytest for tests/integration and tests/proxy)
sees them; ``HYPOTHESIS_PROFILE`` picks one (tox sets ``ci``).  A test's own
``@settings`` (most give ``max_examples`` and ``deadline``) still wins over
the profile for what it sets.

* ``ci``: no deadline and no too-slow health check (two cores shared with
  other jobs make timings meaningless), and a failure prints the blob that
  reproduces it (``@reproduce_failure``).
* ``default``: hypothesis's own defaults.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
