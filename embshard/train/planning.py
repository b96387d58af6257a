"""The run's sharding plan: planned (or loaded from ``plan_file``) once on rank 0, shared with
every rank as JSON, reported, and saved beside the run's other outputs. The planner keeps at
least the dense layers' memory free on every rank (`planning_topology`; their optimizer state
divided over the ranks under ``optim.sharded_update``)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from embshard import planner
from embshard.data.batch import NUM_DENSE
from embshard.models.dlrm import DLRM
from embshard.planner.cost.dense import dense_bytes_per_rank, reserve_dense, state_floats
from embshard.planner.plan import ShardingPlan
from embshard.planner.report import rank_table, save_chart, summary
from embshard.topology import Topology
from embshard.train.config import TrainSettings
from embshard.launch.distributed import RankContext, on_main


def run_plan(settings: TrainSettings, ctx: RankContext, console: Console | None) -> ShardingPlan:
    """The plan for this run's tables on ``ctx.world_size`` ranks; rank 0 prints its report."""
    def build() -> tuple[str, float]:
        t0 = time.perf_counter()
        if settings.plan_file:
            plan = ShardingPlan.load(settings.plan_file)
            check_plan_file(plan, settings, ctx.world_size)
        else:
            p = settings.planner
            plan = planner.plan(settings.specs, planning_topology(settings), settings.constraints, time_budget_s=p.time_budget_s,
                                use_ilp=p.use_ilp, ilp_time_s=p.ilp_time_s, torchrec_compatible=p.torchrec_compatible,
                                comms=p.comms)
        return plan.to_json(), time.perf_counter() - t0

    text, planning_s = on_main(ctx, build)
    plan = ShardingPlan.from_json(text)
    if console is not None:
        console.print(rank_table(plan))
        console.print(summary(plan, None if settings.plan_file else planning_s), markup=False, highlight=False)
    return plan


def planning_topology(settings: TrainSettings) -> Topology:
    """The run's topology with at least its dense layers' bytes reserved on every rank (embshard.planner.cost.dense),
    and ``sharded_dp_update`` as ``optim.sharded_update`` says."""
    with torch.device("meta"):  # sizes only: nothing is allocated
        model = DLRM(settings.model, settings.specs, NUM_DENSE, embedding_device="meta")
    embedding = {id(p) for m in model.modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))
                 for p in m.parameters()}
    numels = [p.numel() for p in model.parameters() if id(p) not in embedding]
    dense = settings.optim.dense
    # optim.sharded_update shards data-parallel tables' updates too: planned (memory) and run as the plan says
    topology = replace(settings.topology, sharded_dp_update=settings.optim.sharded_update)
    return reserve_dense(topology, dense_bytes_per_rank(numels, state_floats(dense.name, dense.momentum), topology.world_size,
                                                        settings.optim.sharded_update))


def save_plan(plan: ShardingPlan, out_dir: Path) -> None:
    """out_dir/plan.json (loadable with ShardingPlan.load, or as plan_file) and its chart plan.png."""
    plan.save(out_dir / "plan.json")
    save_chart(plan, out_dir / "plan.png")


def check_plan_file(plan: ShardingPlan, settings: TrainSettings, world_size: int) -> None:
    where = f"plan_file={settings.plan_file}"
    if plan.topology.world_size != world_size:
        raise ValueError(f"{where}: the plan is for {plan.topology.world_size} ranks but {world_size} run; plan again "
                         f"with topology.world_size={world_size}, or drop plan_file to plan at start")
    if plan.topology.sharded_dp_update != settings.optim.sharded_update:
        raise ValueError(f"{where}: the plan has topology.sharded_dp_update={plan.topology.sharded_dp_update} but this run "
                         f"optim.sharded_update={settings.optim.sharded_update}; set optim.sharded_update="
                         f"{str(plan.topology.sharded_dp_update).lower()}, or drop plan_file to plan at start")
    planned = {s.name: s for s in plan.specs}
    missing = [s.name for s in settings.specs if s.name not in planned]
    extra = sorted(set(planned) - {s.name for s in settings.specs})
    if missing or extra:
        raise ValueError(f"{where}: the plan places tables {sorted(planned)[:8]}..., the run has tables missing from it "
                         f"{missing[:8]} and the plan has extra tables {extra[:8]}; plan these tables again")
    for spec in settings.specs:
        p = planned[spec.name]
        for key in ("num_embeddings", "embedding_dim", "feature_names", "pooled"):
            if getattr(p, key) != getattr(spec, key):
                raise ValueError(f"{where}: table {spec.name!r}.{key} is {getattr(p, key)!r} in the plan but "
                                 f"{getattr(spec, key)!r} in this run; plan these tables again")

