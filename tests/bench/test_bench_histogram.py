"""bench.histogram against a dumb oracle: the nearest-rank percentile found
by counting, with exact decimal arithmetic and no numpy."""

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.histogram import PERCENTILES, LatencyHistogram, percentile_key, percentiles

latencies = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)
percents = st.sampled_from([0.0, 1.0, 25.0, 50.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0])


def oracle(values: list[float], p: float) -> float:
    """The smallest sample v such that at least p% of the samples are <= v."""
    n = len(values)
    need = Fraction(str(p)) * n / 100
    return min(v for v in values if sum(1 for x in values if x <= v) >= need)


def test_known_tables():
    one_to_hundred = percentiles(range(1, 101))
    assert one_to_hundred == {
        "count": 100, "mean": 50.5, "min": 1, "p50": 50, "p95": 95, "p99": 99, "p99_9": 100, "max": 100,
    }
    # 99.9 / 100 * 1000 is 999.0000000000001 in floats; the rank must still be 999.
    assert percentiles(range(1, 1001))["p99_9"] == 999
    assert percentiles([7.5])["p50"] == 7.5


@given(st.lists(latencies, min_size=1, max_size=60), percents)
def test_exact_mode_is_the_nearest_rank(values, p):
    hist = LatencyHistogram()
    hist.record_many(values)
    assert hist.exact
    assert hist.percentile(p) == oracle(values, p)
    assert hist.max == max(values) and hist.min == min(values) and hist.count == len(values)


@given(st.lists(latencies, min_size=1, max_size=60), percents, st.sampled_from([1, 2, 3, 4]))
def test_bucket_mode_keeps_the_significant_digits(values, p, digits):
    hist = LatencyHistogram(exact_limit=0, significant_digits=digits)
    hist.record_many(values)
    assert not hist.exact
    exact = oracle(values, p)
    got = hist.percentile(p)
    # Never under-reports; over-reports by less than 10**-digits relative.
    assert exact <= got <= max(values)
    assert got - exact <= exact * 10.0**-digits


def test_bucket_mode_over_a_wide_range():
    values = [i * 1.37 for i in range(1, 20_000)] + [1e-6, 0.0, 3e7]
    hist = LatencyHistogram(exact_limit=1000)
    hist.record_many(values)
    assert not hist.exact
    ordered = sorted(values)
    for p in (0.0, 10.0, *PERCENTILES, 99.99, 100.0):
        rank = max(1, -(-Fraction(str(p)) * len(values) // 100))
        exact = ordered[int(rank) - 1]
        got = hist.percentile(p)
        assert exact <= got <= exact * (1 + 1e-3), (p, exact, got)
    assert hist.percentile(100.0) == 3e7
    assert hist.percentile(0.0) == 0.0


def test_switches_to_buckets_past_the_exact_limit():
    hist = LatencyHistogram(exact_limit=3)
    hist.record_many([4.0, 1.0, 3.0])
    assert hist.exact and hist.percentile(50) == 3.0
    hist.record(2.0)
    assert not hist.exact
    assert 2.0 <= hist.percentile(50) <= 2.0 * 1.001
    assert hist.summary()["max"] == 4.0


@given(st.lists(latencies, max_size=40), st.lists(latencies, max_size=40), st.integers(0, 50))
def test_merge_equals_recording_everything_once(left, right, limit):
    a, b, both = LatencyHistogram(limit), LatencyHistogram(limit), LatencyHistogram(limit)
    a.record_many(left)
    b.record_many(right)
    both.record_many(left + right)
    a.merge(b)
    assert a.count == both.count
    if both.count:
        for p in PERCENTILES:
            expected = oracle(left + right, p)
            assert expected <= a.percentile(p) <= expected * (1 + 1e-3)


def test_refuses_what_is_not_a_latency():
    hist = LatencyHistogram()
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="non-negative"):
            hist.record(bad)
    with pytest.raises(ValueError, match="empty"):
        hist.percentile(50)
    hist.record(1.0)
    with pytest.raises(ValueError, match="outside"):
        hist.percentile(101)
    assert hist.summary(()) == {"count": 1, "mean": 1.0, "min": 1.0, "max": 1.0}
    assert [percentile_key(p) for p in PERCENTILES] == ["p50", "p95", "p99", "p99_9"]
