"""DLRM training throughput: embshard vs TorchRec's DLRM under DistributedModelParallel.

    .venv/bin/python benchmarks/train_throughput.py --out benchmarks/results/train.md

Two gloo ranks on CPU (or 2 hosts x 2, below) train the same model on the same tables (configs/tables/criteo_small:
26 Criteo tables capped at 100,000 rows, dim 16), the same batches (synthetic Criteo-like,
pre-generated), the same plan and the same optimizers: embshard's planner plans the tables
(``torchrec_compatible``, so TorchRec can run the layout), the plan goes to TorchRec through
`embshard.interop.torchrec.to_torchrec_plan`. embshard: `embshard.models.dlrm.DLRM` sharded
by `shard_model` (fused rowwise_adagrad for every table, DDP + Adagrad for the MLPs, torch's fused=True
implementation as embshard's trainer builds it). TorchRec:
`torchrec.models.dlrm.DLRM` (or DLRM_DCN) with fused EXACT_ROWWISE_ADAGRAD, data-parallel
tables under DDP with torchrec's RowWiseAdagrad, the same fused Adagrad for the MLPs. A step is forward, BCE
loss, backward (fused table updates) and the dense optimizer step. Each case runs ROUNDS
rounds of ITERS steps (at batch 2048; proportionally more at batch 512, `steps_per_round`) of each configuration below, taking turns in a new seeded order each round (a
rotation of one order would keep each configuration's predecessor the same); the median round of each
counts. (The best round favoured whichever side had more configurations: the faster of TorchRec's two
took the best of 10 rounds against embshard's 5, and on 2 cores a lucky round runs 15-25% under the
median: DLRM-v2's TorchRec pipeline once took 92.8 ms where its other rounds took 101 to 128 ms.) Besides wall-clock samples/s it
reports samples per CPU-second (both ranks' process CPU time), which other processes on a
shared machine disturb much less; the load average during the run is recorded too.

Each runtime runs two ways: embshard's plain step and its pipelined one (`embshard.runtime.pipeline`,
``pipeline: true`` in configs/train.yaml: the next batch's input dist on a side thread), TorchRec's
plain DMP step and its `TrainPipelineSparseDist` (the next batch's input dist overlapping this one's
forward and backward; it runs on CPU). Ratios are each embshard step against the faster TorchRec one.

    sudo .venv/bin/python benchmarks/train_throughput.py --hosts 2 --ranks-per-host 2 --link-gbit 2          # ~8 min
    sudo .venv/bin/python benchmarks/train_throughput.py --hosts 2 --ranks-per-host 2 --link-gbit 2 --quick  # a check

``--hosts H --ranks-per-host L --link-gbit G`` (plans_measured.py's multi-host flags): the same cases on H
emulated hosts x L ranks (embshard/emulated_hosts.py, needs root), the plan made for H x L ranks on H hosts,
each host's link shaped to G Gbit/s each way (tbf; a delay where the kernel has netem). Three repeats of
4 rounds of 8 steps, 32 at batch 512 (the H x L ranks share this machine's cores; ~8 min on 2 cores; one repeat moved DLRM-v2's
ratios by 0.05-0.2 between runs), with the rounds' spread; the results go into their own section of the results
file (``<!-- hosts:start -->``, which a one-host run keeps), their JSON next to it as train_hosts.json.
``--quick``: one case, tiny batch, one round of two steps: a check that it runs, printed only.

``--malloc default``: the ranks run glibc's malloc at its default settings; by default they keep freed memory
(`local_ranks.MALLOC_TUNABLES`, which says why: with glibc's defaults the peer ran below its best).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist
import torch.nn.functional as F
from local_ranks import Hosts, add_hosts_arguments, add_malloc_argument, hosts_of, init_rank, malloc_env, malloc_sentence, run_ranks, turns
from profiles import profile_sentence, profile_topology
from sections import commit_label, load_average, write_results

from embshard.emulated_hosts import EmulationUnavailable
from embshard.machine import cpu_model

RANKS_PER_HOST, LR_DENSE, LR_SPARSE, EPS = 2, 0.02, 0.05, 1e-8
WARMUP, ITERS, ROUNDS, REPEATS, NUM_BATCHES = 3, 20, 5, 3, 4
HOSTS = {"warmup": 2, "iters": 8, "rounds": 4, "repeats": 3}  # on emulated hosts: fewer, shorter rounds (~8 min on 2 cores)
QUICK = {"only": "batch 512", "batch": 128, "warmup": 1, "iters": 2, "rounds": 1, "repeats": 1}  # --quick: a check that it runs
TITLE = "# Training throughput: embshard vs TorchRec DistributedModelParallel"
DATE = time.strftime("%Y-%m-%d", time.gmtime())  # the day of the run
COMMAND = ".venv/bin/python benchmarks/train_throughput.py"
CONFIGS = ("embshard", "embshard_pipelined", "torchrec", "torchrec_pipelined")
ROOT = Path(__file__).resolve().parents[1]
# (name, interaction, batch per rank, bottom MLP, top MLP, data-parallel tables allowed)
CASES = [("DLRM dot, batch 512", "dot", 512, (64, 16), (256, 128, 1), True),
         ("DLRM dot, batch 2048", "dot", 2048, (64, 16), (256, 128, 1), True),
         ("DLRM dot, batch 2048, no DP tables", "dot", 2048, (64, 16), (256, 128, 1), False),
         ("DLRM-v2 DCN, batch 2048", "dcn", 2048, (64, 16), (256, 128, 1), True)]
DCN_LAYERS, DCN_RANK = 3, 64
# A round of a case with a smaller batch runs proportionally more steps (the same samples as ``iters`` steps at this
# batch): DLRM batch 512's steps on emulated hosts take ~60 ms, and rounds of 8 (0.5 s) spread 20,000-50,000 samples/s.
ROUND_BATCH = 2048


def steps_per_round(iters: int, case_batch: int, batch_option: int) -> int:
    """``iters`` for a case of ``ROUND_BATCH`` or more; x ROUND_BATCH // batch for a smaller one (its own batch:
    ``--batch`` runs ``iters`` steps as given)."""
    return iters if batch_option else iters * max(1, ROUND_BATCH // case_batch)


def specs_and_plan(batch: int, data_parallel: bool, world_size: int, local_world_size: int, profile: str):
    from embshard import planner
    from embshard.planner.types import Constraints, ShardingType, TableConstraint
    from embshard.specs import load_tables_file

    specs, _ = load_tables_file(ROOT / "embshard" / "configs" / "tables" / "criteo_small.yaml")
    topology = profile_topology(profile, world_size=world_size, local_world_size=local_world_size, hbm_gib=16,
                                batch_size_per_rank=batch, device="cpu")
    sharded = tuple(t for t in ShardingType if t is not ShardingType.DATA_PARALLEL)
    constraints = None if data_parallel else Constraints({s.name: TableConstraint(sharded) for s in specs})
    return specs, planner.plan(specs, topology, constraints, time_budget_s=2.0, torchrec_compatible=True)


def shared_plan(pg, local_world_size: int, *plan_args):
    """(specs, plan) of `specs_and_plan` on rank 0, the same on every rank: the planner's search is time-budgeted, so
    ranks planning on their own may find different plans (on 4 ranks sharing 2 cores they did)."""
    from embshard.launch.distributed import RankContext, on_main
    from embshard.planner.plan import ShardingPlan

    ctx = RankContext(dist.get_rank(pg), dist.get_world_size(pg), dist.get_rank(pg) % local_world_size, local_world_size,
                      torch.device("cpu"), pg)
    plan = ShardingPlan.from_json(on_main(ctx, lambda: specs_and_plan(*plan_args)[1].to_json()))
    return plan.specs, plan


def make_batches(specs, rank: int, world_size: int, batch: int):
    from embshard.data.batch import FeatureLayout
    from embshard.data.config import SyntheticConfig
    from embshard.data.stream import open_stream

    stream = open_stream(SyntheticConfig(), FeatureLayout.from_specs(specs), rank, world_size, batch, "train")
    return [next(stream) for _ in range(NUM_BATCHES)]


def embshard_model(specs, plan, pg, interaction: str, bottom, top):
    from embshard.models.config import DLRMConfig
    from embshard.models.dlrm import DLRM
    from embshard.runtime import OptimizerConfig, shard_model

    config = DLRMConfig(interaction=interaction, bottom_mlp=bottom, top_mlp=top, dcn_num_layers=DCN_LAYERS,
                        dcn_low_rank=DCN_RANK)
    model = shard_model(DLRM(config, specs, 13), plan, pg, optimizer=OptimizerConfig(learning_rate=LR_SPARSE, eps=EPS))
    return model, [torch.optim.Adagrad(model.parameters(), lr=LR_DENSE, eps=EPS, fused=True)]


def torchrec_model(specs, plan, pg, interaction: str, bottom, top):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from embshard.interop.torchrec import to_embedding_configs, to_torchrec_plan

    ebc = EmbeddingBagCollection(tables=to_embedding_configs(specs)[0], device=torch.device("meta"))
    if interaction == "dot":
        module = DLRMTrain(DLRM(ebc, 13, list(bottom), list(top)))  # model(batch) -> (mean BCE loss, outputs)
    else:
        module = DLRMTrain(DLRM_DCN(ebc, 13, list(bottom), list(top), dcn_num_layers=DCN_LAYERS, dcn_low_rank_dim=DCN_RANK))
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR_SPARSE, "eps": EPS}
    model = DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"),
                                     plan=to_torchrec_plan(plan, "model.sparse_arch.embedding_bag_collection"),
                                     sharders=[EmbeddingBagCollectionSharder(fused_params=fused)])
    fused_names = set(model.fused_optimizer.params)
    rest = [(n, p) for n, p in model.named_parameters() if p.requires_grad and n not in fused_names]
    # Data-parallel tables (dense kernel, under DDP); tables held by other ranks show up as empty placeholders.
    tables = [p for n, p in rest if "embedding_bags" in n and p.dim() == 2]
    mlps = [p for n, p in rest if "embedding_bags" not in n]
    optimizers = [torch.optim.Adagrad(mlps, lr=LR_DENSE, eps=EPS, fused=True)]
    if tables:
        optimizers.append(RowWiseAdagrad(tables, lr=LR_SPARSE, eps=EPS))
    return model, optimizers


def embshard_steps(model, optimizers, batches, pg):
    """(plain step, pipelined step) of embshard's model; each takes the next of ``batches`` (cycling)."""
    from embshard.runtime.pipeline import InputPipeline

    def train(batch) -> None:
        loss = F.binary_cross_entropy_with_logits(model(batch.dense, batch.sparse), batch.labels)
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        for opt in optimizers:
            opt.step()

    plain, pipelined = itertools.cycle(batches), itertools.cycle(batches)
    pipeline = InputPipeline(pg, lambda: next(pipelined), lambda b: [(model.module.sparse, b.sparse)])

    def pipelined_step() -> None:
        batch = pipeline.next()
        pipeline.prefetch()
        train(batch)
    return (lambda: train(next(plain))), pipelined_step, pipeline


