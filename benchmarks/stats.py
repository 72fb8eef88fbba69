"""
Medians and their 95 % confidence intervals.

* :func:`median_ci`: the distribution-free interval on one median from order
  statistics (the binomial distribution of the count below the median; no
  assumption on the shape of the timings).
* :func:`bootstrap_ci`: the percentile bootstrap interval of a statistic of two
  samples (a difference or a ratio of medians), each resampled on its own, with
  a fixed seed so that a report is reproducible from its ``results.json``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence

LEVEL = 0.95
RESAMPLES = 2000


def median_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float] | None:
    """
    The order-statistic interval ``[x_(l), x_(n-l+1)]`` that covers the median with at least ``level``.

    Parameters
    ----------
    values
        The sample (any unit; the interval is in the same unit).
    level
        Coverage, 0.95 for 95 %.

    Returns
    -------
    (low, high) or None
        ``None`` when the sample is too small for that coverage (fewer than 6
        values at 95 %).
    """
    n = len(values)
    ordered = sorted(values)
    below, lower = 0.0, 0  # P(B <= lower - 1) for B ~ Binomial(n, 1/2)
    while lower < n // 2:
        below += math.comb(n, lower) / 2**n
        if 2 * below > 1 - level:
            break
        lower += 1
    if lower == 0:
        return None
    return ordered[lower - 1], ordered[n - lower]


def bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    statistic: Callable[[float, float], float],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
) -> tuple[float, float] | None:
    """
    Percentile bootstrap interval of ``statistic(median(a), median(b))``.

    Parameters
    ----------
    a, b
        Two samples, resampled independently (with replacement, seed 0).
    statistic
        For example ``lambda x, y: x - y`` (a difference of medians) or ``x / y``.
    level, resamples
        Coverage and number of resamples.

    Returns
    -------
    (low, high) or None
        ``None`` when a sample has fewer than 2 values.
    """
    if len(a) < 2 or len(b) < 2:
        return None
    rng = random.Random(0)
    draws = sorted(
        statistic(statistics.median(rng.choices(a, k=len(a))), statistics.median(rng.choices(b, k=len(b))))
        for _ in range(resamples)
    )
    tail = int(resamples * (1 - level) / 2)
    return draws[tail], draws[resamples - 1 - tail]


def summary(values: Sequence[float]) -> dict[str, object]:
    """``median``, ``ci`` (:func:`median_ci`, same unit), ``n`` and the ``values`` themselves."""
    return {"median": statistics.median(values), "ci": median_ci(values), "n": len(values), "values": list(values)}
