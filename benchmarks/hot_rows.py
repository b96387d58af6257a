"""Hot-row replication (FlexShard) on sequence tables with skewed ids: embshard with the hot
rows the planner chose, embshard on the same layout without them, and TorchRec's DMP on it.

    .venv/bin/python benchmarks/hot_rows.py --out benchmarks/results/hot_rows.md
    .venv/bin/python benchmarks/hot_rows.py --tiny --out /tmp/hot_rows.md      # a quick check at a tiny size

Ids follow Zipf laws (exponent per workload, ranks scattered over the rows). The access
counts are taken on the same stream with embshard-stats' counters (`ExactCounter`: its
curve becomes each table's ``hot_rows``, its ``hottest`` ranking the hot-ids file; the CLI
itself measures pooled tables only), then `embshard.planner.plan(hot_ids_file=...)` chooses
the layout and each table's hot fraction. Counted bytes: every ``all_to_all_single`` and
``all_reduce`` payload sent to other ranks, per rank and step, by wrapping torch.distributed's
functions (both runtimes call them). Steps alternate between the three runtimes and are
timed between barriers on rank 0; medians. Gloo ranks on CPU, one thread each, one host.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from embshard import planner
from embshard.machine import cpu_model
from embshard.planner.cost.hot_rows import lookup_share
from embshard.planner.types import Constraints, ShardingType, TableConstraint
from embshard.runtime import OptimizerConfig, ShardedEmbeddingCollection
from embshard.specs import TableSpec
from embshard.stats.counters import ExactCounter
from embshard.stats.hot_ids import write_hot_ids
from embshard.stats.measure import HOT_FRACTIONS, max_hot_rows
from embshard.topology import Topology
from local_ranks import run_script_ranks
from runtime_vs_torchrec import loss_of, timed, torchrec_model

LR = 0.01
FULL = dict(world_size=2, batch_size=1024, rows=(200_000, 100_000, 300_000, 50_000), pooling=(20, 10, 25, 15), dim=64,
            warmup=2, steps=12, num_batches=4)
TINY = dict(world_size=2, batch_size=32, rows=(2_000, 1_000), pooling=(8, 4), dim=16, warmup=1, steps=2, num_batches=2)
WORKLOADS = (1.05, 1.2)  # Zipf exponents
STATS_BATCHES = 8  # batches per rank counted for the statistics (the stream the runs train on, and more)


def specs_of(size: dict) -> list[TableSpec]:
    return [TableSpec(f"s{i}", rows, size["dim"], pf, pooled=False, feature_names=(f"sf{i}",), optimizer="rowwise_adagrad")
            for i, (rows, pf) in enumerate(zip(size["rows"], size["pooling"]))]


def zipf_batches(specs: list[TableSpec], s: float, batch_size: int, count: int, seed: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """count batches, each (lengths, ids) per table: lengths uniform in [0, 2 pf], ids Zipf(s) with ranks scattered."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        batch = []
        for i, spec in enumerate(specs):
            perm = np.random.default_rng(1000 + i).permutation(spec.num_embeddings)  # the same on every rank
            pmf = 1.0 / np.arange(1, spec.num_embeddings + 1) ** s
            lengths = rng.integers(0, int(2 * spec.pooling_factor) + 1, batch_size)
            ids = perm[rng.choice(spec.num_embeddings, int(lengths.sum()), p=pmf / pmf.sum())]
            batch.append((lengths, ids))
        out.append(batch)
    return out


def measured(specs: list[TableSpec], s: float, size: dict, hot_ids_path: Path) -> list[TableSpec]:
    """Specs with the hot_rows curve of every rank's stream; writes the hot-ids file."""
    counters = [ExactCounter(spec.num_embeddings) for spec in specs]
    for rank in range(size["world_size"]):
        for batch in zipf_batches(specs, s, size["batch_size"], STATS_BATCHES, seed=rank):
            for counter, (_, ids) in zip(counters, batch):
                counter.add(ids)
    write_hot_ids(hot_ids_path, {spec.name: c.hottest(max_hot_rows(spec.num_embeddings)) for spec, c in zip(specs, counters)})
    return [dataclasses.replace(spec, hot_rows=tuple(zip(HOT_FRACTIONS, c.curve(HOT_FRACTIONS)))) for spec, c in zip(specs, counters)]


