"""Human-readable views of a ShardingPlan: a per-rank table, a summary and a PNG chart.

Pure functions of the plan: nothing here plans, prints or changes global state
(the chart uses matplotlib's object API with the Agg canvas, not pyplot).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from embshard.planner.cost.tiers import shard_hit_rate
from embshard.planner.plan import ShardingPlan
from embshard.planner.types import Location, Perf, ShardingType, Storage
from embshard.topology import GIB

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# (Perf field, column header, chart legend), in the order a step runs them.
PHASES = (
    ("input_dist_ms", "in dist", "input dist"),
    ("lookup_fwd_ms", "lkp fwd", "lookup fwd"),
    ("output_dist_fwd_ms", "out fwd", "output dist fwd"),
    ("output_dist_bwd_ms", "out bwd", "output dist bwd"),
    ("lookup_bwd_ms", "lkp bwd", "lookup bwd + optimizer"),
    ("dp_allreduce_ms", "dp ar", "data-parallel all-reduce"),
)
assert [p[0] for p in PHASES] == [f.name for f in fields(Perf)]
MEMORY_PARTS = (("weights_bytes", "weights"), ("optimizer_bytes", "optimizer state"), ("io_bytes", "I/O buffers"))
assert [p[0] for p in MEMORY_PARTS] == [f.name for f in fields(Storage) if f.name != "host_bytes"]  # host memory apart


def shards_per_rank(plan: ShardingPlan) -> list[int]:
    """Number of table shards each rank holds (a data-parallel table counts on every rank)."""
    counts = [0] * plan.topology.world_size
    replicated = 0
    for t in plan.tables:
        if t.sharding_type is ShardingType.DATA_PARALLEL:
            replicated += 1
            continue
        for s in t.shards:
            counts[s.rank] += 1
    return [c + replicated for c in counts]


def tiered_tables(plan: ShardingPlan) -> list[tuple[str, str, int, float]]:
    """(table, location, cache rows, predicted hit rate) of each table with shards out of HBM: the
    hit rate of its lookups, its shards' rates weighted by the rows (so the ids) each holds."""
    out = []
    for t in plan.tables:
        if t.sharding_type is ShardingType.DATA_PARALLEL or all(s.location is Location.HBM for s in t.shards):
            continue
        spec = plan.spec(t.name)
        locations = sorted({s.location.value for s in t.shards})
        rows = sum(s.num_rows * s.num_cols for s in t.shards)
        hit = sum(s.num_rows * s.num_cols * shard_hit_rate(spec, s.location, s.cache_rows, s.num_rows) for s in t.shards) / rows
        out.append((t.name, "+".join(locations), sum(s.cache_rows for s in t.shards), hit))
    return out


def rank_table(plan: ShardingPlan, max_ranks: int = 64) -> Table:
    """Per-rank memory (HBM, and host memory when the topology has it for tables) and predicted
    ms by phase, slowest rank first.

    With more than `max_ranks` ranks, lists the `max_ranks - 1` slowest and the fastest.
    """
    if max_ranks < 2:
        raise ValueError(f"max_ranks: must be at least 2 (the slowest and the fastest rank), got {max_ranks}")
    topo = plan.topology
    cap_bytes = topo.shard_memory_cap_bytes
    mean_ms = sum(r.perf.total_ms for r in plan.ranks) / len(plan.ranks)
    shards = shards_per_rank(plan)
    order = sorted(plan.ranks, key=lambda r: (-r.perf.total_ms, r.rank))
    shown = order if len(order) <= max_ranks else order[: max_ranks - 1] + order[-1:]

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="Predicted per-rank load (ms per step), slowest first")
    table.add_column("rank", justify="right")
    table.add_column("host", justify="right")
    table.add_column("shards", justify="right")
    table.add_column(f"mem GiB / {cap_bytes / GIB:.1f}", justify="right")
    table.add_column("mem %", justify="right")
    host_cap = topo.host_memory_cap_bytes
    if host_cap:
        table.add_column(f"host GiB / {host_cap / GIB:.1f}", justify="right")
    for _, header, _ in PHASES:
        table.add_column(header, justify="right")
    table.add_column("total ms", justify="right")
    table.add_column("/ mean", justify="right")
    for i, r in enumerate(shown):
        if len(shown) < len(order) and i == len(shown) - 1:
            table.add_row("…", *[""] * (len(table.columns) - 1), style="dim")
        used = r.storage.total_bytes
        table.add_row(
            str(r.rank),
            str(topo.host_of(r.rank)),
            str(shards[r.rank]),
            f"{used / GIB:.2f}",
            f"{100 * used / cap_bytes:.0f}",
            *([f"{r.storage.host_bytes / GIB:.2f}"] if host_cap else []),
            *(f"{getattr(r.perf, name):.3f}" for name, _, _ in PHASES),
            f"{r.perf.total_ms:.3f}",
            f"{r.perf.total_ms / mean_ms:.2f}" if mean_ms > 0 else "-",
            style="red" if used > cap_bytes or r.storage.host_bytes > host_cap else ("bold" if i == 0 else None),
        )
    if len(shown) < len(order):
        table.caption = f"{max_ranks - 1} slowest and the fastest of {len(order)} ranks; all ranks are in the plan JSON and chart"
    return table


