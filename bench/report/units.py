"""Which way is better for a metric, from its unit.

Rates (any unit ending in `/s`: `MB/s`, `records/s`, `batches/s`) are
better higher; durations and CPU time are better lower. Anything else
(`ratio`, `bytes`, counts) has no known direction: the report shows its
changes but never calls one a regression.
"""

from __future__ import annotations

HIGHER = "higher"
LOWER = "lower"

RATE_SUFFIX = "/s"
LOWER_IS_BETTER_UNITS = (
    "ns", "us", "µs", "ms", "s", "min", "h",
    "cpu_s", "cpu-seconds", "CPU-seconds", "cpu_ms", "CPU-ms",
)


def direction(unit: str) -> str | None:
    """`"higher"`, `"lower"` or None (unknown) for `unit`."""
    if unit.endswith(RATE_SUFFIX):
        return HIGHER
    if unit in LOWER_IS_BETTER_UNITS:
        return LOWER
    return None
