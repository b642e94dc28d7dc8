"""Pacing background I/O: how long to sleep after doing some work.

Theory of operation
-------------------
The log cleaner works in steps of bounded size (`LogCleaner.maybe_clean`
reads about `log.cleaner.io.buffer.size` bytes per call) so it never holds
the event loop for long. Between steps its shell sleeps for what one of
these pure pacers says, so that it also stays within a budget over time:

- `Throttler`: at most `max_bytes_per_second` on average, Kafka's
  `Throttler` behind `log.cleaner.io.max.bytes.per.second`. Work is
  measured over periods of `check_interval_ms`; when a period ran faster
  than the rate, the answer is the sleep that brings its average down to
  the rate.
- `duty_cycle_sleep_ms`: a CPU share instead of a byte rate: after `busy_ms`
  of work, sleeping `busy_ms * (1 - fraction) / fraction` keeps the worker
  busy `fraction` of the time.

Both take the time as an argument; the shell reads the clock.
"""

from __future__ import annotations


class Throttler:
    """Bytes-per-second pacing (module doc)."""

    def __init__(self, max_bytes_per_second: float, now_ms: int, check_interval_ms: int = 300) -> None:
        assert max_bytes_per_second > 0
        self.max_bytes_per_second = max_bytes_per_second
        self.check_interval_ms = check_interval_ms
        self._period_start_ms = now_ms
        self._observed = 0

    def record(self, n_bytes: int, now_ms: int) -> int:
        """Account for `n_bytes` done by `now_ms`; return the milliseconds
        to sleep before the next step (0: go on)."""
        self._observed += n_bytes
        elapsed_ms = now_ms - self._period_start_ms
        if elapsed_ms < self.check_interval_ms:
            return 0
        sleep_ms = 0
        if self.max_bytes_per_second != float("inf"):
            needed_ms = self._observed * 1000 / self.max_bytes_per_second
            if needed_ms > elapsed_ms:
                sleep_ms = int(needed_ms - elapsed_ms + 0.5)
        self._period_start_ms = now_ms + sleep_ms
        self._observed = 0
        return sleep_ms


def duty_cycle_sleep_ms(busy_ms: float, fraction: float) -> int:
    """The sleep after `busy_ms` of work that keeps a worker busy
    `fraction` (0 < fraction <= 1) of the time."""
    assert 0 < fraction <= 1
    return int(busy_ms * (1 - fraction) / fraction + 0.5)
