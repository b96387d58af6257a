"""ShardingPlan JSON: round trip, versioning, and rejection of damaged files."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from embshard.planner import ShardingPlan, evaluate, manual_plan, plan
from embshard.planner.cost.traffic import rank_traffic_bytes
from embshard.planner.plan import SCHEMA_VERSION, Replicas
from embshard.planner.types import Shard
from embshard.specs import TableSpec
from embshard.topology import DEVICE_DEFAULTS, Topology
from embshard.workloads import generate_tables


@pytest.fixture(scope="module")
def a_plan():
    specs = generate_tables(30, seed=2, sequence_fraction=0.3)
    return plan(specs, Topology(world_size=8, local_world_size=4, hbm_gib=32), time_budget_s=2)


def test_round_trip_is_identical(a_plan, tmp_path):
    path = tmp_path / "plan.json"
    a_plan.save(path)
    loaded = ShardingPlan.load(path)
    assert loaded == a_plan
    assert loaded.to_json() == a_plan.to_json()


def test_json_has_the_documented_fields(a_plan):
    raw = json.loads(a_plan.to_json())
    assert raw["schema_version"] == SCHEMA_VERSION and raw["input_hash"].startswith("sha256:")
    kinds = {t["sharding_type"] for t in raw["tables"]}
    assert "data_parallel" in kinds and len(kinds) > 1
    for t in raw["tables"]:
        if t["sharding_type"] == "data_parallel":  # stored once: its ranks are all ranks; with its mode
            assert set(t) == {"name", "sharding_type", "compute_kernel", "data_parallel_mode"}
            assert t["data_parallel_mode"] in ("allreduce", "replicated_lookup")
        else:
            assert set(t) == {"name", "sharding_type", "compute_kernel", "shards"}
            assert set(t["shards"][0]) == {"rank", "row_offset", "num_rows", "col_offset", "num_cols"}
    assert set(raw["ranks"][0]) == {"rank", "perf_ms", "memory_bytes", "traffic_bytes"}
    assert set(raw["ranks"][0]["traffic_bytes"]) == {"intra_host_sent", "intra_host_received", "inter_host_sent",
                                                     "inter_host_received"}
    assert raw["lower_bound_ms"] <= raw["objective_ms"]
    assert raw["topology"]["world_size"] == 8


def test_hash_depends_on_inputs():
    specs = [TableSpec("a", 100, 8)]
    p1 = plan(specs, Topology(world_size=2, local_world_size=2, hbm_gib=1), time_budget_s=1)
    p2 = plan(specs, Topology(world_size=2, local_world_size=2, hbm_gib=2), time_budget_s=1)
    assert p1.input_hash != p2.input_hash


V1_FILE = Path(__file__).parent / "data" / "plan_v1.json"  # written by embshard at 73e7d45 (schema version 1)


def test_version_1_file_loads_to_the_same_plan_as_version_2():
    v1 = ShardingPlan.load(V1_FILE)
    raw_v1 = json.loads(V1_FILE.read_text())
    assert raw_v1["schema_version"] == 1
    v2_text = v1.to_json()
    assert json.loads(v2_text)["schema_version"] == SCHEMA_VERSION
    v2 = ShardingPlan.from_json(v2_text)
    assert v2 == v1 and v2.input_hash == v1.input_hash == raw_v1["input_hash"]
    assert v2.max_rank_ms == raw_v1["objective_ms"]
    dp = [t for t in raw_v1["tables"] if t["sharding_type"] == "data_parallel"]
    assert dp and all(len(t["shards"]) == 4 for t in dp)
    for t in dp:  # the v1 per-rank copies are exactly what a v2 data-parallel table stands for
        listed = sorted((Shard(**s) for s in t["shards"]), key=lambda s: s.rank)
        assert list(v2.placement(t["name"]).shards) == listed and v2.placement(t["name"]).ranks == (0, 1, 2, 3)
    others = {t["name"]: t["shards"] for t in raw_v1["tables"] if t["sharding_type"] != "data_parallel"}
    assert {t["name"]: t["shards"] for t in json.loads(v2_text)["tables"] if "shards" in t} == others


V2_DP_FILE = Path(__file__).parent / "data" / "plan_v2_dp.json"  # written by embshard at a549129 (schema version 2)


def test_version_2_file_loads_with_its_topology_data_parallel_mode():
    """v2 records no per-table mode: its data-parallel tables train as its topology says, as they did."""
    raw = json.loads(V2_DP_FILE.read_text())
    assert raw["schema_version"] == 2 and raw["topology"]["replicated_dp_lookup"] is True
    v2 = ShardingPlan.load(V2_DP_FILE)
    modes = {t.name: t.data_parallel_mode for t in v2.tables}
    assert modes == {"big": "replicated_lookup", "tiny": "replicated_lookup", "tw": None}
    v3 = ShardingPlan.from_json(v2.to_json())
    assert v3 == v2 and json.loads(v2.to_json())["schema_version"] == SCHEMA_VERSION


V2_TRAFFIC_FILE = Path(__file__).parent / "data" / "plan_v2_traffic.json"  # written by embshard at 394f892 (schema version 2)


def test_version_2_file_loads_and_gains_its_traffic_bytes():
    raw = json.loads(V2_TRAFFIC_FILE.read_text())
    assert raw["schema_version"] == 2 and "traffic_bytes" not in raw["ranks"][0]
    v2 = ShardingPlan.load(V2_TRAFFIC_FILE)
    assert v2.max_rank_ms == raw["objective_ms"] and [r["perf_ms"] for r in raw["ranks"]] == [r.perf.to_dict() for r in v2.ranks]
    written = json.loads(v2.to_json())
    assert written["schema_version"] == SCHEMA_VERSION
    assert [r["traffic_bytes"] for r in written["ranks"]] == [t.to_dict() for t in v2.traffic]
    assert ShardingPlan.from_json(v2.to_json()) == v2


def test_traffic_bytes_are_the_cost_models_and_round_trip():
    """2 hosts x 2 ranks: a row_wise table over all 4 ranks (reduced in each host), a table_wise
    one on rank 1, a data-parallel one (hierarchical all-reduce). Rank 0's bytes per step, by hand (B = 8):
    a (2 features, P = 2, 64 rows, 16 per shard, dim 8): to each other rank's shard 2 features x
      (8 lengths + 4 ids) x 8 bytes = 192, and as much from each. Partial sums: 8 samples x 2
      features x 8 floats = 512 bytes per sample owner. Host 0's reducers: rank 0 for owners 0 and
      2, rank 1 for owners 1 and 3; host 1's: rank 2 for owners 0 and 2, rank 3 for 1 and 3. So rank
      0 sends rank 1 its sums for owners 1 and 3 (2 x 512 intra), receives rank 1's for 0 and 2
      (2 x 512 intra), sends host 0's sums for owner 2 to rank 2 (512 inter) and receives host 1's
      for itself from rank 2 (512 inter); backward mirrors every message.
    b (table_wise on rank 1, dim 4, P = 1): 8 lengths + 8 ids = 128 bytes to rank 1; 8 x 4 floats
      = 128 back, and their gradient (128) to rank 1.
    c (data-parallel, 30 x 8, sgd: no id counts): an all-reduce of 30 x 8 = 240 floats, hierarchical (it
      pays: NVLink in the host): rank 0 owns the first 120; reduce-scatter and all-gather inside the host each
      send 120 floats to rank 1 and receive 120 from it; the ring across hosts of those 120 (chunks 60, 60)
      with rank 2 sends 2 x (120 - 60) floats and receives as many."""
    topo = Topology(world_size=4, local_world_size=2, hbm_gib=1, batch_size_per_rank=8)
    specs = [TableSpec("a", 64, 8, pooling_factor=2, feature_names=("a1", "a2")), TableSpec("b", 40, 4),
             TableSpec("c", 30, 8)]
    p = manual_plan(specs, topo, {"a": ("row_wise", (0, 1, 2, 3)), "b": ("table_wise", (1,)), "c": ("data_parallel", ())})
    t = p.traffic[0]
    in_host = 2 * 120 * 4
    assert t.intra_host_sent == 192 + 2 * 2 * 512 + 128 + 128 + in_host
    assert t.intra_host_received == 192 + 2 * 2 * 512 + 128 + in_host
    assert t.inter_host_sent == 2 * 192 + 2 * 512 + 2 * (120 - 60) * 4
    assert t.inter_host_received == 2 * 192 + 2 * 512 + 2 * (120 - 60) * 4
    flat = evaluate(specs, replace(topo, reduce_in_host=False), p.tables).traffic[0]  # c still all-reduced
    # flat: rank 0 sends its partial sums to each other owner and receives each other shard's for itself
    # (512 each; backward mirrors); the ring sends 2 x (240 - 60) floats to rank 1, receives as many from rank 3
    ring = 2 * (240 - 60) * 4
    assert (flat.intra_host_sent, flat.intra_host_received) == (192 + 2 * 512 + 128 + 128 + ring, 192 + 2 * 512 + 128)
    assert (flat.inter_host_sent, flat.inter_host_received) == (2 * 192 + 4 * 512, 2 * 192 + 4 * 512 + ring)
    assert json.loads(p.to_json())["ranks"][0]["traffic_bytes"] == t.to_dict()
    assert ShardingPlan.from_json(p.to_json()).traffic == p.traffic


def test_data_parallel_tables_do_not_grow_the_file_with_ranks():
    specs = [TableSpec(f"t{i}", 1000, 16) for i in range(20)]
    sizes = {}
    for W in (8, 512):
        p = manual_plan(specs, Topology(world_size=W, local_world_size=8, hbm_gib=16),
                        {s.name: ("data_parallel", ()) for s in specs})
        assert isinstance(p.tables[0].shards, Replicas) and len(p.tables[0].shards) == W
        assert ShardingPlan.from_json(p.to_json()) == p
        sizes[W] = len(json.dumps(json.loads(p.to_json())["tables"]))
    assert sizes[512] == sizes[8] < 2600


V2_HOT_FILE = Path(__file__).parent / "data" / "plan_v2_hot.json"  # written by embshard at a549129 (schema version 2)


def test_version_2_file_loads_without_hot_rows():
    raw_v2 = json.loads(V2_HOT_FILE.read_text())
    assert raw_v2["schema_version"] == 2
    v2 = ShardingPlan.load(V2_HOT_FILE)
    assert all(t.hot_rows == 0 for t in v2.tables) and v2.hot_ids_file == ""
    v3 = json.loads(v2.to_json())
    assert v3["schema_version"] == SCHEMA_VERSION and "hot_ids_file" not in v3 and all("hot_rows" not in t for t in v3["tables"])
    assert ShardingPlan.from_json(v2.to_json()) == v2 and v2.input_hash == raw_v2["input_hash"]


def test_hot_rows_and_hot_ids_file_round_trip(a_plan):
    table = next(t for t in a_plan.tables if t.sharding_type.value != "data_parallel")
    hot = replace(a_plan, tables=tuple(replace(t, hot_rows=7) if t is table else t for t in a_plan.tables),
                  hot_ids_file="/data/hot_ids.npz")
    raw = json.loads(hot.to_json())
    assert raw["hot_ids_file"] == "/data/hot_ids.npz"
    assert [t.get("hot_rows", 0) for t in raw["tables"]] == [7 if t["name"] == table.name else 0 for t in raw["tables"]]
    assert ShardingPlan.from_json(hot.to_json()) == hot


def _first(kind_is_dp: bool):
    return lambda d: next(t for t in d["tables"] if (t["sharding_type"] == "data_parallel") == kind_is_dp)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d.update(schema_version=99), "schema_version"),
    (lambda d: d.pop("tables"), "plan.tables: missing"),
    (lambda d: _first(False)(d)["shards"][0].update(rank=999), "is not a rank"),
    (lambda d: d["tables"][0].update(sharding_type="diagonal"), "unknown sharding type 'diagonal'"),
    (lambda d: _first(False)(d)["shards"][0].update(num_rows=10**12), "outside the"),
    (lambda d: d["tables"].pop(), "do not match the table specs"),
    (lambda d: _first(True)(d).update(shards=[]), "lists no shards in schema version"),
    (lambda d: _first(True)(d).update(data_parallel_mode="sometimes"), "data_parallel_mode: 'sometimes'"),
    (lambda d: _first(False)(d).update(data_parallel_mode="allreduce"), "only data_parallel tables have one"),
    (lambda d: _first(False)(d).update(hot_rows=-1), "hot_rows: -1 hot rows"),
    (lambda d: _first(True)(d).update(hot_rows=3), "and 0 for data_parallel"),
])
def test_damaged_plan_is_rejected(a_plan, damage, message):
    raw = json.loads(a_plan.to_json())
    damage(raw)
    with pytest.raises(ValueError, match=message):
        ShardingPlan.from_json(json.dumps(raw))


def test_damaged_version_1_data_parallel_table_is_rejected():
    raw = json.loads(V1_FILE.read_text())
    _first(True)(raw)["shards"].pop()
    with pytest.raises(ValueError, match="a data_parallel table lists one full shard on every rank"):
        ShardingPlan.from_dict(raw)


def test_not_json_is_rejected(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        ShardingPlan.load(path)


V3_FILE = Path(__file__).parent / "data" / "plan_v3.json"  # written by embshard at 3d0c275 (schema 3: shard locations)


def test_version_3_file_keeps_its_locations_and_takes_its_topology_data_parallel_mode():
    raw = json.loads(V3_FILE.read_text())
    assert raw["schema_version"] == 3
    v3 = ShardingPlan.load(V3_FILE)
    located = {(t["name"], s["rank"]): (s.get("location", "hbm"), s.get("cache_rows", 0))
               for t in raw["tables"] for s in t.get("shards", ())}
    assert {(t.name, s.rank): (s.location.value, s.cache_rows) for t in v3.tables for s in t.shards} == located
    assert any(loc != "hbm" for loc, _ in located.values())
    assert all(t.data_parallel_mode == (v3.topology.data_parallel_mode if t.sharding_type.value == "data_parallel" else None)
               for t in v3.tables)
    again = ShardingPlan.from_json(v3.to_json())
    assert again == v3 and json.loads(v3.to_json())["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize("version", [4, 5, 6])
def test_versions_4_to_6_load_with_their_modes_bytes_and_wire_dtypes(version):
    """Written by embshard at 45a74aa (4: data-parallel modes), efb79a9 (5: traffic bytes), a5b36a5 (6: wire dtypes)."""
    path = Path(__file__).parent / "data" / f"plan_v{version}.json"
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == version
    p = ShardingPlan.load(path)
    assert {t.name: t.data_parallel_mode for t in p.tables} == {t["name"]: t.get("data_parallel_mode") for t in raw["tables"]}
    assert {t.data_parallel_mode for t in p.tables} == {None, "allreduce", "replicated_lookup"}
    if version >= 5:  # traffic bytes are derived from the placement: the file's were the model's when written, a ring
        # all-reduce (hierarchical since version 8, where it pays); since, the all-reduce of data-parallel tables
        # carries no id counts but adam's: a ring moves at most 2 x 4 bytes per row less each way
        ar = [t for t in p.tables if t.data_parallel_mode == "allreduce"]
        rest = rank_traffic_bytes(p.specs, p.topology, [t for t in p.tables if t not in ar])
        ring = rank_traffic_bytes(p.specs, replace(p.topology, reduce_in_host=False), ar)
        specs = {s["name"]: s for s in raw["specs"]}
        fewer = 2 * 4 * sum(specs[t.name]["num_embeddings"] for t in ar if specs[t.name]["optimizer"] != "adam")
        diffs = [r["traffic_bytes"][f] - v for r, a, b in zip(raw["ranks"], rest, ring) for f, v in (a + b).to_dict().items()]
        assert all(0 <= d <= fewer for d in diffs) and max(diffs) > 0
    assert (p.topology.comms.forward, p.topology.comms.backward) == (("fp16", "bf16") if version == 6 else ("fp32", "fp32"))
    assert all(t.hot_rows == 0 for t in p.tables) and p.input_hash == raw["input_hash"]
    again = json.loads(p.to_json())
    assert again["schema_version"] == SCHEMA_VERSION and ShardingPlan.from_json(p.to_json()) == p


def test_version_7_loads_with_in_host_reduction_on():
    """Written by main's embshard at 3be5606 (schema 7, before ``topology.reduce_in_host``): it loads with the
    in-host reduction on, as version 7 ran it, and is written back as the current version without the key."""
    path = Path(__file__).parent / "data" / "plan_v7.json"
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 7 and "reduce_in_host" not in raw["topology"]
    p = ShardingPlan.load(path)
    assert p.topology.reduce_in_host and p.topology.num_hosts == 2
    assert [(t.name, t.sharding_type.value) for t in p.tables] == [(t["name"], t["sharding_type"]) for t in raw["tables"]]
    again = json.loads(p.to_json())
    assert again["schema_version"] == SCHEMA_VERSION == 13 and "reduce_in_host" not in again["topology"]
    assert ShardingPlan.from_json(p.to_json()) == p
    flat = ShardingPlan.from_dict({**again, "topology": {**again["topology"], "reduce_in_host": False}})
    inter = lambda q: sum(t.inter_host_sent for t in q.traffic)  # noqa: E731
    assert not flat.topology.reduce_in_host and inter(flat) > inter(p)  # flat collectives send more across hosts


def test_version_8_loads_with_flat_collectives():
    """Written by h11's embshard at 9ee1745 (schema 8, before ``topology.sharded_dp_update``): flat
    collectives across 2 hosts load as such, with the file's predicted bytes, and are written back as the
    current version, reduce_in_host kept, no sharded_dp_update."""
    path = Path(__file__).parent / "data" / "plan_v8.json"
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 8 and raw["topology"]["reduce_in_host"] is False
    p = ShardingPlan.load(path)
    assert not p.topology.reduce_in_host and not p.topology.sharded_dp_update and p.topology.num_hosts == 2
    assert [r["traffic_bytes"] for r in raw["ranks"]] == [t.to_dict() for t in p.traffic]
    again = json.loads(p.to_json())
    assert again["schema_version"] == SCHEMA_VERSION == 13 and again["topology"]["reduce_in_host"] is False
    assert "sharded_dp_update" not in again["topology"] and ShardingPlan.from_json(p.to_json()) == p


def test_version_9_loads_without_the_in_host_reduction_terms():
    """Written by main's embshard at b130e12 (schema 9, before the in-host reduction's calibrated terms): a
    row-wise table over 2 hosts x 2 ranks on the cpu_gloo_measured profile loads with those terms 0, and is
    written back as the current version without them (absent when 0)."""
    path = Path(__file__).parent / "data" / "plan_v9.json"
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 9 and "host_reduce_fwd_ns_per_byte" not in raw["topology"]
    p = ShardingPlan.load(path)
    assert p.topology.num_hosts == 2 and p.topology.reduces_in_host
    assert (p.topology.host_reduce_fwd_ns_per_byte, p.topology.host_reduce_bwd_ns_per_byte, p.topology.host_reduce_call_ms) == (0, 0, 0)
    assert p.topology.collective_ms == raw["topology"]["collective_ms"]
    again = json.loads(p.to_json())
    assert again["schema_version"] == SCHEMA_VERSION == 13 and not any(k.startswith("host_reduce") for k in again["topology"])
    assert ShardingPlan.from_json(p.to_json()) == p


def test_version_11_loads_without_the_hierarchical_all_reduce_terms():
    """Written by main's embshard at 8e3a572 (schema 11, before the hierarchical all-reduce's calibrated terms; h11b's schema-10 file of e204e60, loaded and written again): a
    row-wise table and two data-parallel ones over 2 hosts x 2 ranks on the cpu_gloo_measured profile, with the
    in-host reduction's terms, load with dp_hier_* 0 (the hierarchy priced by its bytes alone, as before) and are written back without them."""
    path = Path(__file__).parent / "data" / "plan_v11.json"
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 11 and raw["topology"]["host_reduce_fwd_ns_per_byte"] == 0.899
    p = ShardingPlan.load(path)
    assert (p.topology.dp_hier_ns_per_byte, p.topology.dp_hier_call_ms) == (0, 0) and p.topology.num_hosts == 2
    assert [r.perf.total_ms for r in p.ranks] == [r["perf_ms"]["total_ms"] for r in raw["ranks"]]  # the file's report, kept
    again = json.loads(p.to_json())
    assert again["schema_version"] == SCHEMA_VERSION == 13 and not any(k.startswith("dp_hier") for k in again["topology"])
    assert ShardingPlan.from_json(p.to_json()) == p