class Optimizers:
    """Several optimizers stepped as one (TorchRec's pipeline takes one)."""

    def __init__(self, optimizers) -> None:
        self.optimizers = optimizers

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()


def torchrec_steps(specs, plan, pg, interaction: str, bottom, top, batches):
    """(plain DMP step, TrainPipelineSparseDist step), each on a DMP of its own (the pipeline rewrites its model)."""
    from torchrec.datasets.utils import Batch
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    batches = [Batch(dense_features=b.dense, sparse_features=b.sparse, labels=b.labels) for b in batches]
    model, optimizers = torchrec_model(specs, plan, pg, interaction, bottom, top)
    plain = itertools.cycle(batches)

    def step() -> None:
        loss, _ = model(next(plain))
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        for opt in optimizers:
            opt.step()

    piped_model, piped_optimizers = torchrec_model(specs, plan, pg, interaction, bottom, top)
    pipeline = TrainPipelineSparseDist(piped_model, Optimizers(piped_optimizers), torch.device("cpu"))
    pipelined = itertools.cycle(batches)
    return step, lambda: pipeline.progress(pipelined)


def measure(step, pg, iters: int, warmup: int) -> tuple[float, float]:
    """(wall seconds per step on rank 0 between barriers, CPU seconds per step of all ranks), after ``warmup`` steps."""
    for _ in range(warmup):
        step()
    dist.barrier(group=pg)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(iters):
        step()
    cpu = torch.tensor([time.process_time() - cpu_start], dtype=torch.float64)
    dist.barrier(group=pg)
    wall = time.perf_counter() - start
    dist.all_reduce(cpu, group=pg)
    return wall / iters, float(cpu) / iters


