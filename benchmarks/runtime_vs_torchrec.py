"""embshard's sharded runtime vs TorchRec's DistributedModelParallel: same tables, same plan.

    .venv/bin/python benchmarks/runtime_vs_torchrec.py --out benchmarks/results/runtime.md

Two gloo ranks on CPU, batch 2,048 per rank. For every hand-made plan TorchRec runs on CPU
(pooled: table_wise, row_wise, column_wise, table_row_wise, table_column_wise,
data_parallel, mixed; sequence: table_wise, row_wise, column_wise, mixed) both runtimes do
forward + backward + fused optimizer update (rowwise_adagrad) on the same batches; the plan
goes to TorchRec through `embshard.interop.torchrec.to_torchrec_plan`. Data-parallel tables
are updated by embshard's fused replica kernel and, in TorchRec, by DDP + torchrec's dense
RowWiseAdagrad. Steps of the configurations take turns, in a new seeded order each round (a rotation of one
order would keep each configuration's predecessor, and what it leaves behind, the same), each timed between
barriers on rank 0; medians over STEPS steps count, so all see the same background load.

Each runtime also runs pipelined: embshard's `InputPipeline` (embshard.runtime.pipeline: the next
batch's input dist on a side thread) and TorchRec's `TrainPipelineSparseDist` (it runs on CPU);
the speed-up is embshard's faster configuration against TorchRec's faster one, per case.

    sudo .venv/bin/python benchmarks/runtime_vs_torchrec.py --hosts 2 --ranks-per-host 2 --link-gbit 2          # ~4 min
    sudo .venv/bin/python benchmarks/runtime_vs_torchrec.py --hosts 2 --ranks-per-host 2 --link-gbit 2 --quick  # a check

``--hosts H --ranks-per-host L --link-gbit G`` (plans_measured.py's multi-host flags): the same cases on H
emulated hosts x L ranks (embshard/emulated_hosts.py, needs root), each host's link shaped to G Gbit/s each
way; table-wise tables go round the H x L ranks, table_row_wise and table_column_wise tables onto one host's
L ranks, host after host. Batch 512 per rank, 1 warmup and 3 timed steps per configuration (the H x L ranks
share this machine's cores, and TorchRec's data-parallel step all-reduces whole tables through the link),
so the results give each configuration's step-time spread too; they go into their own section of the
results file (``<!-- hosts:start -->``, which a one-host run keeps).
``--quick``: the two mixed cases, tiny batch, one step: a check that it runs, printed only.

``--malloc default``: the ranks run glibc's malloc at its default settings; by default they keep freed memory
(`local_ranks.MALLOC_TUNABLES`, which says why: with glibc's defaults the peer ran below its best).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
from collections import Counter
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from embshard.interop.torchrec import to_torchrec_plan
from embshard.machine import cpu_model
from embshard.planner import evaluate, manual_plan
from embshard.planner.api import cheaper_reduction
from embshard.planner.plan import ShardingPlan
from embshard.planner.types import ShardingType
from embshard.runtime import OptimizerConfig, ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.runtime.timing import PhaseTimer
from embshard.specs import TableSpec
from embshard.topology import DATA_PARALLEL_MODES
from embshard.emulated_hosts import EmulationUnavailable
from local_ranks import Hosts, add_hosts_arguments, add_malloc_argument, hosts_of, init_rank, malloc_env, malloc_sentence, run_ranks, turns
from profiles import profile_sentence, profile_topology
from sections import commit_label, load_average, write_results

ST = ShardingType
RANKS_PER_HOST, BATCH_SIZE, LR = 2, 2048, 0.01
WARMUP, STEPS, NUM_BATCHES = 2, 16, 4
# on emulated hosts (the full run within ~5 min on 2 cores, where 4 ranks share them and TorchRec's data-parallel
# step all-reduces whole tables through the link, 4 s a step): steps and warmup per configuration, batch per rank
HOSTS_STEPS, HOSTS_WARMUP, HOSTS_BATCH = 3, 1, 512
QUICK = {"only": "mixed", "steps": 1, "warmup": 1, "batch": 128}  # --quick: a check that it runs
TITLE = "# embshard runtime vs TorchRec DistributedModelParallel"
DATE = time.strftime("%Y-%m-%d", time.gmtime())  # the day of the run
COMMAND = ".venv/bin/python benchmarks/runtime_vs_torchrec.py"
CONFIGS = ("embshard", "embshard_pipelined", "torchrec", "torchrec_pipelined")

# (name, rows, dim, pooling factor)
POOLED = [TableSpec(f"p{i}", rows, dim, pf, feature_names=(f"pf{i}",), optimizer="rowwise_adagrad")
          for i, (rows, dim, pf) in enumerate([(200_000, 64, 20), (100_000, 64, 10), (50_000, 128, 15), (400_000, 64, 25),
                                               (20_000, 32, 5), (150_000, 64, 30), (10_000, 128, 8), (80_000, 64, 12)])]
SEQUENCE = [TableSpec(f"s{i}", rows, 64, pf, pooled=False, feature_names=(f"sf{i}",), optimizer="rowwise_adagrad")
            for i, (rows, pf) in enumerate([(200_000, 20), (100_000, 10), (50_000, 15), (300_000, 25)])]

# criteo_small's tables of at most 15,000 rows (embshard/configs/tables/criteo_small.yaml): small replicas
SMALL = [TableSpec(f"c{i}", rows, 16, 1.0, feature_names=(f"cf{i}",), optimizer="rowwise_adagrad")
         for i, rows in enumerate([1460, 583, 305, 24, 12517, 633, 3, 5683, 3194, 27, 14992, 10, 5652, 2173, 4, 18, 15, 105])]

def layouts(specs: list[TableSpec], kinds: list[ShardingType], world: int,
            per_host: int) -> dict[str, tuple[ShardingType, list[int]]]:
    out, hosts = {}, world // per_host
    for i, (spec, kind) in enumerate(zip(specs, kinds)):
        if kind is ST.TABLE_WISE:
            ranks = [i % world]
        elif kind in (ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE):
            ranks = list(range((i % hosts) * per_host, (i % hosts + 1) * per_host))
        else:
            ranks = list(range(world))
        out[spec.name] = (kind, ranks)
    return out


def cases(world: int, per_host: int) -> list[tuple[str, list[TableSpec], dict]]:
    def layout(specs, kinds):
        return layouts(specs, kinds, world, per_host)
    pooled = [(f"pooled {k.value}", POOLED, layout(POOLED, [k] * len(POOLED))) for k in
              (ST.TABLE_WISE, ST.ROW_WISE, ST.COLUMN_WISE, ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE, ST.DATA_PARALLEL)]
    mixed = [ST.TABLE_WISE, ST.ROW_WISE, ST.COLUMN_WISE, ST.ROW_WISE, ST.DATA_PARALLEL, ST.TABLE_WISE, ST.TABLE_COLUMN_WISE, ST.TABLE_ROW_WISE]
    pooled.append(("pooled mixed", POOLED, layout(POOLED, mixed)))
    # data-parallel tables of both sizes: each in the mode the cost model prices cheaper (per table)
    pooled.append(("pooled data_parallel small", SMALL, layout(SMALL, [ST.DATA_PARALLEL] * len(SMALL))))
    pooled.append(("pooled data_parallel sizes", POOLED + SMALL, layout(POOLED + SMALL, [ST.DATA_PARALLEL] * len(POOLED + SMALL))))
    sequence = [(f"sequence {k.value}", SEQUENCE, layout(SEQUENCE, [k] * len(SEQUENCE))) for k in
                (ST.TABLE_WISE, ST.ROW_WISE, ST.COLUMN_WISE)]
    sequence.append(("sequence mixed", SEQUENCE, layout(SEQUENCE, [ST.TABLE_WISE, ST.ROW_WISE, ST.COLUMN_WISE, ST.TABLE_WISE])))
    return pooled + sequence


def make_batches(specs: list[TableSpec], rank: int, batch_size: int):
    """NUM_BATCHES local KJTs: lengths uniform in [0, 2 x pooling factor], ids uniform over the table."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    gen = torch.Generator().manual_seed(100 + rank)
    batches = []
    for _ in range(NUM_BATCHES):
        lengths = [torch.randint(0, int(2 * s.pooling_factor) + 1, (batch_size,), generator=gen) for s in specs]
        values = [torch.randint(0, s.num_embeddings, (int(n.sum()),), generator=gen) for s, n in zip(specs, lengths)]
        batches.append(KeyedJaggedTensor(keys=[f for s in specs for f in s.feature_names],
                                         values=torch.cat(values), lengths=torch.cat(lengths)))
    return batches


