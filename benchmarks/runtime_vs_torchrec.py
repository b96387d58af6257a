"""embshard's sharded runtime vs TorchRec's DistributedModelParallel: same tables, same plan.

    .venv/bin/python benchmarks/runtime_vs_torchrec.py --out benchmarks/results/runtime.md

Two gloo ranks on CPU, batch 2,048 per rank. For every hand-made plan TorchRec runs on CPU
(pooled: table_wise, row_wise, column_wise, table_row_wise, table_column_wise,
data_parallel, mixed; sequence: table_wise, row_wise, column_wise, mixed) both runtimes do
forward + backward + fused optimizer update (rowwise_adagrad) on the same batches; the plan
goes to TorchRec through `embshard.interop.torchrec.to_torchrec_plan`. Data-parallel tables
are updated by embshard's fused replica kernel and, in TorchRec, by DDP + torchrec's dense
RowWiseAdagrad. Steps of the two runtimes alternate (embshard, TorchRec, TorchRec,
embshard, ...), each timed between barriers on rank 0; medians over STEPS steps count, so
both see the same background load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from embshard.interop.torchrec import to_torchrec_plan
from embshard.machine import cpu_model
from embshard.planner import manual_plan
from embshard.planner.plan import ShardingPlan
from embshard.planner.types import ShardingType
from embshard.runtime import OptimizerConfig, ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.runtime.timing import PhaseTimer
from embshard.specs import TableSpec
from embshard.topology import DATA_PARALLEL_MODES, Topology
from local_ranks import run_script_ranks

ST = ShardingType
WORLD_SIZE, BATCH_SIZE, LR = 2, 2048, 0.01
WARMUP, STEPS, NUM_BATCHES = 2, 16, 4
DATE = "2026-11-30"
COMMAND = ".venv/bin/python benchmarks/runtime_vs_torchrec.py --out benchmarks/results/runtime.md"

# (name, rows, dim, pooling factor)
POOLED = [TableSpec(f"p{i}", rows, dim, pf, feature_names=(f"pf{i}",), optimizer="rowwise_adagrad")
          for i, (rows, dim, pf) in enumerate([(200_000, 64, 20), (100_000, 64, 10), (50_000, 128, 15), (400_000, 64, 25),
                                               (20_000, 32, 5), (150_000, 64, 30), (10_000, 128, 8), (80_000, 64, 12)])]
# criteo_small's tables of at most 15,000 rows (embshard/configs/tables/criteo_small.yaml): small replicas
SMALL = [TableSpec(f"c{i}", rows, 16, 1.0, feature_names=(f"cf{i}",), optimizer="rowwise_adagrad")
         for i, rows in enumerate([1460, 583, 305, 24, 12517, 633, 3, 5683, 3194, 27, 14992, 10, 5652, 2173, 4, 18, 15, 105])]
SEQUENCE = [TableSpec(f"s{i}", rows, 64, pf, pooled=False, feature_names=(f"sf{i}",), optimizer="rowwise_adagrad")
            for i, (rows, pf) in enumerate([(200_000, 20), (100_000, 10), (50_000, 15), (300_000, 25)])]


def layouts(specs: list[TableSpec], kinds: list[ShardingType]) -> dict[str, tuple[ShardingType, list[int]]]:
    out = {}
    for i, (spec, kind) in enumerate(zip(specs, kinds)):
        out[spec.name] = (kind, [i % WORLD_SIZE] if kind is ST.TABLE_WISE else list(range(WORLD_SIZE)))
    return out


def cases() -> list[tuple[str, list[TableSpec], dict]]:
    pooled = [(f"pooled {k.value}", POOLED, layouts(POOLED, [k] * len(POOLED))) for k in
              (ST.TABLE_WISE, ST.ROW_WISE, ST.COLUMN_WISE, ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE, ST.DATA_PARALLEL)]
    mixed = [ST.TABLE_WISE, ST.ROW_WISE, ST.COLUMN_WISE, ST.ROW_WISE, ST.DATA_PARALLEL, ST.TABLE_WISE, ST.TABLE_COLUMN_WISE, ST.TABLE_ROW_WISE]
    pooled.append(("pooled mixed", POOLED, layouts(POOLED, mixed)))
    # data-parallel tables of both sizes: each in the mode the cost model prices cheaper (per table)
    pooled.append(("pooled data_parallel small", SMALL, layouts(SMALL, [ST.DATA_PARALLEL] * len(SMALL))))
    pooled.append(("pooled data_parallel sizes", POOLED + SMALL, layouts(POOLED + SMALL, [ST.DATA_PARALLEL] * len(POOLED + SMALL))))
    sequence = [(f"sequence {k.value}", SEQUENCE, layouts(SEQUENCE, [k] * len(SEQUENCE))) for k in
                (ST.TABLE_WISE, ST.ROW_WISE, ST.COLUMN_WISE)]
    sequence.append(("sequence mixed", SEQUENCE, layouts(SEQUENCE, [ST.TABLE_WISE, ST.ROW_WISE, ST.COLUMN_WISE, ST.TABLE_WISE])))
    return pooled + sequence


def make_batches(specs: list[TableSpec], rank: int):
    """NUM_BATCHES local KJTs: lengths uniform in [0, 2 x pooling factor], ids uniform over the table."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    gen = torch.Generator().manual_seed(100 + rank)
    batches = []
    for _ in range(NUM_BATCHES):
        lengths = [torch.randint(0, int(2 * s.pooling_factor) + 1, (BATCH_SIZE,), generator=gen) for s in specs]
        values = [torch.randint(0, s.num_embeddings, (int(n.sum()),), generator=gen) for s, n in zip(specs, lengths)]
        batches.append(KeyedJaggedTensor(keys=[f for s in specs for f in s.feature_names],
                                         values=torch.cat(values), lengths=torch.cat(lengths)))
    return batches