def sharding_type_counts(plan: ShardingPlan) -> dict[str, int]:
    """Tables per sharding type, in ShardingType order, types with no tables left out."""
    counts = Counter(t.sharding_type for t in plan.tables)
    return {st.value: counts[st] for st in ShardingType if counts[st]}


def percent(fraction: float) -> str:
    """0.052 -> '5.2%', with rounding noise around zero shown as 0.0%."""
    return f"{100 * fraction:.1f}%" if abs(fraction) >= 0.0005 else "0.0%"


def _value(v) -> str:
    """A search-block value for the summary: floats in 3 digits, a dict as 'k v' pairs, a list joined by '; '."""
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, dict):
        return "(" + ", ".join(f"{k} {_value(x)}" for k, x in v.items()) + ")"
    if isinstance(v, list):
        return "(" + "; ".join(map(str, v)) + ")" if v else "none"
    return str(v)


def summary(plan: ShardingPlan, planning_s: float | None = None) -> str:
    """A few lines: problem size, objective vs lower bound, memory, sharding types, search."""
    topo = plan.topology
    totals = [r.perf.total_ms for r in plan.ranks]
    slowest = max(plan.ranks, key=lambda r: r.perf.total_ms)
    fullest = max(plan.ranks, key=lambda r: r.storage.total_bytes)
    cap_bytes = topo.shard_memory_cap_bytes
    lines = [
        f"tables: {len(plan.specs)} on {topo.world_size} ranks ({topo.num_hosts} host{'s' * (topo.num_hosts != 1)} x {topo.local_world_size}, {topo.device}), "
        f"{topo.hbm_gib:g} GiB per rank of which {cap_bytes / GIB:.1f} GiB for embeddings, batch {topo.batch_size_per_rank} per rank",
        f"objective: {plan.max_rank_ms:.3f} ms (slowest rank {slowest.rank}); lower bound {plan.lower_bound_ms:.3f} ms; "
        f"gap {percent(plan.gap)}; imbalance {plan.imbalance:.3f} (max/mean, mean {sum(totals) / len(totals):.3f} ms)",
        f"memory: max {fullest.storage.total_bytes / GIB:.2f} of {cap_bytes / GIB:.2f} GiB (rank {fullest.rank}); "
        f"all ranks {sum(r.storage.total_bytes for r in plan.ranks) / GIB:.2f} GiB",
        "sharding: " + ", ".join(f"{name} {n}" for name, n in sharding_type_counts(plan).items())
        + f" ({sum(len(t.shards) for t in plan.tables)} shards)",
    ]
    if topo.host_memory_cap_bytes:
        fullest_host = max(plan.ranks, key=lambda r: r.storage.host_bytes)
        tiered = tiered_tables(plan)
        lines.append(f"host memory: max {fullest_host.storage.host_bytes / GIB:.2f} of {topo.ddr_gib:g} GiB (rank "
                     f"{fullest_host.rank}); all ranks {sum(r.storage.host_bytes for r in plan.ranks) / GIB:.2f} GiB; "
                     f"{len(tiered)} table(s) out of HBM" + (": " if tiered else "")
                     + ", ".join(f"{name} {where}" + (f" ({rows:,} cache rows, hit rate {percent(hit)})" if rows else "")
                                 for name, where, rows, hit in tiered))
    search = ", ".join(f"{k}={_value(v)}" for k, v in plan.search.items())
    timing = f"planning {planning_s:.2f} s" if planning_s is not None else ""
    if search or timing:
        lines.append("search: " + "; ".join(x for x in (timing, search) if x))
    return "\n".join(lines)


MAX_RANK_TICKS = 16  # the rank axis labels every rank up to this many, else every k-th (k a power of two)
LABELLED_BARS = 16  # memory bars carry their value up to this many ranks
CAP_IN_VIEW = 2.0  # the memory axis reaches the cap when the fullest rank holds at least 1/CAP_IN_VIEW of it


def rank_ticks(world_size: int) -> list[int]:
    """Integer rank ticks: every rank, or every k-th from 0 with k the smallest power of two that
    keeps at most MAX_RANK_TICKS (multiples of a host's size on power-of-two hosts)."""
    step = 1
    while world_size > step * MAX_RANK_TICKS:
        step *= 2
    return list(range(0, world_size, step))


def memory_unit(max_bytes: float) -> tuple[str, int]:
    """GiB for a GiB or more, else MiB: the axis shows the values, not rows of zeros."""
    return ("GiB", GIB) if max_bytes >= GIB else ("MiB", 2**20)