def test_version_10_loads_with_the_default_dense_rate():
    """Written by main's embshard at e204e60 (schema 10, before ``topology.dp_dense_gb_per_s``; the schema-9 file h12 wrote at 6d026fb, loaded and written again) on the calibrated cpu
    profile: it loads with the cpu default rate for the all-reduce mode's dense work, not the profile's lookup
    bandwidth, and is written back as the current version without the key; a measured rate is kept."""
    path = Path(__file__).parent / "data" / "plan_v10.json"
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 10 and "dp_dense_gb_per_s" not in raw["topology"]
    p = ShardingPlan.load(path)
    assert p.topology.dp_dense_gb_per_s == DEVICE_DEFAULTS["cpu"]["dp_dense_gb_per_s"] < p.topology.hbm_gb_per_s == 2130.85
    assert [(t.name, t.data_parallel_mode) for t in p.tables] == [(t["name"], t.get("data_parallel_mode")) for t in raw["tables"]]
    again = json.loads(p.to_json())
    assert again["schema_version"] == SCHEMA_VERSION == 13 and "dp_dense_gb_per_s" not in again["topology"]
    assert again["input_hash"] == raw["input_hash"] and ShardingPlan.from_json(p.to_json()) == p
    measured = ShardingPlan.from_dict({**again, "topology": {**again["topology"], "dp_dense_gb_per_s": 3.5}})
    assert measured.topology.dp_dense_gb_per_s == 3.5 and json.loads(measured.to_json())["topology"]["dp_dense_gb_per_s"] == 3.5


