"""Change points in a metric's history across commits.

The history (`summary.commit_history`) is one value per commit (the median
of that commit's runs), in the order the commits were first benched. A
change point is a commit from which the metric sits at another level.

Method: binary segmentation, the search E-divisive means (Matteson and
James, 2014; Apache Otava's) runs, with a two-sample t statistic as the
split score in place of the energy distance:

1. In a segment of n >= 2 * MIN_SIDE values, score every split into a left
   and a right part of MIN_SIDE or more values by Welch's t statistic of
   their means; take the best.
2. Accept it when t >= T_THRESHOLD (a flat noisy series of a few dozen
   commits stays well below it) *and* the right part's median differs from
   the left's by more than the noise band, max(noise floor, IQR/|median|
   of the left part): the same band `raftka report` flags last-vs-previous
   changes with, so a change point is never smaller than what the noise
   between runs explains.
3. Recurse into both parts.

Each change point names the commits that bracket it: the last commit of
the old level and the first of the new. This runs on the collected
history (one small row per key and commit) in the driver's Python.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from bench.report.units import HIGHER, LOWER

MIN_SIDE = 2
T_THRESHOLD = 5.0


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _welch_t(left: list[float], right: list[float]) -> float:
    diff = abs(statistics.fmean(left) - statistics.fmean(right))
    var = statistics.variance(left) / len(left) + statistics.variance(right) / len(right)
    if var == 0:
        return math.inf if diff > 0 else 0.0
    return diff / math.sqrt(var)


def split_points(values: list[float], noise_floor: float) -> list[int]:
    """Indices i (the first value of a new level) of the change points in `values`."""
    found: list[int] = []

    def search(lo: int, hi: int) -> None:
        if hi - lo < 2 * MIN_SIDE:
            return
        best, best_t = None, 0.0
        for i in range(lo + MIN_SIDE, hi - MIN_SIDE + 1):
            t = _welch_t(values[lo:i], values[i:hi])
            if t > best_t:
                best, best_t = i, t
        if best is None or best_t < T_THRESHOLD:
            return
        left, right = values[lo:best], values[best:hi]
        before, after = statistics.median(left), statistics.median(right)
        band = noise_floor
        if before != 0:
            band = max(noise_floor, (_quantile(left, 0.75) - _quantile(left, 0.25)) / abs(before))
        if before == 0 or abs(after / before - 1) <= band:
            return
        found.append(best)
        search(lo, best)
        search(best, hi)

    search(0, len(values))
    return sorted(found)


def find_change_points(history: list[dict[str, Any]], noise_floor: float) -> list[dict[str, Any]]:
    """The change points of every key's history (see the module docstring)."""
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for item in history:
        key = (item["scenario"], item["mode"], item["metric"], tuple(sorted(item["params"].items())), item["unit"])
        by_key.setdefault(key, []).append(item)
    out = []
    for key, items in by_key.items():
        items = sorted(items, key=lambda x: (x["first_ms"], x["git_sha"] or ""))
        values = [x["value"] for x in items]
        cuts = split_points(values, noise_floor)
        bounds = [0, *cuts, len(values)]
        for n, i in enumerate(cuts):
            before = statistics.median(values[bounds[n]:i])
            after = statistics.median(values[i:bounds[n + 2]])
            change = after / before - 1
            direction = items[0].get("direction")
            worse = -change if direction == HIGHER else change if direction == LOWER else None
            verdict = "changed" if worse is None else "regression" if worse > 0 else "improvement"
            out.append({
                "scenario": key[0], "mode": key[1], "metric": key[2], "params": items[0]["params"], "unit": key[4],
                "before_sha": items[i - 1]["git_sha"], "after_sha": items[i]["git_sha"], "commits": len(values),
                "before": before, "after": after, "change": change, "verdict": verdict,
            })
    return sorted(out, key=lambda c: (c["scenario"], c["metric"], c["mode"], str(c["params"])))
