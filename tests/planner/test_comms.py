"""Quantized communication in the planner: wire dtypes priced per element, recorded in plan.json, older files fp32."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from embshard.comms import WIRE_BYTES, CommsPrecision
from embshard.planner import ShardingPlan, manual_plan, plan
from embshard.planner.plan import SCHEMA_VERSION
from embshard.plan_cli import planner_options
from embshard.specs import TableSpec
from embshard.topology import Topology

V2_FILE = Path(__file__).parent / "data" / "plan_v2_comms.json"  # written by embshard at a549129 (schema version 2)
SPECS = [TableSpec("a", 1000, 16), TableSpec("b", 500, 8, pooled=False, feature_names=("fb",)), TableSpec("c", 64, 8)]
LAYOUT = {"a": ("row_wise", (0, 1, 2, 3)), "b": ("table_wise", (1,)), "c": ("data_parallel", ())}
TOPO = Topology(world_size=4, local_world_size=2, hbm_gib=16)


def test_version_2_file_loads_with_fp32_on_the_wire():
    v2 = ShardingPlan.load(V2_FILE)
    assert json.loads(V2_FILE.read_text())["schema_version"] == 2
    assert v2.topology.comms == CommsPrecision()
    v3 = json.loads(v2.to_json())
    assert v3["schema_version"] == SCHEMA_VERSION and "comms" not in v3["topology"]  # fp32: written, hashed as before
    assert ShardingPlan.from_json(v2.to_json()) == v2
    assert manual_plan(SPECS, TOPO, LAYOUT).input_hash == v2.input_hash
    # (its prices are not compared: since 5 the model sends int64 lengths, 8 bytes, as the runtime does)


def test_plan_records_the_wire_dtypes_and_round_trips(tmp_path):
    comms = CommsPrecision(forward="fp16", backward="bf16", dp_allreduce="bf16")
    p = plan(SPECS, TOPO, time_budget_s=0.5, comms=comms)
    assert p.topology.comms == comms
    p.save(tmp_path / "plan.json")
    raw = json.loads((tmp_path / "plan.json").read_text())
    assert raw["topology"]["comms"] == {"forward": "fp16", "backward": "bf16", "dp_allreduce": "bf16"}
    assert ShardingPlan.load(tmp_path / "plan.json") == p


@pytest.mark.parametrize("forward,backward,dp", [("fp16", "bf16", "fp32"), ("bf16", "fp32", "fp16"), ("fp32", "fp16", "bf16")])
def test_cost_model_prices_bytes_per_element(forward, backward, dp):
    """Datasheet model (no per-byte work): output dist and the data-parallel all-reduce scale with the wire bytes
    (column-wise here: row-wise partial sums are first summed inside a host, in fp32, runtime/host_reduce.py)."""
    layout = {**LAYOUT, "a": ("column_wise", (0, 3))}
    full = manual_plan(SPECS, TOPO, layout)
    quant = manual_plan(SPECS, replace(TOPO, comms=CommsPrecision(forward, backward, dp)), layout)
    scale = {k: WIRE_BYTES[v] / WIRE_BYTES["fp32"] for k, v in (("fwd", forward), ("bwd", backward), ("dp", dp))}
    for a, b in zip(full.ranks, quant.ranks):
        assert a.perf.output_dist_fwd_ms > 0 and a.perf.dp_allreduce_ms > 0
        assert math.isclose(b.perf.output_dist_fwd_ms, scale["fwd"] * a.perf.output_dist_fwd_ms, rel_tol=1e-12)
        assert math.isclose(b.perf.output_dist_bwd_ms, scale["bwd"] * a.perf.output_dist_bwd_ms, rel_tol=1e-12)
        assert math.isclose(b.perf.dp_allreduce_ms, scale["dp"] * a.perf.dp_allreduce_ms, rel_tol=1e-12)
        assert b.perf.input_dist_ms == a.perf.input_dist_ms and b.perf.lookup_fwd_ms == a.perf.lookup_fwd_ms


def test_bad_wire_dtypes_are_named():
    with pytest.raises(ValueError, match=r"comms.forward: 'int8' is not a wire dtype; give one of \['fp32', 'fp16', 'bf16'\]"):
        CommsPrecision(forward="int8")
    with pytest.raises(ValueError, match=r"topology.comms.backward: 'fp8'"):
        Topology.from_dict({"world_size": 2, "comms": {"backward": "fp8"}})
    with pytest.raises(ValueError, match=r"planner.comms: unknown key\(s\) \['fwd'\]"):
        planner_options({"comms": {"fwd": "fp16"}})
    assert planner_options({"comms": {"forward": "bf16"}})["comms"] == CommsPrecision(forward="bf16")
    with pytest.raises(ValueError, match=r"plan: comms=.* but the topology says .*; set the wire dtypes in one place"):
        plan(SPECS, replace(TOPO, comms=CommsPrecision(forward="fp16")), time_budget_s=0.5, comms=CommsPrecision())