@torch.fx.wrap  # a leaf when TorchRec's pipeline traces the model
def loss_of(out, pooled: bool) -> torch.Tensor:
    if pooled:
        return out.values().square().sum()
    return sum(jt.values().square().sum() for jt in out.values())


# ---- the two runtimes ------------------------------------------------------------------------
@dataclass
class FeaturesBatch(Pipelineable):
    """A batch as TorchRec's pipeline takes it (it moves and tracks batches between streams)."""
    features: KeyedJaggedTensor

    def to(self, device: torch.device, non_blocking: bool = False) -> "FeaturesBatch":
        return FeaturesBatch(self.features.to(device, non_blocking=non_blocking))

    def record_stream(self, stream) -> None:
        self.features.record_stream(stream)


class Wrapper(nn.Module):
    """TorchRec shards submodules of a model; this is the model: batch -> (loss, embeddings), as its pipeline wants."""

    def __init__(self, emb: nn.Module, pooled: bool) -> None:
        super().__init__()
        self.emb, self.pooled = emb, pooled

    def forward(self, batch: FeaturesBatch):
        out = self.emb(batch.features)
        return loss_of(out, self.pooled), out


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
    dmp = DistributedModelParallel(Wrapper(emb, specs[0].pooled), env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"),
                                   plan=to_torchrec_plan(plan, "emb"), sharders=[sharder])
    fused_params = set(dmp.fused_optimizer.params)
    dense = [p for n, p in dmp.named_parameters() if p.requires_grad and p.dim() == 2 and n not in fused_params]
    if os.environ.get("BENCH_DEBUG"):
        print([(n, tuple(p.shape), n in fused_params) for n, p in dmp.named_parameters()], flush=True)
    dense_opt = RowWiseAdagrad(dense, lr=LR) if dense else None
    return dmp, dense_opt