def loss_of(out, pooled: bool) -> torch.Tensor:
    if pooled:
        return out.values().square().sum()
    return sum(jt.values().square().sum() for jt in out.values())


# ---- the two runtimes ------------------------------------------------------------------------
class Wrapper(nn.Module):
    """TorchRec shards submodules of a model; this is the model."""

    def __init__(self, emb: nn.Module) -> None:
        super().__init__()
        self.emb = emb

    def forward(self, features):
        return self.emb(features)


def embshard_model(specs: list[TableSpec], plan: ShardingPlan, pg, data_parallel_mode: str | None = None) -> nn.Module:
    """data_parallel_mode: force one mode on every data-parallel table (None: each table's, as planned)."""
    cls = ShardedEmbeddingBagCollection if specs[0].pooled else ShardedEmbeddingCollection
    return cls(specs, plan, pg, optimizer=OptimizerConfig(learning_rate=LR), data_parallel_mode=data_parallel_mode)


def torchrec_model(specs: list[TableSpec], plan: ShardingPlan, pg):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR, "eps": 1e-8}
    meta = torch.device("meta")
    if specs[0].pooled:
        emb = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=s.name, num_embeddings=s.num_embeddings, embedding_dim=s.embedding_dim,
                                                                        feature_names=list(s.feature_names)) for s in specs], device=meta)
        sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    else:
        emb = EmbeddingCollection(tables=[EmbeddingConfig(name=s.name, num_embeddings=s.num_embeddings, embedding_dim=s.embedding_dim,
                                                                  feature_names=list(s.feature_names)) for s in specs], device=meta)
        sharder = EmbeddingCollectionSharder(fused_params=fused)
    dmp = DistributedModelParallel(Wrapper(emb), env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"),
                                   plan=to_torchrec_plan(plan, "emb"), sharders=[sharder])
    fused_params = set(dmp.fused_optimizer.params)
    dense = [p for n, p in dmp.named_parameters() if p.requires_grad and p.dim() == 2 and n not in fused_params]
    if os.environ.get("BENCH_DEBUG"):
        print([(n, tuple(p.shape), n in fused_params) for n, p in dmp.named_parameters()], flush=True)
    dense_opt = RowWiseAdagrad(dense, lr=LR) if dense else None
    return dmp, dense_opt