def run_case(name: str, interaction: str, batch: int, bottom, top, data_parallel: bool, pg, local_world_size: int,
             options: argparse.Namespace) -> dict:
    from embshard.planner.report import sharding_type_counts

    torch.manual_seed(0)
    world = dist.get_world_size(pg)
    iters = steps_per_round(options.iters, batch, options.batch)
    batch = options.batch or batch
    specs, plan = shared_plan(pg, local_world_size, batch, data_parallel, world, local_world_size, options.profile)
    batches = make_batches(specs, dist.get_rank(pg), world, batch)
    ours, ours_pipelined, pipeline = embshard_steps(*embshard_model(specs, plan, pg, interaction, bottom, top), batches, pg)
    theirs, theirs_pipelined = torchrec_steps(specs, plan, pg, interaction, bottom, top, batches)
    steps = dict(zip(CONFIGS, (ours, ours_pipelined, theirs, theirs_pipelined)))
    runs: dict[str, list[tuple[float, float]]] = {c: [] for c in CONFIGS}
    for config in turns(CONFIGS, options.rounds):
        runs[config].append(measure(steps[config], pg, iters, options.warmup))
    pipeline.close()
    samples = batch * world
    return {"case": name, "batch_per_rank": batch, "plan": sharding_type_counts(plan), "load_average": os.getloadavg()[0],
            **{f"{c}_samples_per_s": samples / median(w for w, _ in runs[c]) for c in CONFIGS},
            **{f"{c}_samples_per_cpu_s": samples / median(u for _, u in runs[c]) for c in CONFIGS},
            **{f"{c}_rounds_samples_per_s": [samples / w for w, _ in runs[c]] for c in CONFIGS}}