def timed(step, pg) -> float:
    """Seconds of one step on rank 0's clock, between barriers (the slowest rank decides)."""
    dist.barrier(group=pg)
    start = time.perf_counter()
    step()
    dist.barrier(group=pg)
    return time.perf_counter() - start


class NoOptimizer:
    """TorchRec's pipeline steps an optimizer; without data-parallel tables there is none to step."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        pass


def case_plan(specs: list[TableSpec], layout: dict, world: int, per_host: int, profile: str, batch: int) -> ShardingPlan:
    """The case's layout priced on the profile; across hosts with flat collectives where the cost model prices
    the in-host reduction above them (as the planner decides it, `cheaper_reduction`)."""
    plan = manual_plan(specs, profile_topology(profile, world_size=world, local_world_size=per_host, device="cpu",
                                               batch_size_per_rank=batch), layout)
    topology = cheaper_reduction(specs, plan.topology, plan.tables, plan.max_rank_ms)
    return plan if topology is plan.topology else evaluate(specs, topology, plan.tables)


def run_case(name: str, specs: list[TableSpec], layout: dict, pg, per_host: int, options: argparse.Namespace) -> dict:
    from embshard.runtime.pipeline import InputPipeline
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    start = time.perf_counter()
    rank, world, pooled = dist.get_rank(pg), dist.get_world_size(pg), specs[0].pooled
    plan = case_plan(specs, layout, world, per_host, options.profile, options.batch)
    batches = make_batches(specs, rank, options.batch)
    ours = embshard_model(specs, plan, pg)
    theirs, dense_opt = torchrec_model(specs, plan, pg)
    piped, piped_opt = torchrec_model(specs, plan, pg)  # TorchRec's pipeline rewrites the model it runs
    timer = PhaseTimer()
    feeds = {config: itertools.cycle(batches) for config in CONFIGS}  # every configuration: the same batches in turn

    def ours_step(kjt) -> None:
        loss = loss_of(ours(kjt), pooled)
        with timer.phase("backward"):
            loss.backward()

    def ours_plain() -> None:  # the phase split: of the plain step
        ours.timer = timer
        ours_step(next(feeds["embshard"]))
        ours.timer = None

    ours_pipeline = InputPipeline(pg, lambda: next(feeds["embshard_pipelined"]), lambda kjt: [(ours, kjt)])

    def ours_pipelined() -> None:
        kjt = ours_pipeline.next()
        ours_pipeline.prefetch()
        ours_step(kjt)

    def theirs_plain() -> None:
        theirs(FeaturesBatch(next(feeds["torchrec"])))[0].backward()
        if dense_opt is not None:
            dense_opt.step()
            dense_opt.zero_grad()

    their_pipeline = TrainPipelineSparseDist(piped, piped_opt or NoOptimizer(), torch.device("cpu"))
    their_feed = (FeaturesBatch(kjt) for kjt in feeds["torchrec_pipelined"])
    steps = dict(zip(CONFIGS, (ours_plain, ours_pipelined, theirs_plain, lambda: their_pipeline.progress(their_feed))))
    has_dp = any(t.sharding_type is ST.DATA_PARALLEL for t in plan.tables)
    for mode in DATA_PARALLEL_MODES if options.dp_modes and has_dp else ():  # one mode forced on every data-parallel table
        forced, feed = embshard_model(specs, plan, pg, mode), itertools.cycle(batches)
        steps[f"embshard_{mode}"] = lambda m=forced, f=feed: loss_of(m(next(f)), pooled).backward()
    configs = tuple(steps)
    setup_s = time.perf_counter() - start
    for _ in range(options.warmup):
        for step in steps.values():
            step()
    seconds: dict[str, list[float]] = {c: [] for c in configs}
    phases = []
    for config in turns(configs, options.steps):
        timer.reset()
        seconds[config].append(timed(steps[config], pg))
        if config == "embshard":
            phases.append(dict(timer.seconds))
    ours_pipeline.close()
    out = {"case": name, **{f"{c}_s": statistics.median(seconds[c]) for c in configs},
           "range_s": {c: [min(seconds[c]), max(seconds[c])] for c in configs},
           "setup_s": setup_s, "case_s": time.perf_counter() - start,
           "phases_s": {k: statistics.median(p[k] for p in phases) for k in phases[0]}}
    if has_dp:
        out["data_parallel_modes"] = dict(sorted(Counter(t.data_parallel_mode for t in plan.tables if t.data_parallel_mode).items()))
    return out


# ---- driver ----------------------------------------------------------------------------------
def worker(options: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    rank, world, per_host = init_rank()
    pg = dist.group.WORLD
    results = []
    for name, specs, layout in cases(world, per_host):
        if options.only and options.only not in name:
            continue
        results.append(run_case(name, specs, layout, pg, per_host, options))
        if rank == 0:
            print(json.dumps(results[-1]), flush=True)
            Path(options.json).write_text(json.dumps(results))
    dist.destroy_process_group()


def geometric_mean(xs: list[float]) -> float:
    product = 1.0
    for x in xs:
        product *= x
    return product ** (1 / len(xs))


def faster_torchrec_s(r: dict) -> float:
    """The step time of the faster of TorchRec's two configurations in a case."""
    return min(r["torchrec_s"], r["torchrec_pipelined_s"])