def timed(step, kjt, pg) -> float:
    """Seconds of one step on rank 0's clock, between barriers (the slowest rank decides)."""
    dist.barrier(group=pg)
    start = time.perf_counter()
    step(kjt)
    dist.barrier(group=pg)
    return time.perf_counter() - start


def run_case(name: str, specs: list[TableSpec], layout: dict, pg, dp_modes: bool = False) -> dict:
    """dp_modes: where the plan has data-parallel tables, also time embshard with each mode forced on all of them."""
    rank = dist.get_rank(pg)
    pooled = specs[0].pooled
    plan = manual_plan(specs, Topology(world_size=WORLD_SIZE, local_world_size=WORLD_SIZE, device="cpu", batch_size_per_rank=BATCH_SIZE), layout)
    batches = make_batches(specs, rank)
    ours = embshard_model(specs, plan, pg)
    theirs, dense_opt = torchrec_model(specs, plan, pg)
    ours.timer = timer = PhaseTimer()
    has_dp = any(t.sharding_type is ST.DATA_PARALLEL for t in plan.tables)
    forced = {m: embshard_model(specs, plan, pg, m) for m in DATA_PARALLEL_MODES} if dp_modes and has_dp else {}

    def ours_step(kjt) -> None:
        loss = loss_of(ours(kjt), pooled)
        with timer.phase("backward"):
            loss.backward()

    def forced_step(model):
        return lambda kjt: loss_of(model(kjt), pooled).backward()

    def theirs_step(kjt) -> None:
        loss_of(theirs(kjt), pooled).backward()
        if dense_opt is not None:
            dense_opt.step()
            dense_opt.zero_grad()

    steps = [("embshard", ours_step), ("torchrec", theirs_step), *((f"embshard_{m}", forced_step(f)) for m, f in forced.items())]
    for i in range(WARMUP):
        for _, step in steps:
            step(batches[i % NUM_BATCHES])
    seconds: dict[str, list[float]] = {who: [] for who, _ in steps}
    phases = []
    for i in range(STEPS):
        kjt = batches[i % NUM_BATCHES]
        timer.reset()
        for who, step in (steps if i % 2 == 0 else steps[::-1]):
            seconds[who].append(timed(step, kjt, pg))
        phases.append(dict(timer.seconds))
    out = {"case": name, **{f"{who}_s": statistics.median(s) for who, s in seconds.items()},
           "phases_s": {k: statistics.median(p[k] for p in phases) for k in phases[0]}}
    if has_dp:
        out["data_parallel_modes"] = dict(sorted(Counter(t.data_parallel_mode for t in plan.tables if t.data_parallel_mode).items()))
    return out


