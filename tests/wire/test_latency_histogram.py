"""The request latency histogram's quantiles against a sorted list (the dumb oracle).

A quantile is the upper bound of the power-of-two microsecond bucket that
holds it, so it is never below the true value and less than twice it
(for durations of at least 1 us)."""

import math

from hypothesis import given, strategies as st

from common.metrics import QUANTILES, LatencyHistogram


@given(st.lists(st.floats(min_value=1e-6, max_value=100.0), min_size=1, max_size=300))
def test_quantiles_bound_the_true_ones_within_a_factor_of_two(durations_s):
    hist = LatencyHistogram()
    for d in durations_s:
        hist.observe(d)
    ordered = sorted(durations_s)
    assert hist.count == len(ordered)
    assert math.isclose(hist.sum_s, sum(ordered))
    for q in QUANTILES:
        true_ms = ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000
        # Microsecond truncation: a bucket bounds int(us), not the float.
        assert true_ms - 0.001 <= hist.quantile_ms(q) <= 2 * true_ms + 0.001, (q, true_ms, hist.quantile_ms(q))


def test_an_empty_histogram_answers_zero():
    assert LatencyHistogram().quantile_ms(0.99) == 0.0
