"""Waiting in tests for a state a real cluster reaches in its own time.

Shared by the test packages: pytest puts this directory on sys.path (it
holds the top conftest.py), so any test imports it as `wait_testing`.
"""

from __future__ import annotations

import time


def wait_for(what: str, predicate, timeout_s: float = 60):
    """`predicate()`'s first truthy answer, asked every 0.3 s until
    `timeout_s`; an AssertionError naming `what` and the last answer (or
    exception) if none came. An exception counts as a no: a broker may be
    down or starting for a moment."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - a broker may be down for a moment
            last = repr(exc)
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")
