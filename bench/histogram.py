"""Latency percentiles with HdrHistogram's precision, in pure Python.

Theory of operation
-------------------
A bench records one latency per request; a long run records millions. The
histogram keeps every sample exactly while there are at most `exact_limit`
of them, and then answers from the samples themselves: percentiles are then
exact.

Past that it folds the samples into log-linear buckets, as HdrHistogram
does (Gil Tene, "HdrHistogram: a High Dynamic Range Histogram"): a value
`v = m * 2**e` with `m` in [0.5, 1) (`math.frexp`) falls in the bucket
`(e, floor(m * sub_bucket_count))`. With `sub_bucket_count = 2048` every
bucket spans at most 1/1024 of its lower bound, i.e. three significant
decimal digits, whatever the magnitude; memory grows with the log of the
range, not with the sample count. Zero gets its own bucket.

Percentiles use the nearest-rank definition: the p-th percentile of n
samples is the value of rank `ceil(p/100 * n)` in sorted order (rank 1 at
least), so it is always a recorded value, never an interpolation. In bucket
mode the answer is the bucket's highest equivalent value (as HdrHistogram
reports), clamped to the recorded maximum: it never under-reports, and over-
reports by less than 10**-significant_digits relative.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable

# The percentiles a bench reports for a latency distribution.
PERCENTILES = (50.0, 95.0, 99.0, 99.9)


def percentile_key(p: float) -> str:
    """Column-friendly name of a percentile: 50 -> "p50", 99.9 -> "p99_9"."""
    text = f"{p:g}".replace(".", "_")
    return f"p{text}"


def nearest_rank(p: float, n: int) -> int:
    """1-based rank of the p-th percentile among n sorted samples."""
    assert n > 0, "no samples"
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile {p} is outside [0, 100]; pass e.g. 99.9 for p99.9")
    # Decimal arithmetic: in floats 99.9 / 100 * 1000 is 999.0000000000001,
    # whose ceiling would skip a rank.
    return min(n, max(1, math.ceil(Fraction(str(p)) * n / 100)))


class LatencyHistogram:
    """Records non-negative values (latencies, in the unit of the caller's
    choice) and answers percentiles; see the module docstring."""

    def __init__(self, exact_limit: int = 100_000, significant_digits: int = 3) -> None:
        if not 1 <= significant_digits <= 5:
            raise ValueError(f"significant_digits={significant_digits}; use 1..5 (HdrHistogram's range)")
        if exact_limit < 0:
            raise ValueError(f"exact_limit={exact_limit}; use 0 to always bucket")
        self.exact_limit = exact_limit
        self.significant_digits = significant_digits
        # Smallest power of two with sub_bucket_count / 2 >= 10**digits, so a
        # bucket spans at most 1/(sub_bucket_count/2) of its lower bound.
        self.sub_bucket_count = 1 << math.ceil(math.log2(2 * 10**significant_digits))
        self._samples: list[float] | None = []
        self._buckets: dict[tuple[int, int], int] = {}
        self._zeros = 0
        self.count = 0
        self.min = math.inf
        self.max = -math.inf
        self.total = 0.0

    @property
    def exact(self) -> bool:
        """True while percentiles come from the samples themselves."""
        return self._samples is not None

    def record(self, value: float) -> None:
        if not value >= 0.0 or math.isinf(value):
            raise ValueError(f"latency {value!r} is not a finite non-negative number")
        self.count += 1
        self.total += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        if self._samples is not None:
            self._samples.append(value)
            if len(self._samples) > self.exact_limit:
                self._fold_samples()
        else:
            self._bucket_add(value, 1)

    def record_many(self, values: Iterable[float]) -> None:
        for value in values:
            self.record(value)

    def merge(self, other: "LatencyHistogram") -> None:
        """Add every sample of `other` (same precision) to this histogram."""
        if other.sub_bucket_count != self.sub_bucket_count:
            raise ValueError("merge of histograms with different significant_digits; record into one precision")
        if other._samples is not None:
            self.record_many(other._samples)
            return
        if self._samples is not None:
            self._fold_samples()
        for key, n in other._buckets.items():
            self._buckets[key] = self._buckets.get(key, 0) + n
        self._zeros += other._zeros
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def percentile(self, p: float) -> float:
        """The p-th percentile (0..100), nearest rank; see the module docstring."""
        if self.count == 0:
            raise ValueError("percentile of an empty histogram; record samples first")
        rank = nearest_rank(p, self.count)
        if self._samples is not None:
            self._samples.sort()
            return self._samples[rank - 1]
        seen = self._zeros
        if seen >= rank:
            return 0.0
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            if seen >= rank:
                return min(self.max, max(self.min, self._highest_equivalent(key)))
        raise AssertionError(f"bucket counts add up to {seen}, below count {self.count}")

    def summary(self, percentiles: Iterable[float] = PERCENTILES) -> dict[str, float]:
        """`{"count", "mean", "min", "p50", "p95", "p99", "p99_9", "max"}`."""
        out: dict[str, float] = {"count": self.count}
        if self.count == 0:
            return out
        out["mean"] = self.total / self.count
        out["min"] = self.min
        for p in percentiles:
            out[percentile_key(p)] = self.percentile(p)
        out["max"] = self.max
        return out

    def buckets(self) -> list[tuple[float, int]]:
        """The histogram as `(bucket's highest equivalent value, count)`
        pairs, ascending (zero first): the mergeable form the results keep
        (`bench.results.write_histogram`). Exact samples are folded into
        buckets here, so two runs' buckets always line up and add."""
        counts: dict[tuple[int, int], int] = dict(self._buckets)
        zeros = self._zeros
        for value in self._samples or ():
            if value == 0.0:
                zeros += 1
                continue
            mantissa, exponent = math.frexp(value)
            key = (exponent, int(mantissa * self.sub_bucket_count))
            counts[key] = counts.get(key, 0) + 1
        out = [(0.0, zeros)] if zeros else []
        return out + [(self._highest_equivalent(key), counts[key]) for key in sorted(counts)]

    def _fold_samples(self) -> None:
        samples, self._samples = self._samples, None
        assert samples is not None
        for value in samples:
            self._bucket_add(value, 1)

    def _bucket_add(self, value: float, n: int) -> None:
        if value == 0.0:
            self._zeros += n
            return
        mantissa, exponent = math.frexp(value)
        key = (exponent, int(mantissa * self.sub_bucket_count))
        assert self.sub_bucket_count // 2 <= key[1] < self.sub_bucket_count, (value, key)
        self._buckets[key] = self._buckets.get(key, 0) + n

    def _highest_equivalent(self, key: tuple[int, int]) -> float:
        exponent, sub = key
        return math.ldexp((sub + 1) / self.sub_bucket_count, exponent)


def percentiles(values: Iterable[float], ps: Iterable[float] = PERCENTILES) -> dict[str, float]:
    """Exact nearest-rank summary of `values` (a convenience for small sets)."""
    hist = LatencyHistogram(exact_limit=1 << 62)
    hist.record_many(values)
    return hist.summary(ps)