def test_version_12_loads_pricing_a_shared_table_as_before():
    """Written by main's embshard at b925992 (schema 12, before the shared-table backward terms) on the shipped
    cpu_gloo_measured profile: a pooled table 3 features look up (row-wise) and one of one feature. It loads with
    lookup_bwd_shared_ns_per_row = lookup_bwd_ns_per_row and no per-byte term (the shared table priced as one of one
    feature, as the file was), re-evaluates to the file's report, and is written back as the current version without the keys."""
    path = Path(__file__).parent / "data" / "plan_v12.json"
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 12 and len(raw["specs"][0]["feature_names"]) == 3
    p = ShardingPlan.load(path)
    assert (p.topology.lookup_bwd_shared_ns_per_row, p.topology.lookup_bwd_shared_ns_per_row_byte) == (raw["topology"]["lookup_bwd_ns_per_row"], 0)
    again_ms = [r.perf.total_ms for r in evaluate(p.specs, p.topology, p.tables).ranks]
    assert again_ms == pytest.approx([r["perf_ms"]["total_ms"] for r in raw["ranks"]], rel=1e-9)
    again = json.loads(p.to_json())
    assert again["schema_version"] == SCHEMA_VERSION == 13 and not any("shared" in k for k in again["topology"])
    assert again["input_hash"] == raw["input_hash"] and ShardingPlan.from_json(p.to_json()) == p
    fitted = ShardingPlan.from_dict({**again, "topology": {**again["topology"], "lookup_bwd_shared_ns_per_row": 50.0,
                                                           "lookup_bwd_shared_ns_per_row_byte": 0.1}})
    assert json.loads(fitted.to_json())["topology"]["lookup_bwd_shared_ns_per_row_byte"] == 0.1
    assert ShardingPlan.from_json(fitted.to_json()) == fitted
