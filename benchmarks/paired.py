"""Paired rounds: is one plan measurably faster than another when both ran in every round?

The plan benchmarks (plans_measured.py, one host and --hosts) run round i of every plan in the
same job, the plans' order alternating, so round i of two plans saw the same machine. A one-sided
sign test over those pairs says whether one plan won more rounds than a coin would: with 5 rounds
it takes all 5 (p = 1/32) to pass p < 0.05.
"""

from __future__ import annotations

import math


def paired_rounds(base: list[float], other: list[float]) -> tuple[int, int, float]:
    """Rounds in which base was faster than other, out of how many, and the one-sided sign test's
    p-value of that many wins if neither plan were faster (each round a fair coin)."""
    assert len(base) == len(other), (len(base), len(other))
    n, wins = len(base), sum(b < o for b, o in zip(base, other))
    return wins, n, sum(math.comb(n, j) for j in range(wins, n + 1)) / 2 ** n

