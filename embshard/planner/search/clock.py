"""The planner's time budget: a deadline for the whole `plan()`, and a record of its stages.

`plan()` ends within ``time_budget_s`` plus `margin_s` (MARGIN_S + MARGIN_SHARE of the
budget: the greedy pass and the report that run past the deadline): the search stages run against
`search_deadline`, which keeps back time for the report (costing the plan, about
REPORT_SHARE of the enumeration time, since both walk every candidate shard once), a greedy
pass stops trying host-bound layouts at `greedy_deadline` (RUSH_SHARE earlier), the LP bound
runs at most until a whole greedy pass (GREEDY_SHARE of the enumeration time) still ends by then
(`bound_limit_s`), and a stage that would not finish in the time left is skipped and named in
the plan's ``search`` block (``skipped``), next to the seconds each stage took (``stages_s``).
"""

from __future__ import annotations

import time

MARGIN_S = 0.5  # plan() may end this much (plus MARGIN_SHARE of the budget) after time_budget_s
MARGIN_SHARE = 0.1
REPORT_SHARE = 0.25  # the report's time as a share of the enumeration time (measured: 0.1 to 0.5)
RUSH_SHARE = 0.4  # a greedy pass without host-bound layouts, as a share of the enumeration time (measured: 0.33 to 0.35 at 5,000 x 1,024)
GREEDY_SHARE = 0.6  # a whole greedy pass, as a share of the enumeration time (measured: 0.4 to 0.6 from 1,000 x 256 to 5,000 x 1,024)


class Clock:
    def __init__(self, budget_s: float) -> None:
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.end = self.start + budget_s
        self.stages_s: dict[str, float] = {}
        self.skipped: list[str] = []
        self._mark = self.start
        self.report_s = 0.0
        self.enumerate_s = 0.0

    def lap(self, stage: str) -> float:
        """Record the time since the last lap under `stage` (added up); returns it."""
        now = time.perf_counter()
        took = now - self._mark
        self.stages_s[stage] = self.stages_s.get(stage, 0.0) + took
        self._mark = now
        return took

    @property
    def margin_s(self) -> float:
        return MARGIN_S + MARGIN_SHARE * self.budget_s

    def reserve_report(self, enumerate_s: float) -> None:
        self.enumerate_s = enumerate_s
        self.report_s = REPORT_SHARE * enumerate_s

    @property
    def search_deadline(self) -> float:
        return self.end - self.report_s

    @property
    def greedy_deadline(self) -> float:
        """When a greedy pass must stop trying host-bound layouts to end by the search deadline."""
        return self.search_deadline - RUSH_SHARE * self.report_s / REPORT_SHARE

    def bound_limit_s(self, share: float) -> float:
        """Seconds the LP bound may take from now: `share` of the time left, and no more than leaves a whole
        greedy pass (GREEDY_SHARE of the enumeration time) to end by `greedy_deadline` (an LP that took longer
        rushed the greedy pass: 5,000 x 1,024 under load, a plan at 31 times the bound with one-shard layouts)."""
        now = time.perf_counter()
        return min(share * (self.search_deadline - now), self.greedy_deadline - now - GREEDY_SHARE * self.enumerate_s)

    def left_s(self) -> float:
        return self.search_deadline - time.perf_counter()

    def skip(self, what: str) -> None:
        self.skipped.append(what)

    def block(self) -> dict:
        """The timing part of the plan's ``search`` block."""
        return {"wall_s": time.perf_counter() - self.start, "time_budget_s": self.budget_s, "margin_s": self.margin_s,
                "stages_s": {k: round(v, 4) for k, v in self.stages_s.items()}, "skipped": list(self.skipped)}
