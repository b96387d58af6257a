"""Wall-clock time per phase of the sharded forward (input dist, lookup, output dist).

Attach a `PhaseTimer` to a collection (``collection.timer = PhaseTimer()``) to sum the
seconds spent in each phase; phases also show up as `record_function` ranges in the torch
profiler. On GPU, kernels run asynchronously: synchronize inside phases or use the profiler.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

from torch.autograd.profiler import record_function


class PhaseTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        with record_function(f"embshard.{name}"):
            yield
        self.seconds[name] += time.perf_counter() - start

    def reset(self) -> None:
        self.seconds.clear()