# ---- driver ----------------------------------------------------------------------------------
def worker(rank: int, port: int, out: str, only: str, dp_modes: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=600))
    pg = dist.group.WORLD
    results = []
    for name, specs, layout in cases():
        if only and only not in name:
            continue
        results.append(run_case(name, specs, layout, pg, dp_modes))
        if rank == 0:
            print(json.dumps(results[-1]), flush=True)
            Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def markdown(results: list[dict]) -> str:
    cpu = cpu_model()
    samples = WORLD_SIZE * BATCH_SIZE
    lines = [
        "# embshard runtime vs TorchRec DistributedModelParallel",
        "",
        f"Date: {DATE}. Machine: {cpu}, {os.cpu_count()} cores, torch {torch.__version__}, gloo, {WORLD_SIZE} ranks on CPU "
        f"(1 thread each), batch {BATCH_SIZE:,} per rank. Command: `{COMMAND}`.",
        "",
        f"Tables: {len(POOLED)} pooled ({', '.join(f'{s.num_embeddings:,}x{s.embedding_dim} pf {s.pooling_factor:g}' for s in POOLED)}), "
        f"{len(SEQUENCE)} sequence ({', '.join(f'{s.num_embeddings:,}x{s.embedding_dim} pf {s.pooling_factor:g}' for s in SEQUENCE)}); "
        "rowwise_adagrad everywhere. Step = forward + backward + fused update; samples/s counts both ranks; "
        f"medians of {STEPS} steps, the two runtimes' steps alternating. embshard's phases: medians on rank 0 "
        "(input dist includes validation and waiting for the slower rank).",
        "",
        "| case | embshard samples/s | TorchRec samples/s | speed-up | input dist ms | lookup ms | output dist ms | backward ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        p = r["phases_s"]
        lines.append(f"| {r['case']} | {samples / r['embshard_s']:,.0f} | {samples / r['torchrec_s']:,.0f} | "
                     f"{r['torchrec_s'] / r['embshard_s']:.2f}x | {1e3 * p.get('input_dist', 0):.1f} | {1e3 * p.get('lookup', 0):.1f} | "
                     f"{1e3 * p.get('output_dist', 0):.1f} | {1e3 * p.get('backward', 0):.1f} |")
    forced = [r for r in results if "embshard_allreduce_s" in r]
    if forced:
        lines += ["", "Data-parallel modes, same run (steps alternating with the rows above): embshard's samples/s with "
                      "each table in its planned mode, and with one mode forced on every data-parallel table.", "",
                  "| case | planned modes (tables) | planned | all allreduce | all replicated_lookup |", "|---|---|---:|---:|---:|"]
        for r in forced:
            modes = ", ".join(f"{m} {n}" for m, n in r["data_parallel_modes"].items())
            lines.append(f"| {r['case']} | {modes} | {samples / r['embshard_s']:,.0f} | {samples / r['embshard_allreduce_s']:,.0f} | "
                         f"{samples / r['embshard_replicated_lookup_s']:,.0f} |")
    ratios = [r["torchrec_s"] / r["embshard_s"] for r in results]
    geo = 1.0
    for x in ratios:
        geo *= x
    lines += ["", f"Speed-up (TorchRec step time / embshard step time): geometric mean {geo ** (1 / len(ratios)):.2f}x, "
                  f"min {min(ratios):.2f}x, max {max(ratios):.2f}x over {len(ratios)} cases.", "",
              "Where the time goes. Fused pooled cases run the same FBGEMM kernel in both runtimes, and its CPU "
              "backward (with the rowwise_adagrad update) is most of the step; embshard's edge there is the "
              "rest: one header all-gather + two all-to-alls in (two more for data-parallel features), one out, no per-feature Python on the hot path. "
              "Sequence tables: embshard looks them up with FBGEMM's summing kernel over one-id bags, whose CPU "
              "backward is about 10x faster than the PoolingMode.NONE kernel TorchRec uses. Data-parallel: "
              "embshard's replicas look up the global batch and exchange ids and pooled gradients; TorchRec "
              "all-reduces whole-table gradients (DDP) and its dense RowWiseAdagrad touches every row.", "",
              "The machine is shared: alternating the two runtimes step by step and taking medians damps, but "
              "does not remove, noise from other load.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/runtime.md")
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    parser.add_argument("--dp-modes", action="store_true",
                        help="also time embshard with each data-parallel mode forced on every data-parallel table")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        worker(args.rank, args.port, args.json, args.only, args.dp_modes)
        return
    json_path = Path(tempfile.mkdtemp(prefix="embshard-bench-")) / "runtime.json"
    run_script_ranks(__file__, WORLD_SIZE, lambda r, port: ["--rank", str(r), "--port", str(port), "--json",
                                                            str(json_path), "--only", args.only,
                                                            *(["--dp-modes"] if args.dp_modes else [])])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(markdown(json.loads(json_path.read_text())))
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