def worker(options: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    rank, _, local_world_size = init_rank()
    results = []
    for repeat in range(options.repeats):
        for case in CASES:
            if options.only not in case[0]:
                continue
            results.append({**run_case(*case, dist.group.WORLD, local_world_size, options), "repeat": repeat})
            if rank == 0:
                print(json.dumps(results[-1]), flush=True)
    if rank == 0:
        Path(options.json).write_text(json.dumps(results))
    dist.destroy_process_group()


def markdown(results: list[dict], meta: dict) -> str:
    repeats = max(r["repeat"] for r in results) + 1
    hosts: Hosts = meta["hosts"]
    world = hosts.world_size
    if hosts.emulated:
        where = (f"{hosts.hosts} emulated hosts x {hosts.ranks_per_host} gloo ranks (1 thread each, all {world} sharing this "
                 f"machine's cores; inter-host links: {meta['shaping']})")
        title = (f"## On {hosts.hosts} emulated hosts x {hosts.ranks_per_host} ranks, {hosts.link_gbit:g} Gbit/s inter-host links"
                 + (" (QUICK: one case, tiny batch, two steps: a check that it runs, not a measurement)" if meta["quick"] else ""))
    else:
        where, title = f"{world} gloo ranks (1 thread each)", TITLE + (" (QUICK: a check that it runs, not a measurement)" if meta["quick"] else "")
    smaller = sorted({b for _, _, b, *_ in CASES if b < ROUND_BATCH})
    round_note = "" if meta["batch"] or not smaller else (
        f" at batch {ROUND_BATCH} or more, " + ", ".join(f"{steps_per_round(meta['iters'], b, 0)} at batch {b}" for b in smaller)
        + " (the same samples per round)")
    lines = [
        title,
        "",
        f"Date: {DATE}. Machine: {cpu_model()}, {os.cpu_count()} cores, {where}, "
        f"torch {torch.__version__}, TorchRec 1.8.0, FBGEMM CPU 1.8.0, {malloc_sentence(meta['malloc'])}.",
        f"Command: `{meta['command']}`. Commit: {meta['commit']}. Load average (1, 5, 15 min) before / after the run: "
        f"{meta['load'][0]} / {meta['load'][1]}.",
        "",
        "Same tables (criteo_small: 26 tables, dim 16, up to 100,000 rows), batches, plan (embshard's planner, "
        f"torchrec_compatible, on {profile_sentence(meta['profile'])}) and optimizers (fused rowwise_adagrad for tables, torch's fused Adagrad for MLPs on both sides). "
        "Bottom MLP 13-64-16, top MLP 256-128-1; DCN: 3 layers, rank 64. "
        "Each runtime runs two ways: embshard plain and pipelined (`pipeline: true`: the next batch's input dist on a "
        "side thread), TorchRec's DMP step and its `TrainPipelineSparseDist` (runs on CPU: no CUDA streams, the "
        "input dist of the next batch is issued before this one's forward). "
        f"Each case ran {repeats} times; each time, the median of {meta['rounds']} rounds of {meta['iters']} steps{round_note} (after "
        f"{meta['warmup']} warmup steps each), the four configurations taking turns in a new seeded order each round. Samples/s count all ranks (median over "
        "the repeats); samples per CPU-second divide by all ranks' process CPU time. Ratios are embshard / the faster TorchRec "
        "configuration (by wall clock, resp. by CPU time) of the same repeat: median [min, max] over the repeats. "
        "Spread: the slowest and fastest round (samples/s, every repeat) of embshard plain and of the faster TorchRec "
        f"configuration. Load: the 1-minute load average during the case ({os.cpu_count()} cores; its own {world} ranks count "
        f"up to {world}, more means other processes competed).",
        "",
        "| case | plan | load | embshard | embshard pipelined | TorchRec DMP | TorchRec pipeline "
        "| wall ratio plain | wall ratio pipelined | CPU ratio plain | CPU ratio pipelined | rounds' spread: embshard / TorchRec |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(runs: list[dict], ours: str, unit: str) -> str:
        x = sorted(r[f"{ours}_samples_per_{unit}"] / max(r[f"torchrec_samples_per_{unit}"],
                                                         r[f"torchrec_pipelined_samples_per_{unit}"]) for r in runs)
        return f"{median(x):.2f}x [{x[0]:.2f}, {x[-1]:.2f}]"

    def spread(runs: list[dict], config: str) -> str:
        x = [v for r in runs for v in r[f"{config}_rounds_samples_per_s"]]
        return f"{min(x):,.0f}-{max(x):,.0f}"

    for name, *_ in CASES:
        runs = [r for r in results if r["case"] == name]
        if not runs:
            continue
        plan = ", ".join(f"{k} {v}" for k, v in runs[0]["plan"].items())
        rates = " | ".join(f"{median([r[f'{c}_samples_per_s'] for r in runs]):,.0f}" for c in CONFIGS)
        theirs = max(("torchrec", "torchrec_pipelined"), key=lambda c: median([r[f"{c}_samples_per_s"] for r in runs]))
        lines.append(f"| {name} | {plan} | {median([r['load_average'] for r in runs]):.1f} | {rates} "
                     f"| {ratio(runs, 'embshard', 's')} | {ratio(runs, 'embshard_pipelined', 's')} "
                     f"| {ratio(runs, 'embshard', 'cpu_s')} | {ratio(runs, 'embshard_pipelined', 'cpu_s')} "
                     f"| {spread(runs, 'embshard')} / {spread(runs, theirs)} |")
    return "\n".join(lines) + "\n"


def settings(args: argparse.Namespace, hosts: Hosts) -> dict:
    """What the ranks run: only, batch (0: each case's own), warmup, iters, rounds and repeats (--quick's, else the
    flags', else the mode's defaults: on emulated hosts fewer steps); ValueError on bad values."""
    if args.quick:
        return dict(QUICK)
    defaults = HOSTS if hosts.emulated else {"warmup": WARMUP, "iters": ITERS, "rounds": ROUNDS, "repeats": REPEATS}
    out = {"only": args.only, "batch": args.batch, **{k: getattr(args, k) or v for k, v in defaults.items()}}
    if min(out["iters"], out["rounds"], out["repeats"]) < 1 or out["batch"] < 0:
        raise ValueError(f"--iters {out['iters']}, --rounds {out['rounds']}, --repeats {out['repeats']}, --batch {out['batch']}: "
                         "the first three must be at least 1, the batch 0 (each case's own) or more")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="train_throughput.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="default: benchmarks/results/train.md (with --hosts: its hosts section; "
                        "with --quick: none, printed only)")
    parser.add_argument("--repeats", type=int, help=f"run every case this many times (default {REPEATS}, {HOSTS['repeats']} with --hosts)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--iters", type=int, help=f"steps per round (default {ITERS}, {HOSTS['iters']} with --hosts)")
    parser.add_argument("--rounds", type=int, help=f"rounds per configuration (default {ROUNDS}, {HOSTS['rounds']} with --hosts)")
    parser.add_argument("--batch", type=int, default=0, help="batch per rank of every case (0: the case's own)")
    parser.add_argument("--quick", action="store_true", help="one case, batch 128, one round of 2 steps: a check (printed only)")
    parser.add_argument("--profile", default="cpu_gloo_measured", help="topology profile the planner plans with; none: datasheet terms")
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
    out = Path(args.out or "benchmarks/results/train.md")
    json_path = (Path(tempfile.mkdtemp(prefix="embshard-bench-")) / "train.json" if args.quick and args.out is None
                 else out.with_name(f"{out.stem}_hosts.json") if hosts.emulated else out.with_suffix(".json")).absolute()
    json_path.parent.mkdir(parents=True, exist_ok=True)
    commit, load_before = commit_label(), load_average()
    try:
        shaping = run_ranks(__file__, ["--worker", "--json", str(json_path), *(f"--{k}={v}" for k, v in run.items())],
                            hosts=hosts.hosts, ranks_per_host=hosts.ranks_per_host, link_gbit=hosts.link_gbit,
                            delay_ms=hosts.delay_ms, env={"PYTHONPATH": str(ROOT), **malloc_env(args.malloc)})
    except EmulationUnavailable as e:
        parser.exit(2, f"{parser.prog}: error: no emulated hosts here (--hosts needs root, ip and tc): {e}\n")
    meta = {"hosts": hosts, "shaping": shaping, "warmup": run["warmup"], "iters": run["iters"], "rounds": run["rounds"], "batch": run["batch"],
            "profile": args.profile, "quick": args.quick, "malloc": args.malloc, "commit": commit, "load": (load_before, load_average()),
            "command": " ".join([COMMAND if not hosts.emulated else f"sudo {COMMAND}", *sys.argv[1:]])}
    text = markdown(json.loads(json_path.read_text()), meta)
    write_results(args.out, text, out, hosts, args.quick, TITLE)
    print(text)


if __name__ == "__main__":
    main()
