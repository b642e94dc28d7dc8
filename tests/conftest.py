"""Test-wide settings: hypothesis profiles.

`fast` is the default; `thorough` (RAFTKA_HYPOTHESIS_PROFILE=thorough) runs
many more examples, for nightly soaks.
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
