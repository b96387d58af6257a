"""What GET /metrics reports: request counts, latency and batch-size percentiles, queue depth, memory.

Latencies and batch sizes are kept for the last ``window`` requests / batches (percentiles
over a sliding window); counts are totals since start; memory per rank is measured when the
ranks have loaded their shards.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from typing import Callable, Iterable, Mapping

PERCENTILES = (50, 90, 99)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank) of ``values``; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


class ServingMetrics:
    def __init__(self, memory_per_rank: list[Mapping[str, int]], queue_depth: Callable[[], Mapping[str, int]],
                 window: int = 10_000):
        self.started = time.monotonic()
        self.memory_per_rank = memory_per_rank
        self.queue_depth = queue_depth
        self.requests: Counter[tuple[str, int]] = Counter()
        self.latency_ms: dict[str, deque[float]] = {}
        self.batch_sizes: dict[str, deque[int]] = {}
        self.num_batches: Counter[str] = Counter()
        self.num_samples: Counter[str] = Counter()  # in all batches since start
        self.window = window

    def record_request(self, endpoint: str, status: int, latency_ms: float) -> None:
        self.requests[endpoint, status] += 1
        self.latency_ms.setdefault(endpoint, deque(maxlen=self.window)).append(latency_ms)

    def record_batch(self, kind: str, num_samples: int) -> None:
        self.num_batches[kind] += 1
        self.num_samples[kind] += num_samples
        self.batch_sizes.setdefault(kind, deque(maxlen=self.window)).append(num_samples)

    def snapshot(self) -> dict:
        requests: dict[str, dict[str, int]] = {}
        for (endpoint, status), n in sorted(self.requests.items()):
            requests.setdefault(endpoint, {})[str(status)] = n
        return {
            "uptime_s": round(time.monotonic() - self.started, 3),
            "requests": requests,
            "latency_ms": {e: _summary(v) for e, v in sorted(self.latency_ms.items())},
            "batches": {kind: {"count": self.num_batches[kind], "samples": self.num_samples[kind],
                               "size": _summary(sizes), "histogram": _histogram(sizes)}
                        for kind, sizes in sorted(self.batch_sizes.items())},
            "queue_depth": dict(self.queue_depth()),
            "memory_bytes_per_rank": [dict(m) for m in self.memory_per_rank],
        }


def _summary(values: deque) -> dict:
    out = {f"p{q}": percentile(values, q) for q in PERCENTILES}
    out["mean"] = sum(values) / len(values) if values else None
    return {k: None if v is None else round(v, 3) for k, v in out.items()}


def _histogram(sizes: deque[int]) -> dict[str, int]:
    """Batches by size, in power-of-two buckets ("1", "2-3", "4-7", ...)."""
    counts: Counter[int] = Counter(size.bit_length() - 1 for size in sizes if size > 0)
    return {(str(1 << b) if b == 0 else f"{1 << b}-{(2 << b) - 1}"): n for b, n in sorted(counts.items())}