def chart(plan: ShardingPlan) -> "Figure":
    """The figure `save_chart` writes: per-rank predicted ms stacked by phase (top) and memory
    stacked by kind (bottom) on an axis scaled to the fullest rank, the cap drawn when it is
    in view and named in the title either way; integer rank ticks at any world size."""
    # Imported here: matplotlib costs ~1 s at import, and only the chart needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator

    ranks = [r.rank for r in plan.ranks]
    W = len(ranks)
    width = 0.8 if W <= 64 else 1.0
    fig = Figure(figsize=(max(8.0, min(24.0, 0.25 * W)), 7.5), layout="constrained")
    FigureCanvasAgg(fig)
    host_cap = plan.topology.host_memory_cap_bytes
    axes = fig.subplots(3 if host_cap else 2, 1, sharex=True)
    load_ax, mem_ax = axes[0], axes[1]

    bottom = [0.0] * W
    for name, _, label in PHASES:
        values = [getattr(r.perf, name) for r in plan.ranks]
        if any(values):
            _stacked(load_ax, values, bottom, width, label)
            bottom = [b + v for b, v in zip(bottom, values)]
    load_ax.axhline(plan.lower_bound_ms, color="black", linestyle="--", linewidth=1, label=f"lower bound {plan.lower_bound_ms:.3f} ms")
    load_ax.set_ylabel("predicted ms per step")
    load_ax.set_title(f"objective {plan.max_rank_ms:.3f} ms, gap {percent(plan.gap)}, imbalance {plan.imbalance:.3f}")
    load_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")

    used = [r.storage.total_bytes for r in plan.ranks]
    cap_bytes = plan.topology.shard_memory_cap_bytes
    fullest = max(range(W), key=used.__getitem__)
    unit, scale = memory_unit(max(used))
    bottom = [0.0] * W
    for name, label in MEMORY_PARTS:
        values = [getattr(r.storage, name) / scale for r in plan.ranks]
        if any(values):
            _stacked(mem_ax, values, bottom, width, label)
            bottom = [b + v for b, v in zip(bottom, values)]
    cap = cap_bytes / scale
    cap_in_view = max(used) * CAP_IN_VIEW >= cap_bytes
    if cap_in_view:
        mem_ax.axhline(cap, color="red", linestyle="--", linewidth=1, label=f"cap {cap:.1f} {unit}")
        mem_ax.set_ylim(0, 1.05 * max(cap, max(bottom)))
    else:  # a line far above the bars would flatten them: scale to the data, name the cap in the title
        mem_ax.set_ylim(0, 1.2 * max(bottom) or 1.0)
    if W <= LABELLED_BARS:
        for r, top in zip(ranks, bottom):
            mem_ax.annotate(f"{top:.3g}", (r, top), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                            fontsize="small")
    mem_ax.set_title(f"memory: fullest rank {ranks[fullest]} holds {used[fullest] / scale:.3g} {unit}, "
                     f"{percent(used[fullest] / cap_bytes)} of the {cap_bytes / GIB:.3g} GiB cap"
                     f"{'' if cap_in_view else ' (cap off scale)'}", fontsize="medium")
    mem_ax.set_ylabel(f"{unit} per rank")
    mem_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    if host_cap:
        host_ax = axes[2]
        host = [r.storage.host_bytes / GIB for r in plan.ranks]
        _stacked(host_ax, host, [0.0] * W, width, "weights + optimizer state")
        host_ax.axhline(host_cap / GIB, color="red", linestyle="--", linewidth=1, label=f"cap {host_cap / GIB:.1f} GiB")
        host_ax.set_ylim(0, 1.05 * max(host_cap / GIB, max(host)))
        hits = ", ".join(f"{name} {percent(hit)}" for name, _, rows, hit in tiered_tables(plan)[:6] if rows)
        host_ax.set_title("host memory (shards out of HBM)" + (f"; predicted hit rates: {hits}" if hits else ""), fontsize="medium")
        host_ax.set_ylabel("GiB per rank")
        host_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    axes[-1].set_xlabel("rank")
    mem_ax.xaxis.set_major_locator(FixedLocator(rank_ticks(W)))
    mem_ax.set_xlim(-0.5 - 0.1 * width, W - 0.5 + 0.1 * width)
    return fig


FILLED_FROM = 128  # from this many ranks the touching bars are drawn as one filled step outline per layer (~50x faster)


def _stacked(ax, values: list[float], bottom: list[float], width: float, label: str) -> None:
    """One layer of the per-rank stack: bars at ranks 0..W-1 on `bottom`."""
    W = len(values)
    if W < FILLED_FROM:
        ax.bar(range(W), values, width, bottom=bottom, label=label, linewidth=0)
        return
    edges = [r - 0.5 for r in range(W + 1)]  # width 1: the bars touch, so a step outline draws the same
    low = bottom + bottom[-1:]
    high = [b + v for b, v in zip(bottom, values)]
    ax.fill_between(edges, low, high + high[-1:], step="post", label=label, linewidth=0)


def save_chart(plan: ShardingPlan, path: str | Path) -> None:
    """Write `chart(plan)` as a PNG (100 dpi)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    chart(plan).savefig(path, dpi=100)
