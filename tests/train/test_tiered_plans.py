"""Tiered plans (shards in a UVM cache or host memory) on CPU: the kernels' locations, the runtime's
one warning, and training, a resharded resume that changes tiers, and serving export, in one process."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from embshard.planner import evaluate, manual_plan
from embshard.planner.plan import ShardingPlan, TablePlacement
from embshard.planner.types import Location, Shard
from embshard.runtime import collection
from embshard.runtime.lookup import FbgemmKernel, fbgemm_locations
from embshard.runtime.optim import OptimizerConfig
from embshard.runtime.routing import KernelSpec, Slot
from embshard.serving.export import ExportSettings, export
from embshard.launch import distributed
from embshard.train import config
from embshard.train.trainer import Trainer
from fbgemm_gpu.split_table_batched_embeddings_ops_common import ComputeDevice, EmbeddingLocation
from train_tables import CONFIGS, FAST_PLANNER, MODEL


def test_cuda_kernels_get_each_blocks_planned_location_and_cache():
    """The CUDA path's arguments (built without a GPU: no kernel is made here)."""
    blocks = [Slot(0, "a", 0, 0, 0, 1000, 0, 8), Slot(1, "b", 0, 0, 0, 5000, 0, 8, Location.UVM_CACHE, 250),
              Slot(2, "c", 0, 0, 0, 3000, 0, 8, Location.UVM_CACHE, 100), Slot(3, "d", 0, 0, 0, 800, 0, 8, Location.HOST)]
    locations, compute, cache_sets = fbgemm_locations(blocks, torch.device("cuda"))
    assert locations == [EmbeddingLocation.DEVICE, EmbeddingLocation.MANAGED_CACHING, EmbeddingLocation.MANAGED_CACHING,
                         EmbeddingLocation.MANAGED]
    assert compute is ComputeDevice.CUDA and cache_sets == math.ceil(350 / 32)  # 350 planned rows, 32 per set
    assert fbgemm_locations(blocks, torch.device("cpu")) == ([EmbeddingLocation.HOST] * 4, ComputeDevice.CPU, 0)


def test_a_cached_block_trains_like_an_hbm_block_on_cpu():
    def run(slot):
        spec = KernelSpec("fbgemm", "rowwise_adagrad", "fp32", (slot,), (slot,), (0,), 0)
        k = FbgemmKernel(spec, True, ["fp32"], OptimizerConfig(learning_rate=0.1), torch.device("cpu"))
        with torch.no_grad():
            k.block_weights()[0].copy_(torch.linspace(-1, 1, 40 * 8).view(40, 8))
        out = k(torch.tensor([1, 5, 5, 39]), torch.tensor([0, 2, 4]))
        (out ** 2).sum().backward()
        return out.detach(), k.block_weights()[0].clone()
    hbm = run(Slot(0, "t", 0, 0, 0, 40, 0, 8))
    cached = run(Slot(0, "t", 0, 0, 0, 40, 0, 8, Location.UVM_CACHE, 4))
    assert torch.equal(hbm[0], cached[0]) and torch.equal(hbm[1], cached[1])


