"""An exported plan runs in TorchRec's DistributedModelParallel on 2 gloo ranks and matches
the unsharded modules: every pooled layout, and the sequence layouts TorchRec runs on CPU,
in one spawn (tests/interop/dmp_worker.py is each rank)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from embshard.planner import manual_plan
from embshard.ports import free_port
from embshard.specs import TableSpec
from embshard.topology import Topology

WORKER = Path(__file__).with_name("dmp_worker.py")
WORLD_SIZE = 2
TOLERANCE = 1e-5

SPECS = (
    TableSpec("tw", 40, 8),
    TableSpec("tw_two_features", 15, 4, feature_names=("f1", "f2")),
    TableSpec("rw", 37, 8),
    TableSpec("cw_uneven", 20, 12),
    TableSpec("twrw", 30, 8),
    TableSpec("twcw", 25, 16),
    TableSpec("dp", 10, 8),
    TableSpec("seq_tw", 11, 8, pooled=False),
    TableSpec("seq_rw", 13, 8, pooled=False),
    TableSpec("seq_cw", 9, 8, pooled=False),
)
LAYOUT = {
    "tw": ("table_wise", [1]),
    "tw_two_features": ("table_wise", [0]),
    "rw": ("row_wise", [0, 1]),
    "cw_uneven": ("column_wise", [1, 0]),  # 8 + 4 columns, first block on rank 1
    "twrw": ("table_row_wise", [0, 1]),
    "twcw": ("table_column_wise", [0, 1]),
    "dp": ("data_parallel", []),
    "seq_tw": ("table_wise", [1]),
    "seq_rw": ("row_wise", [0, 1]),
    "seq_cw": ("column_wise", [1, 0]),
}


@pytest.mark.timeout(240)
def test_dmp_with_exported_plan_matches_unsharded(tmp_path):
    plan = manual_plan(SPECS, Topology(world_size=WORLD_SIZE, local_world_size=WORLD_SIZE, hbm_gib=1.0, device="cpu"), LAYOUT)
    plan_path = tmp_path / "plan.json"
    plan.save(plan_path)
    port = str(free_port())
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(rank), str(WORLD_SIZE), port, str(plan_path), str(tmp_path / f"out{rank}.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(WORLD_SIZE)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=180)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("DMP workers did not finish within 180 s")
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"

    for rank in range(WORLD_SIZE):
        result = json.loads((tmp_path / f"out{rank}.json").read_text())
        assert set(result["max_abs_diff"]) == {s.name for s in SPECS}
        worst = {t: d for t, d in result["max_abs_diff"].items() if d > TOLERANCE}
        assert not worst, f"rank {rank}: outputs differ from the unsharded modules: {worst}"
        for t in plan.tables:
            if t.sharding_type.value == "data_parallel":
                continue
            want = sorted([s.row_offset, s.col_offset, s.num_rows, s.num_cols] for s in t.shards if s.rank == rank)
            assert sorted(result["local_shards"][t.name]) == want, f"rank {rank}, table {t.name}"