def markdown(results: list[dict], meta: dict) -> str:
    hosts: Hosts = meta["hosts"]
    world, batch = hosts.world_size, meta["batch"]
    samples = world * batch
    if hosts.emulated:
        where = (f"{hosts.hosts} emulated hosts x {hosts.ranks_per_host} ranks on CPU, all {world} sharing this machine's cores "
                 f"(inter-host links: {meta['shaping']}; table-wise tables round the {world} ranks, table_row_wise and "
                 "table_column_wise tables on one host's ranks, host after host)")
        title = (f"## On {hosts.hosts} emulated hosts x {hosts.ranks_per_host} ranks, {hosts.link_gbit:g} Gbit/s inter-host links"
                 + (" (QUICK: tiny batch, one step: a check that it runs, not a measurement)" if meta["quick"] else ""))
    else:
        where, title = f"{world} ranks on CPU", TITLE + (" (QUICK: a check that it runs, not a measurement)" if meta["quick"] else "")
    lines = [
        title,
        "",
        f"Date: {DATE}. Machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, gloo, {where} "
        f"(1 thread each, {malloc_sentence(meta['malloc'])}), batch {batch:,} per rank. Command: `{meta['command']}`. Commit: {meta['commit']}. "
        f"Load average (1, 5, 15 min) before / after: {meta['load'][0]} / {meta['load'][1]} (its own {world} ranks count up "
        f"to {world}).",
        "",
        f"Tables: {len(POOLED)} pooled ({', '.join(f'{s.num_embeddings:,}x{s.embedding_dim} pf {s.pooling_factor:g}' for s in POOLED)}), "
        f"{len(SEQUENCE)} sequence ({', '.join(f'{s.num_embeddings:,}x{s.embedding_dim} pf {s.pooling_factor:g}' for s in SEQUENCE)}); "
        "rowwise_adagrad everywhere. Step = forward + backward + fused update; samples/s counts all ranks; "
        f"medians of {meta['steps']} steps per configuration, the configurations' steps taking turns in a new (seeded) order "
        "each round: embshard "
        "plain and pipelined (`InputPipeline`: the next batch's input dist on a side thread), TorchRec's DMP step and "
        "its `TrainPipelineSparseDist` (it runs on CPU: without CUDA streams it issues the next batch's input dist "
        "before this one's forward). Speed-up: the faster TorchRec configuration's step time / embshard's; spread: the "
        "fastest and slowest step of embshard's plain step and of the faster TorchRec configuration. "
        "embshard's phases: of its plain step, medians on rank 0 (input dist includes validation and waiting for the "
        f"slower rank). Each data-parallel table trains in the mode the cost model prices cheaper on {profile_sentence(meta['profile'])}.",
        "",
        "| case | embshard samples/s | embshard pipelined | TorchRec DMP | TorchRec pipeline | speed-up plain "
        "| speed-up pipelined | input dist ms | lookup ms | output dist ms | backward ms | spread ms: embshard / TorchRec |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        p, theirs = r["phases_s"], faster_torchrec_s(r)
        rates = " | ".join(f"{samples / r[f'{c}_s']:,.0f}" for c in CONFIGS)
        spread = " / ".join("-".join(f"{1e3 * x:.0f}" for x in r["range_s"][c])
                            for c in ("embshard", "torchrec" if r["torchrec_s"] == theirs else "torchrec_pipelined"))
        lines.append(f"| {r['case']} | {rates} | {theirs / r['embshard_s']:.2f}x | {theirs / r['embshard_pipelined_s']:.2f}x | "
                     f"{1e3 * p.get('input_dist', 0):.1f} | {1e3 * p.get('lookup', 0):.1f} | "
                     f"{1e3 * p.get('output_dist', 0):.1f} | {1e3 * p.get('backward', 0):.1f} | {spread} |")
    forced = [r for r in results if "embshard_allreduce_s" in r]
    if forced:
        lines += ["", "Data-parallel modes, same run (steps alternating with the rows above): embshard's samples/s with "
                      "each table in its planned mode, and with one mode forced on every data-parallel table.", "",
                  "| case | planned modes (tables) | planned | all allreduce | all replicated_lookup |", "|---|---|---:|---:|---:|"]
        for r in forced:
            modes = ", ".join(f"{m} {n}" for m, n in r["data_parallel_modes"].items())
            lines.append(f"| {r['case']} | {modes} | {samples / r['embshard_s']:,.0f} | {samples / r['embshard_allreduce_s']:,.0f} | "
                         f"{samples / r['embshard_replicated_lookup_s']:,.0f} |")
    lines.append("")
    for label, ours in (("plain", "embshard_s"), ("pipelined", "embshard_pipelined_s")):
        ratios = [faster_torchrec_s(r) / r[ours] for r in results]
        lines.append(f"Speed-up of embshard {label} (faster TorchRec step time / embshard step time): geometric mean "
                     f"{geometric_mean(ratios):.2f}x, min {min(ratios):.2f}x, max {max(ratios):.2f}x over {len(ratios)} cases.")
    lines.append(f"Time on rank 0: {sum(r['case_s'] for r in results):.0f} s over the cases, of which {sum(r['setup_s'] for r in results):.0f} s "
                 "building the models.")
    if not hosts.emulated:
        lines += ["",
                  "Where the time goes. Fused pooled cases run the same FBGEMM kernel in both runtimes, and its CPU "
                  "backward (with the rowwise_adagrad update) is the largest phase (the backward column); embshard's edge there is the "
                  "rest: one header (a 2-element all-reduce where every rank's batch size is the same) + two all-to-alls in (two more for data-parallel features), one out, no per-feature Python on the hot path. "
                  "Sequence tables: embshard looks them up with FBGEMM's summing kernel over one-id bags, whose CPU "
                  "backward is about 10x faster than the PoolingMode.NONE kernel TorchRec uses. Data-parallel: "
                  "embshard's replicas look up the global batch and exchange ids and pooled gradients (replicated_lookup), "
                  "or look up their own samples (allreduce: the forward sends nothing but a failure flag (a 1-element "
                  "all-reduce), read after the look-ups; the backward all-reduces every such table's gradient in one buffer, in two pieces in flight "
                  "at once, each updated as it lands); TorchRec all-reduces whole-table gradients (DDP) and its dense "
                  "RowWiseAdagrad touches every row."]
    lines += ["", "The machine is shared: alternating the runtimes step by step and taking medians damps, but "
                  "does not remove, noise from other load.", ""]
    return "\n".join(lines)


def settings(args: argparse.Namespace, hosts: Hosts) -> dict:
    """What the ranks run: only, steps, warmup and batch per rank (--quick's, else the flags', else the mode's defaults:
    on emulated hosts fewer steps and a smaller batch); ValueError on bad values."""
    if args.quick:
        return dict(QUICK)
    out = {"only": args.only, "steps": args.steps or (HOSTS_STEPS if hosts.emulated else STEPS),
           "warmup": HOSTS_WARMUP if hosts.emulated else WARMUP, "batch": args.batch or (HOSTS_BATCH if hosts.emulated else BATCH_SIZE)}
    if out["steps"] < 1 or out["batch"] < 1:
        raise ValueError(f"--steps {out['steps']}, --batch {out['batch']}: both must be at least 1")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="runtime_vs_torchrec.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="default: benchmarks/results/runtime.md (with --hosts: its hosts section; "
                        "with --quick: none, printed only)")
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    parser.add_argument("--dp-modes", action="store_true",
                        help="also time embshard with each data-parallel mode forced on every data-parallel table")
    parser.add_argument("--steps", type=int, help=f"timed steps per configuration (default {STEPS}, {HOSTS_STEPS} with --hosts)")
    parser.add_argument("--batch", type=int, help=f"batch per rank (default {BATCH_SIZE}, {HOSTS_BATCH} with --hosts)")
    parser.add_argument("--quick", action="store_true", help="the two mixed cases, batch 128, one step: a check (printed only)")
    parser.add_argument("--profile", default="cpu_gloo_measured",
                        help="topology profile that prices the plans (each data-parallel table's mode); none: datasheet terms")
    add_hosts_arguments(parser)
    add_malloc_argument(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    try:
        hosts = hosts_of(args, RANKS_PER_HOST)
        run = settings(args, hosts)
    except ValueError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    json_path = Path(tempfile.mkdtemp(prefix="embshard-bench-")) / "runtime.json"
    commit, load_before = commit_label(), load_average()
    try:
        shaping = run_ranks(__file__, ["--worker", "--json", str(json_path), "--only", run["only"], "--steps", str(run["steps"]),
                                       "--warmup", str(run["warmup"]), "--batch", str(run["batch"]), "--profile", args.profile,
                                       *(["--dp-modes"] if args.dp_modes else [])],
                            hosts=hosts.hosts, ranks_per_host=hosts.ranks_per_host, link_gbit=hosts.link_gbit, delay_ms=hosts.delay_ms,
                            env=malloc_env(args.malloc))
    except EmulationUnavailable as e:
        parser.exit(2, f"{parser.prog}: error: no emulated hosts here (--hosts needs root, ip and tc): {e}\n")
    meta = {"hosts": hosts, "shaping": shaping, "steps": run["steps"], "batch": run["batch"], "profile": args.profile,
            "quick": args.quick, "malloc": args.malloc, "commit": commit, "load": (load_before, load_average()),
            "command": " ".join([COMMAND if not hosts.emulated else f"sudo {COMMAND}", *sys.argv[1:]])}
    text = markdown(json.loads(json_path.read_text()), meta)
    write_results(args.out, text, Path("benchmarks/results/runtime.md"), hosts, args.quick, TITLE)
    print(text)


if __name__ == "__main__":
    main()
