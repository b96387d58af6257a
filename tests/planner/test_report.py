"""Report views of a hand-built plan: rank table order and truncation, summary numbers, chart."""

from __future__ import annotations

import io

import matplotlib.image
import pytest
from rich.console import Console

from embshard.planner.plan import RankReport, ShardingPlan, TablePlacement
from embshard.planner.report import chart, rank_table, save_chart, shards_per_rank, sharding_type_counts, summary
from embshard.planner.types import COMPUTE_KERNEL, Perf, Shard, ShardingType, Storage
from embshard.specs import TableSpec
from embshard.topology import GIB, Topology


def make_plan(world_size: int = 4, hbm_gib: float = 1.0) -> ShardingPlan:
    """Table a row-wise over ranks 0-1, b table-wise on rank 2, c data-parallel; rank r costs r+1 ms."""
    topo = Topology(world_size=world_size, local_world_size=2, hbm_gib=hbm_gib)
    specs = (TableSpec("a", 100, 16), TableSpec("b", 10, 8), TableSpec("c", 4, 4))
    tw, rw, dp = ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL
    tables = (
        TablePlacement("a", rw, COMPUTE_KERNEL[rw], (Shard(0, 0, 50, 0, 16), Shard(1, 50, 50, 0, 16))),
        TablePlacement("b", tw, COMPUTE_KERNEL[tw], (Shard(2, 0, 10, 0, 8),)),
        TablePlacement("c", dp, COMPUTE_KERNEL[dp], tuple(Shard(r, 0, 4, 0, 4) for r in range(world_size))),
    )
    ranks = tuple(
        RankReport(r, Perf(input_dist_ms=0.5, lookup_fwd_ms=r + 0.5), Storage(weights_bytes=(r + 1) * GIB // 10, optimizer_bytes=1024))
        for r in range(world_size)
    )
    return ShardingPlan(tables, specs, topo, ranks, lower_bound_ms=2.0, input_hash="sha256:test", search={"method": "hand", "wall_s": 0.123456})


def render(table) -> list[str]:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(table)
    return console.file.getvalue().splitlines()


def test_rank_table_lists_ranks_slowest_first():
    plan = make_plan()
    table = rank_table(plan)
    assert table.row_count == 4
    assert list(table.columns[0].cells) == ["3", "2", "1", "0"]
    assert list(table.columns[1].cells) == ["1", "1", "0", "0"]  # host of each rank, 2 ranks per host
    assert list(table.columns[2].cells) == ["1", "2", "2", "2"]  # shards: rank 3 holds only c
    headers = [c.header for c in table.columns]
    total = headers.index("total ms")
    assert list(table.columns[total].cells) == ["4.000", "3.000", "2.000", "1.000"]
    assert list(table.columns[total + 1].cells) == ["1.60", "1.20", "0.80", "0.40"]  # / mean 2.5 ms
    assert headers[3] == "mem GiB / 0.9"  # 1 GiB minus the 10% reserve
    assert list(table.columns[4].cells) == ["44", "33", "22", "11"]  # % of the 0.9 GiB cap
    assert any("total ms" in line for line in render(table))


def test_rank_table_truncates_to_slowest_and_fastest():
    plan = make_plan(world_size=10)
    table = rank_table(plan, max_ranks=4)
    assert list(table.columns[0].cells) == ["9", "8", "7", "…", "0"]
    assert "3 slowest and the fastest of 10 ranks" in table.caption
    with pytest.raises(ValueError, match="max_ranks"):
        rank_table(plan, max_ranks=1)


def test_summary_numbers():
    plan = make_plan()
    text = summary(plan, planning_s=1.234)
    assert "tables: 3 on 4 ranks (2 hosts x 2, cuda)" in text
    assert "objective: 4.000 ms (slowest rank 3); lower bound 2.000 ms; gap 100.0%; imbalance 1.600" in text
    assert "memory: max 0.40 of 0.90 GiB (rank 3)" in text
    assert "sharding: data_parallel 1, table_wise 1, row_wise 1 (7 shards)" in text
    assert "search: planning 1.23 s; method=hand, wall_s=0.123" in text
    assert "planning" not in summary(plan)


def test_counts():
    plan = make_plan()
    assert shards_per_rank(plan) == [2, 2, 2, 1]
    assert sharding_type_counts(plan) == {"data_parallel": 1, "table_wise": 1, "row_wise": 1}


def test_save_chart_writes_png(tmp_path):
    path = tmp_path / "sub" / "plan.png"
    save_chart(make_plan(world_size=16), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(path).shape
    assert (width, height) == (800, 750)  # 8 x 7.5 inches at 100 dpi


@pytest.mark.parametrize("world_size, ticks", [(2, [0, 1]), (16, list(range(16))), (24, list(range(0, 24, 2))),
                                               (1024, list(range(0, 1024, 64)))])
def test_chart_ranks_are_integer_ticks_inside_the_bars(world_size, ticks):
    load_ax, mem_ax = chart(make_plan(world_size=world_size)).axes[:2]
    assert list(mem_ax.get_xticks()) == ticks
    assert mem_ax.xaxis.get_major_formatter().format_ticks(mem_ax.get_xticks()) == [str(t) for t in ticks]
    low, high = mem_ax.get_xlim()
    assert -1 < low < -0.4 and world_size - 0.6 < high < world_size  # no empty margin beyond the first and last bar
    assert load_ax.get_xlim() == (low, high)


def test_chart_memory_axis_fits_the_data_and_names_the_cap():
    # 0.1 and 0.2 GiB used of a 14.4 GiB cap: on a 0-14.4 axis the bars would look empty
    fig = chart(make_plan(world_size=2, hbm_gib=16))
    mem_ax = fig.axes[1]
    used_mib = 0.2 * 1024 + 1024 / 2**20  # rank 1: (1+1)/10 GiB of weights and 1 KiB of optimizer state
    assert mem_ax.get_ylabel() == "MiB per rank"
    assert mem_ax.get_ylim() == pytest.approx((0, 1.2 * used_mib), rel=1e-6)
    assert mem_ax.get_title() == "memory: fullest rank 1 holds 205 MiB, 1.4% of the 14.4 GiB cap (cap off scale)"
    assert [t.get_text() for t in mem_ax.texts] == ["102", "205"]  # each bar's value
    assert not mem_ax.get_lines()  # the cap is not drawn far above the bars
    # 0.2 of a 0.27 GiB cap: the cap is in view, drawn as a line
    mem_ax = chart(make_plan(world_size=2, hbm_gib=0.3)).axes[1]
    cap_mib = 0.3 * 0.9 * 1024
    assert [line.get_ydata()[0] for line in mem_ax.get_lines()] == pytest.approx([cap_mib])
    assert mem_ax.get_ylim() == pytest.approx((0, 1.05 * cap_mib), rel=1e-6)
    assert mem_ax.get_title().endswith("74.1% of the 0.27 GiB cap")