class ByteCounter:
    """Bytes this rank sends to other ranks through all_to_all_single and all_reduce (wraps torch.distributed)."""

    def __init__(self) -> None:
        self.all_to_all = self.all_reduce = 0
        self.on = False
        a2a, ar = dist.all_to_all_single, dist.all_reduce

        def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
            if self.on and input.numel():
                W, rank = dist.get_world_size(kwargs.get("group")), dist.get_rank(kwargs.get("group"))
                row = input.element_size() * (input.numel() // input.shape[0])
                splits = list(input_split_sizes) if input_split_sizes else [input.shape[0] // W] * W
                self.all_to_all += row * (sum(splits) - splits[rank])
            return a2a(output, input, output_split_sizes, input_split_sizes, *args, **kwargs)

        def all_reduce(tensor, *args, **kwargs):
            if self.on:
                W = dist.get_world_size(kwargs.get("group"))
                self.all_reduce += 2 * tensor.numel() * tensor.element_size() * (W - 1) // W  # a ring's share
            return ar(tensor, *args, **kwargs)

        dist.all_to_all_single, dist.all_reduce = all_to_all_single, all_reduce

    def take(self) -> tuple[int, int]:
        out = (self.all_to_all, self.all_reduce)
        self.all_to_all = self.all_reduce = 0
        return out


def kjts(batches) -> list:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    return [KeyedJaggedTensor(keys=[f"sf{i}" for i in range(len(b))], values=torch.from_numpy(np.concatenate([ids for _, ids in b])),
                              lengths=torch.from_numpy(np.concatenate([lengths for lengths, _ in b]))) for b in batches]


def run_workload(s: float, size: dict, pg, counter: ByteCounter, work_dir: Path) -> dict:
    rank, W = dist.get_rank(pg), dist.get_world_size(pg)
    specs = specs_of(size)
    hot_ids = work_dir / f"hot_ids_{s}.npz"
    if rank == 0:
        specs = measured(specs, s, size, hot_ids)
        topo = Topology(world_size=W, local_world_size=W, device="cpu", batch_size_per_rank=size["batch_size"])
        # layouts both runtimes run (TorchRec's EmbeddingCollection has no data-parallel on CPU)
        allowed = TableConstraint((ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE))
        plan = planner.plan(specs, topo, Constraints(tables={t.name: allowed for t in specs}), time_budget_s=5,
                            hot_ids_file=str(hot_ids))
        text = [plan.to_json()]
    else:
        text = [None]
    dist.broadcast_object_list(text, src=0, group=pg)
    plan = planner.ShardingPlan.from_json(text[0])
    cold_plan = dataclasses.replace(plan, tables=tuple(dataclasses.replace(t, hot_rows=0) for t in plan.tables), hot_ids_file="")
    specs = list(plan.specs)
    batches = kjts(zipf_batches(specs, s, size["batch_size"], size["num_batches"], seed=rank))
    config = OptimizerConfig(learning_rate=LR)
    hot = ShardedEmbeddingCollection(specs, plan, pg, optimizer=config)
    cold = ShardedEmbeddingCollection(specs, cold_plan, pg, optimizer=config)
    theirs, _ = torchrec_model(specs, cold_plan, pg)
    runs = {"embshard hot rows": hot, "embshard": cold, "TorchRec DMP": theirs}

    def step_of(model):
        return lambda kjt: loss_of(model(kjt), False).backward()

    steps = {name: step_of(m) for name, m in runs.items()}
    for i in range(size["warmup"]):
        for step in steps.values():
            step(batches[i % len(batches)])
    seconds = {name: [] for name in runs}
    bytes_ = {name: [] for name in runs}
    order = list(runs)
    for i in range(size["steps"]):
        kjt = batches[i % len(batches)]
        for name in order[i % 3:] + order[:i % 3]:
            counter.on = True
            seconds[name].append(timed(steps[name], kjt, pg))
            counter.on = False
            bytes_[name].append(counter.take())
    per_rank = [None] * W
    dist.all_gather_object(per_rank, {n: [statistics.mean(b[0] for b in v), statistics.mean(b[1] for b in v)] for n, v in bytes_.items()},
                           group=pg)
    return {"zipf": s, "tables": [(t.name, t.num_embeddings, t.embedding_dim, t.pooling_factor) for t in specs],
            "layout": {t.name: f"{t.sharding_type.value}/{len(t.shards)}" for t in plan.tables},
            "hot_rows": {t.name: t.hot_rows for t in plan.tables},
            "hot_share": {t.name: lookup_share(plan.spec(t.name), t.hot_rows) for t in plan.tables},
            "step_s": {n: statistics.median(v) for n, v in seconds.items()},
            "bytes": {n: [max(r[n][0] for r in per_rank), max(r[n][1] for r in per_rank)] for n in runs},
            "predicted_ms": plan.max_rank_ms, "predicted_cold_ms": planner.evaluate(specs, plan.topology, cold_plan.tables).max_rank_ms}


def worker(rank: int, port: int, out: str, tiny: bool) -> None:
    size = TINY if tiny else FULL
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size["world_size"],
                            timeout=datetime.timedelta(seconds=600))
    pg = dist.group.WORLD
    counter = ByteCounter()
    work_dir = Path(out).parent
    results = [run_workload(s, size, pg, counter, work_dir) for s in WORKLOADS]
    if rank == 0:
        Path(out).write_text(json.dumps({"size": size, "results": results}))
    dist.destroy_process_group()


def markdown(data: dict, command: str) -> str:
    size, results = data["size"], data["results"]
    samples = size["world_size"] * size["batch_size"]
    lines = ["# Hot-row replication on skewed sequence tables", "",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, gloo, {size['world_size']} ranks on "
             f"one host (CPU, 1 thread each), batch {size['batch_size']:,} per rank, rowwise_adagrad. Command: `{command}`.", "",
             "Bytes: all-to-all and all-reduce payload each rank sends to other ranks per step (the busiest rank; an all-reduce "
             "counts a ring's 2 (W-1)/W of its buffer). Step: forward + backward + fused update, median of "
             f"{size['steps']} steps, the three runs alternating.", ""]
    for r in results:
        lines += [f"## Zipf exponent {r['zipf']}", "",
                  "Tables: " + ", ".join(f"{n} {rows:,}x{d} pf {pf:g}" for n, rows, d, pf in r["tables"]) + ".", "",
                  "Planner: " + ", ".join(f"{n} {r['layout'][n]}, hot {r['hot_rows'][n]:,} rows "
                                          f"({r['hot_share'][n]:.0%} of lookups)" for n in r["layout"]) +
                  f"; predicted {r['predicted_ms']:.2f} ms per step with hot rows, {r['predicted_cold_ms']:.2f} ms without.", "",
                  "| run | all-to-all MB/step | all-reduce MB/step | step ms | samples/s |", "|---|---:|---:|---:|---:|"]
        for name, (a2a, ar) in r["bytes"].items():
            step = r["step_s"][name]
            lines.append(f"| {name} | {a2a / 1e6:.3f} | {ar / 1e6:.3f} | {1e3 * step:.1f} | {samples / step:,.0f} |")
        base, hot = r["bytes"]["embshard"][0], r["bytes"]["embshard hot rows"][0]
        lines += ["", f"All-to-all bytes with hot rows: {hot / base - 1:+.0%} against the same layout without; step "
                      f"{r['step_s']['embshard hot rows'] / r['step_s']['embshard'] - 1:+.0%}.", ""]
    lines += ["Not measured here: 2 emulated hosts (embshard/emulated_hosts.py), where the saved bytes cross the slow link.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/hot_rows.md")
    parser.add_argument("--tiny", action="store_true", help="tiny tables and batches: checks that it runs")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        worker(args.rank, args.port, args.json, args.tiny)
        return
    size = TINY if args.tiny else FULL
    json_path = Path(tempfile.mkdtemp(prefix="embshard-hot-")) / "hot_rows.json"
    run_script_ranks(__file__, size["world_size"], lambda r, port: ["--rank", str(r), "--port", str(port), "--json",
                                                                    str(json_path)] + (["--tiny"] if args.tiny else []))
    command = ".venv/bin/python benchmarks/hot_rows.py" + (" --tiny" if args.tiny else "") + f" --out {args.out}"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(markdown(json.loads(json_path.read_text()), command))
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
