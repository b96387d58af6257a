"""DLRM training throughput: embshard vs TorchRec's DLRM under DistributedModelParallel.

    .venv/bin/python benchmarks/train_throughput.py --out benchmarks/results/train.md

Two gloo ranks on CPU train the same model on the same tables (configs/tables/criteo_small:
26 Criteo tables capped at 100,000 rows, dim 16), the same batches (synthetic Criteo-like,
pre-generated), the same plan and the same optimizers: embshard's planner plans the tables
(``torchrec_compatible``, so TorchRec can run the layout), the plan goes to TorchRec through
`embshard.interop.torchrec.to_torchrec_plan`. embshard: `embshard.models.dlrm.DLRM` sharded
by `shard_model` (fused rowwise_adagrad for every table, DDP + Adagrad for the MLPs). TorchRec:
`torchrec.models.dlrm.DLRM` (or DLRM_DCN) with fused EXACT_ROWWISE_ADAGRAD, data-parallel
tables under DDP with torchrec's RowWiseAdagrad, Adagrad for the MLPs. A step is forward, BCE
loss, backward (fused table updates) and the dense optimizer step. Each case alternates
ROUNDS rounds of ITERS steps (embshard, TorchRec, embshard, ...); the best round of each
counts, which damps noise from other load on the machine. Besides wall-clock samples/s it
reports samples per CPU-second (both ranks' process CPU time), which other processes on a
shared machine disturb much less; the load average during the run is recorded too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist
import torch.nn.functional as F
from local_ranks import run_script_ranks

from embshard.machine import cpu_model

WORLD_SIZE, LR_DENSE, LR_SPARSE, EPS = 2, 0.02, 0.05, 1e-8
WARMUP, ITERS, ROUNDS, NUM_BATCHES = 3, 20, 5, 4
DATE = "2026-11-30"
COMMAND = ".venv/bin/python benchmarks/train_throughput.py --out benchmarks/results/train.md"
ROOT = Path(__file__).resolve().parents[1]
# (name, interaction, batch per rank, bottom MLP, top MLP, data-parallel tables allowed)
CASES = [("DLRM dot, batch 512", "dot", 512, (64, 16), (256, 128, 1), True),
         ("DLRM dot, batch 2048", "dot", 2048, (64, 16), (256, 128, 1), True),
         ("DLRM dot, batch 2048, no DP tables", "dot", 2048, (64, 16), (256, 128, 1), False),
         ("DLRM-v2 DCN, batch 2048", "dcn", 2048, (64, 16), (256, 128, 1), True)]
DCN_LAYERS, DCN_RANK = 3, 64


def specs_and_plan(batch: int, data_parallel: bool):
    from embshard import planner
    from embshard.planner.types import Constraints, ShardingType, TableConstraint
    from embshard.specs import load_tables_file
    from embshard.topology import Topology

    specs, _ = load_tables_file(ROOT / "embshard" / "configs" / "tables" / "criteo_small.yaml")
    topology = Topology(world_size=WORLD_SIZE, local_world_size=WORLD_SIZE, hbm_gib=16, batch_size_per_rank=batch, device="cpu")
    sharded = tuple(t for t in ShardingType if t is not ShardingType.DATA_PARALLEL)
    constraints = None if data_parallel else Constraints({s.name: TableConstraint(sharded) for s in specs})
    return specs, planner.plan(specs, topology, constraints, time_budget_s=2.0, torchrec_compatible=True)


def make_batches(specs, rank: int, batch: int):
    from embshard.data.batch import FeatureLayout
    from embshard.data.config import SyntheticConfig
    from embshard.data.stream import open_stream

    stream = open_stream(SyntheticConfig(), FeatureLayout.from_specs(specs), rank, WORLD_SIZE, batch, "train")
    return [next(stream) for _ in range(NUM_BATCHES)]


def embshard_model(specs, plan, pg, interaction: str, bottom, top):
    from embshard.models.config import DLRMConfig
    from embshard.models.dlrm import DLRM
    from embshard.runtime import OptimizerConfig, shard_model

    config = DLRMConfig(interaction=interaction, bottom_mlp=bottom, top_mlp=top, dcn_num_layers=DCN_LAYERS,
                        dcn_low_rank=DCN_RANK)
    model = shard_model(DLRM(config, specs, 13), plan, pg, optimizer=OptimizerConfig(learning_rate=LR_SPARSE, eps=EPS))
    return model, [torch.optim.Adagrad(model.parameters(), lr=LR_DENSE, eps=EPS)]


def torchrec_model(specs, plan, pg, interaction: str, bottom, top):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from embshard.interop.torchrec import to_embedding_configs, to_torchrec_plan

    ebc = EmbeddingBagCollection(tables=to_embedding_configs(specs)[0], device=torch.device("meta"))
    if interaction == "dot":
        module = DLRM(ebc, 13, list(bottom), list(top))
    else:
        module = DLRM_DCN(ebc, 13, list(bottom), list(top), dcn_num_layers=DCN_LAYERS, dcn_low_rank_dim=DCN_RANK)
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR_SPARSE, "eps": EPS}
    model = DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"),
                                     plan=to_torchrec_plan(plan, "sparse_arch.embedding_bag_collection"),
                                     sharders=[EmbeddingBagCollectionSharder(fused_params=fused)])
    fused_names = set(model.fused_optimizer.params)
    rest = [(n, p) for n, p in model.named_parameters() if p.requires_grad and n not in fused_names]
    # Data-parallel tables (dense kernel, under DDP); tables held by other ranks show up as empty placeholders.
    tables = [p for n, p in rest if "embedding_bags" in n and p.dim() == 2]
    mlps = [p for n, p in rest if "embedding_bags" not in n]
    optimizers = [torch.optim.Adagrad(mlps, lr=LR_DENSE, eps=EPS)]
    if tables:
        optimizers.append(RowWiseAdagrad(tables, lr=LR_SPARSE, eps=EPS))
    return model, optimizers


def step_fn(model, optimizers, squeeze: bool):
    def step(batch) -> None:
        logits = model(batch.dense, batch.sparse)
        loss = F.binary_cross_entropy_with_logits(logits.squeeze(1) if squeeze else logits, batch.labels)
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        for opt in optimizers:
            opt.step()
    return step


def measure(step, batches, pg) -> tuple[float, float]:
    """(wall seconds per step on rank 0 between barriers, CPU seconds per step of all ranks), after WARMUP steps."""
    for i in range(WARMUP):
        step(batches[i % len(batches)])
    dist.barrier(group=pg)
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(ITERS):
        step(batches[i % len(batches)])
    cpu = torch.tensor([time.process_time() - cpu_start], dtype=torch.float64)
    dist.barrier(group=pg)
    wall = time.perf_counter() - start
    dist.all_reduce(cpu, group=pg)
    return wall / ITERS, float(cpu) / ITERS


def run_case(name: str, interaction: str, batch: int, bottom, top, data_parallel: bool, pg) -> dict:
    from embshard.planner.report import sharding_type_counts

    torch.manual_seed(0)
    specs, plan = specs_and_plan(batch, data_parallel)
    batches = make_batches(specs, dist.get_rank(pg), batch)
    ours = step_fn(*embshard_model(specs, plan, pg, interaction, bottom, top), squeeze=False)
    theirs = step_fn(*torchrec_model(specs, plan, pg, interaction, bottom, top), squeeze=True)
    ours_runs, theirs_runs = [], []
    for _ in range(ROUNDS):
        ours_runs.append(measure(ours, batches, pg))
        theirs_runs.append(measure(theirs, batches, pg))
    samples = batch * WORLD_SIZE
    return {"case": name, "batch_per_rank": batch, "plan": sharding_type_counts(plan),
            "embshard_samples_per_s": samples / min(w for w, _ in ours_runs),
            "torchrec_samples_per_s": samples / min(w for w, _ in theirs_runs),
            "embshard_samples_per_cpu_s": samples / min(c for _, c in ours_runs),
            "torchrec_samples_per_cpu_s": samples / min(c for _, c in theirs_runs),
            "load_average": os.getloadavg()[0]}


def worker(rank: int, port: int, out: str, repeats: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=600))
    results = []
    for repeat in range(repeats):
        for case in CASES:
            results.append({**run_case(*case, dist.group.WORLD), "repeat": repeat})
            if rank == 0:
                print(json.dumps(results[-1]), flush=True)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def markdown(results: list[dict]) -> str:
    repeats = max(r["repeat"] for r in results) + 1
    lines = [
        "# Training throughput: embshard vs TorchRec DistributedModelParallel",
        "",
        f"Date: {DATE}. Machine: {cpu_model()}, {os.cpu_count()} cores, 2 gloo ranks (1 thread each), "
        f"torch {torch.__version__}, TorchRec 1.8.0, FBGEMM CPU 1.8.0.",
        f"Command: `{COMMAND}`",
        "",
        "Same tables (criteo_small: 26 tables, dim 16, up to 100,000 rows), batches, plan (embshard's planner, "
        "torchrec_compatible) and optimizers (fused rowwise_adagrad for tables, Adagrad for MLPs). "
        "Bottom MLP 13-64-16, top MLP 256-128-1; DCN: 3 layers, rank 64. "
        f"Each case ran {repeats} times; each time, best of {ROUNDS} alternating rounds of {ITERS} steps. "
        "Samples/s count both ranks (median over the repeats); samples per CPU-second divide by both ranks' "
        "process CPU time. Ratios are embshard / TorchRec: median [min, max] over the repeats. "
        "Load: the 1-minute load average during the case (2 cores: above 2 means other processes competed).",
        "",
        "| case | plan | load | embshard samples/s | TorchRec samples/s | wall ratio | CPU ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, *_ in CASES:
        runs = [r for r in results if r["case"] == name]
        wall = sorted(r["embshard_samples_per_s"] / r["torchrec_samples_per_s"] for r in runs)
        cpu = sorted(r["embshard_samples_per_cpu_s"] / r["torchrec_samples_per_cpu_s"] for r in runs)
        plan = ", ".join(f"{k} {v}" for k, v in runs[0]["plan"].items())
        lines.append(
            f"| {name} | {plan} | {median([r['load_average'] for r in runs]):.1f} "
            f"| {median([r['embshard_samples_per_s'] for r in runs]):,.0f} "
            f"| {median([r['torchrec_samples_per_s'] for r in runs]):,.0f} "
            f"| {median(wall):.2f}x [{wall[0]:.2f}, {wall[-1]:.2f}] | {median(cpu):.2f}x [{cpu[0]:.2f}, {cpu[-1]:.2f}] |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/train.md")
    parser.add_argument("--repeats", type=int, default=3, help="run every case this many times")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        worker(args.rank, args.port, args.json, args.repeats)
        return
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    json_path = Path(args.out).with_suffix(".json")
    run_script_ranks(__file__, WORLD_SIZE, lambda r, port: ["--rank", str(r), "--port", str(port), "--json",
                                                            str(json_path), "--repeats", str(args.repeats)],
                     env={"PYTHONPATH": str(ROOT)})
    Path(args.out).write_text(markdown(json.loads(json_path.read_text())))
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
