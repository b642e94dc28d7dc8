"""Test-wide settings: hypothesis profiles.

`fast` is the default; `thorough` (RAFTKA_HYPOTHESIS_PROFILE=thorough) runs
many more examples, for nightly soaks.

Helpers that more than one test package uses live beside this file
(`wait_testing`): pytest puts this directory on sys.path, as it holds the
top conftest.py, so a test anywhere below imports them by name.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "fast",
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("RAFTKA_HYPOTHESIS_PROFILE", "fast"))