def _tiered(plan: ShardingPlan, where: dict[str, Location]) -> ShardingPlan:
    placements = []
    for t in plan.tables:
        loc = where.get(t.name)
        if loc is not None:
            t = TablePlacement(t.name, t.sharding_type, t.compute_kernel, tuple(
                Shard(s.rank, s.row_offset, s.num_rows, s.col_offset, s.num_cols, loc,
                      max(1, s.num_rows // 10) if loc is Location.UVM_CACHE else 0) for s in t.shards))
        placements.append(t)
    return evaluate(plan.specs, plan.topology, placements)


def test_the_runtime_warns_once_that_cpu_memory_is_all_host_memory(monkeypatch):
    from embshard.specs import TableSpec
    from embshard.topology import Topology
    specs = [TableSpec("a", 100, 8), TableSpec("b", 50, 8)]
    topo = Topology(world_size=1, local_world_size=1, device="cpu", ddr_gib=1.0)
    hbm = manual_plan(specs, topo, {"a": ("table_wise", [0]), "b": ("table_wise", [0])})
    tiered = _tiered(hbm, {"a": Location.UVM_CACHE, "b": Location.HOST})
    monkeypatch.setattr(collection, "_noted_tiers_on_cpu", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert not collection.note_tiers_on_cpu(hbm, torch.device("cpu"))  # nothing out of HBM: nothing to say
        assert collection.note_tiers_on_cpu(tiered, torch.device("cpu"))
        assert not collection.note_tiers_on_cpu(tiered, torch.device("cpu"))  # once per process
    assert [str(w.message) for w in seen] == [
        "the plan keeps 2 table(s) in host memory or a UVM cache (a, b); on CPU all memory is host memory, so they run "
        "like the others (the plan's HBM/host split and hit rates apply on CUDA)"]
    monkeypatch.setattr(collection, "_noted_tiers_on_cpu", False)
    assert not collection.note_tiers_on_cpu(tiered, torch.device("cuda"))


def _run(config_dir: Path, out: Path, *overrides: str) -> Trainer:
    """A sharded run on one rank (a one-rank gloo group in this process) of the tiny tables, with host memory."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"hydra.searchpath=[file://{config_dir}]", "tables=tiny", *MODEL, *FAST_PLANNER,
                                          "topology.batch_size_per_rank=32", "topology.ddr_gib=1", "log_every_steps=1",
                                          "eval.every_steps=0", "eval.num_samples=32", f"out_dir={out}", *overrides])
    s = config.settings_from_config(cfg)
    s.out_dir.mkdir(parents=True, exist_ok=True)
    (s.out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    ctx = distributed.start(s.topology, 60)
    try:
        t = Trainer(s, ctx, console=None)
        t.train()
    finally:
        distributed.stop(ctx)
    return t


def _weights(t: Trainer) -> dict[str, torch.Tensor]:
    return {name: shard.weight.clone() for name, shard in t.parts.table_shards().items()}


def test_a_tiered_plan_trains_resumes_with_other_tiers_and_exports(config_dir, tmp_path):
    hbm = _run(config_dir, tmp_path / "hbm", "steps=4", "checkpoint.every_steps=2",  # two tables sharded, to tier them
               "+constraints.tables.t0.sharding_types=[table_wise]", "+constraints.tables.t4.sharding_types=[table_wise]")
    plan = ShardingPlan.load(tmp_path / "hbm" / "plan.json")
    sharded = [t.name for t in plan.tables if t.sharding_type.value != "data_parallel"]
    assert len(sharded) >= 2
    tiered = _tiered(plan, {sharded[0]: Location.UVM_CACHE, sharded[1]: Location.HOST})
    tiered.save(tmp_path / "tiered_plan.json")
    run = _run(config_dir, tmp_path / "tiered", "steps=4", "checkpoint.every_steps=2", f"plan_file={tmp_path / 'tiered_plan.json'}")
    assert ShardingPlan.load(tmp_path / "tiered" / "plan.json") == tiered
    hbm_w, tiered_w = _weights(hbm), _weights(run)
    assert hbm_w.keys() == tiered_w.keys() and all(torch.equal(hbm_w[k], tiered_w[k]) for k in hbm_w)  # unchanged on CPU
    # resume the tiered checkpoint under the all-HBM plan (tiers change): it continues exactly as the HBM run did
    resumed = _run(config_dir, tmp_path / "resumed", "steps=4", f"plan_file={tmp_path / 'hbm' / 'plan.json'}",
                   f"checkpoint.resume_from={tmp_path / 'tiered' / 'checkpoints' / 'step_000002'}")
    assert all(torch.equal(hbm_w[k], w) for k, w in _weights(resumed).items())
    # serving export of the tiered run, planned with little HBM so that its serving plan is tiered too
    out = export(ExportSettings(checkpoint=tmp_path / "tiered", out=tmp_path / "artifact", world_size=1, hbm_gib=0.00003,
                                batch_size_per_rank=8))
    served = ShardingPlan.load(out / "plan.json")
    assert served.topology.ddr_gib == 1.0 and (out / "rank_0.safetensors").is_file()
    assert any(s.location is not Location.HBM for t in served.tables for s in t.shards)
