"""Hot-row replication (FlexShard) on sequence tables with skewed ids: embshard with the hot
rows the planner chose, embshard on the same layout without them, and TorchRec's DMP on it;
then sharded dense weight updates (``optim.sharded_update``) against plain DDP.

    sudo .venv/bin/python benchmarks/hot_rows.py --out benchmarks/results/hot_rows.md    # 4-6 min (at most ~8)
    .venv/bin/python benchmarks/hot_rows.py --tiny --out /tmp/hot_rows.md      # a quick check at a tiny size

Runs twice: 2 ranks on one host, then 2 emulated hosts x 2 ranks (embshard/emulated_hosts.py,
needs root; `local_ranks.run_ranks` starts torchrun in each host's namespace, links shaped to
2 Gbit/s). ``--hosts 1`` or ``--hosts 2`` runs one of them.

Ids follow Zipf laws (exponent per workload, ranks scattered over the rows). The access
counts are taken on the same stream with embshard-stats' counters (`ExactCounter`: its
curve becomes each table's ``hot_rows``, its ``hottest`` ranking the hot-ids file; the CLI
itself measures pooled tables only), then `embshard.planner.plan(hot_ids_file=...)` chooses
the layout and each table's hot fraction. Counted bytes: every ``all_to_all_single`` and
``all_reduce`` payload sent to other ranks, per rank and step, by wrapping torch.distributed's
functions (both runtimes call them; embshard's ranks of one host their shared-memory equivalents,
wrapped too), and the part of it sent to another host; on emulated
hosts also the hosts' link counters (veth0 tx of both hosts per step: every packet, barriers
and TCP included). Steps alternate between the three runtimes and are timed between barriers
on rank 0; medians. Each timed loop stops early when its time budget is spent (the step count
is reported), so the whole run stays within about 8 minutes on 2 cores.

Sharded weight update: a DDP-wrapped MLP (its data-parallel part: millions of parameters)
with adam from `embshard.train.trainer.dense_optimizer`, unsharded and with ``shard_over``
(ZeroRedundancyOptimizer), both from the same weights on the same batches; bytes per rank of
parameters, gradients and optimizer state (beside the planner's model of them,
embshard/planner/cost/dense.py), step time, and the largest weight difference between the
two after the timed steps. Gloo ranks on CPU, one thread each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from embshard import planner
from embshard.machine import cpu_model
from embshard.planner.cost.dense import dense_bytes_per_rank, state_floats
from embshard.planner.cost.hot_rows import lookup_share
from embshard.planner.cost.traffic import rank_traffic_bytes, ring_allreduce_sent
from embshard.planner.types import Constraints, ShardingType, TableConstraint
from embshard.runtime import OptimizerConfig, ShardedEmbeddingCollection
from embshard.specs import TableSpec
from embshard.stats.counters import ExactCounter
from embshard.stats.hot_ids import write_hot_ids
from embshard.stats.measure import HOT_FRACTIONS, max_hot_rows
from embshard.topology import Topology
from local_ranks import init_rank, run_ranks
from runtime_vs_torchrec import FeaturesBatch, loss_of, timed, torchrec_model

LR = 0.01
RANKS_PER_HOST = 2
LINK_GBIT = 2.0  # EmulatedHosts' default link rate (run_ranks), each way
FULL = dict(batch_size=1024, rows=(200_000, 100_000, 300_000, 50_000), pooling=(20, 10, 25, 15), dim=64,
            warmup=2, steps=12, num_batches=4, budget_s=(30, 45))  # timed-loop budget per workload: 1 host, 2 hosts
TINY = dict(batch_size=32, rows=(2_000, 1_000), pooling=(8, 4), dim=16, warmup=1, steps=3, num_batches=2, budget_s=(20, 20))
# 8 equal 1024 x 1024 layers: ZeroRedundancyOptimizer assigns whole parameters to ranks, equal ones split evenly
DENSE_FULL = dict(widths=(1024,) * 9 + (1,), batch_size=128, warmup=1, steps=8, budget_s=(10, 15))
DENSE_TINY = dict(widths=(64,) * 5 + (1,), batch_size=16, warmup=1, steps=3, budget_s=(10, 10))
WORKLOADS = (1.05, 1.2)  # Zipf exponents
STATS_BATCHES = 8  # batches per rank counted for the statistics (the stream the runs train on, and more)
RUNS = ("embshard hot rows", "embshard", "TorchRec DMP")
DENSE_RUNS = (("DDP, adam", False), ("DDP, adam, sharded update", True))  # (name, optim.sharded_update)


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


def measured(specs: list[TableSpec], s: float, size: dict, world: int, hot_ids_path: Path) -> list[TableSpec]:
    """Specs with the hot_rows curve of every rank's stream; writes the hot-ids file."""
    counters = [ExactCounter(spec.num_embeddings) for spec in specs]
    for rank in range(world):
        for batch in zipf_batches(specs, s, size["batch_size"], STATS_BATCHES, seed=rank):
            for counter, (_, ids) in zip(counters, batch):
                counter.add(ids)
    write_hot_ids(hot_ids_path, {spec.name: c.hottest(max_hot_rows(spec.num_embeddings)) for spec, c in zip(specs, counters)})
    return [dataclasses.replace(spec, hot_rows=tuple(zip(HOT_FRACTIONS, c.curve(HOT_FRACTIONS)))) for spec, c in zip(specs, counters)]


class ByteCounter:
    """Bytes this rank sends to other ranks through all_to_all_single and all_reduce (wraps torch.distributed, and the
    shared-memory transport embshard's ranks of one host use in their place, embshard.runtime.shared_group), in total
    and to ranks on other hosts (rank r on host r // per_host). An all-reduce counts as a ring in group rank order
    (`ring_allreduce_sent`, as embshard's own counter)."""

    def __init__(self, per_host: int) -> None:
        from embshard.runtime.shared_group import SharedGroup

        self.per_host = per_host
        self.on = False
        self.inside = False  # in a SharedGroup call (counted there), which may run on gloo
        self.take()
        a2a, ar = dist.all_to_all_single, dist.all_reduce
        shared_a2a, shared_sum = SharedGroup.all_to_all, SharedGroup.sum_

        def count_a2a(input, input_split_sizes, group) -> None:
            if self.on and not self.inside and input.numel():
                ranks = self._ranks(group)
                me = ranks.index(dist.get_rank())
                row = input.element_size() * (input.numel() // input.shape[0])
                splits = list(input_split_sizes) if input_split_sizes else [input.shape[0] // len(ranks)] * len(ranks)
                self.bytes[0] += row * (sum(splits) - splits[me])
                self.bytes[2] += row * sum(n for r, n in zip(ranks, splits) if not self._same_host(r))

        def count_ar(tensor, group) -> None:
            if self.on and not self.inside:
                ranks = self._ranks(group)
                me = ranks.index(dist.get_rank())
                sent = tensor.element_size() * ring_allreduce_sent(tensor.numel(), len(ranks))[me]
                self.bytes[1] += sent
                self.bytes[3] += 0 if self._same_host(ranks[(me + 1) % len(ranks)]) else sent

        def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
            count_a2a(input, input_split_sizes, kwargs.get("group"))
            return a2a(output, input, output_split_sizes, input_split_sizes, *args, **kwargs)

        def all_reduce(tensor, *args, **kwargs):
            count_ar(tensor, kwargs.get("group"))
            return ar(tensor, *args, **kwargs)

        def shared(call, count):
            def wrapped(group, x, *args):
                count(group, x, *args)
                self.inside = True
                try:
                    return call(group, x, *args)
                finally:
                    self.inside = False
            return wrapped

        dist.all_to_all_single, dist.all_reduce = all_to_all_single, all_reduce
        SharedGroup.all_to_all = shared(shared_a2a, lambda group, x, out_splits, in_splits: count_a2a(x, in_splits, group.pg))
        SharedGroup.sum_ = shared(shared_sum, lambda group, flat: count_ar(flat, group.pg))

    @staticmethod
    def _ranks(group) -> list[int]:
        return dist.get_process_group_ranks(group or dist.group.WORLD)

    def _same_host(self, rank: int) -> bool:
        return rank // self.per_host == dist.get_rank() // self.per_host

    def take(self) -> list[int]:
        """[all-to-all, all-reduce, all-to-all to other hosts, all-reduce to other hosts] bytes since the last take."""
        out, self.bytes = getattr(self, "bytes", None), [0, 0, 0, 0]
        return out


def link_tx_bytes() -> int:
    """Bytes this emulated host sent on its link so far (0 outside an emulated host)."""
    from embshard.emulated_hosts import IFNAME

    path = Path("/sys/class/net") / IFNAME / "statistics" / "tx_bytes"
    return int(path.read_text()) if path.exists() else 0


def kjts(batches) -> list:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    return [KeyedJaggedTensor(keys=[f"sf{i}" for i in range(len(b))], values=torch.from_numpy(np.concatenate([ids for _, ids in b])),
                              lengths=torch.from_numpy(np.concatenate([lengths for lengths, _ in b]))) for b in batches]


def out_of_time(start: float, budget_s: float, pg) -> bool:
    """Rank 0's clock decides for every rank (one broadcast)."""
    flag = torch.tensor([int(time.perf_counter() - start > budget_s)])
    dist.broadcast(flag, src=0, group=pg)
    return bool(flag.item())


def timed_loop(steps: dict, size: dict, budget_s: float, pg, counter: ByteCounter | None, link: bool) -> dict:
    """Warm up, then up to size["steps"] rounds of every step (order rotating), within budget_s:
    per step: seconds, counted bytes (busiest rank) and link bytes (both hosts)."""
    for i in range(size["warmup"]):
        for step in steps.values():
            step(i)
    names = list(steps)
    seconds = {n: [] for n in names}
    counted = {n: [] for n in names}
    links = {n: [] for n in names}
    start = time.perf_counter()
    for i in range(size["steps"]):
        for name in names[i % len(names):] + names[:i % len(names)]:
            before = link_tx_bytes() if link else 0
            if counter is not None:
                counter.on = True
            seconds[name].append(timed(lambda: steps[name](i), pg))
            if counter is not None:
                counter.on = False
                counted[name].append(counter.take())
            links[name].append(link_tx_bytes() - before if link else 0)
        if i + 1 >= len(names) and i + 1 < size["steps"] and out_of_time(start, budget_s, pg):
            break
    mine = {n: {"counted": [statistics.mean(b[k] for b in counted[n]) for k in range(4)] if counted[n] else None,
                "link": statistics.mean(links[n])} for n in names}
    gathered = [None] * dist.get_world_size(pg)
    dist.all_gather_object(gathered, mine, group=pg)
    out = {}
    for n in names:
        out[n] = {"step_s": statistics.median(seconds[n]), "steps": len(seconds[n]),
                  "link_bytes": sum(g[n]["link"] for g in gathered)}  # only each host's first rank reads its link
        if counter is not None:
            out[n]["bytes"] = [max(g[n]["counted"][k] for g in gathered) for k in range(2)]  # the busiest rank
            out[n]["inter_host_bytes"] = sum(g[n]["counted"][2] + g[n]["counted"][3] for g in gathered)  # all ranks
    return out


def run_workload(s: float, size: dict, pg, per_host: int, counter: ByteCounter, work_dir: Path, budget_s: float) -> dict:
    rank, W = dist.get_rank(pg), dist.get_world_size(pg)
    hosts = W // per_host
    specs = specs_of(size)
    hot_ids = work_dir / f"hot_ids_{s}_{hosts}.npz"
    t0 = time.perf_counter()
    if rank == 0:
        specs = measured(specs, s, size, W, hot_ids)
        topo = Topology(world_size=W, local_world_size=per_host, device="cpu", batch_size_per_rank=size["batch_size"],
                        inter_host_gb_per_s=2 * LINK_GBIT / 8 if hosts > 1 else 0.0)  # half-duplex: sent + received
        # layouts both runtimes run (TorchRec's EmbeddingCollection has no data-parallel on CPU)
        allowed = TableConstraint((ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE))
        constraints = Constraints(tables={t.name: allowed for t in specs})
        plan = planner.plan(specs, topo, constraints, time_budget_s=5, hot_ids_file=str(hot_ids))
        # TorchRec's DMP on a layout of its own where embshard's cannot be exported (row_wise over some ranks)
        exportable = all(t.sharding_type is not ShardingType.ROW_WISE or len(t.shards) == W for t in plan.tables)
        theirs_plan = None if exportable else planner.plan(specs, topo, constraints, time_budget_s=5, torchrec_compatible=True)
        text = [plan.to_json(), theirs_plan and theirs_plan.to_json()]
    else:
        text = [None, None]
    dist.broadcast_object_list(text, src=0, group=pg)
    plan = planner.ShardingPlan.from_json(text[0])
    cold_plan = dataclasses.replace(plan, tables=tuple(dataclasses.replace(t, hot_rows=0) for t in plan.tables), hot_ids_file="")
    specs = list(plan.specs)
    batches = kjts(zipf_batches(specs, s, size["batch_size"], size["num_batches"], seed=rank))
    config = OptimizerConfig(learning_rate=LR)
    hot = ShardedEmbeddingCollection(specs, plan, pg, optimizer=config)
    cold = ShardedEmbeddingCollection(specs, cold_plan, pg, optimizer=config)
    theirs_plan = cold_plan if text[1] is None else planner.ShardingPlan.from_json(text[1])
    theirs, _ = torchrec_model(specs, theirs_plan, pg)  # sequence tables only: no dense optimizer
    setup_s = time.perf_counter() - t0

    steps = {RUNS[0]: lambda i: loss_of(hot(batches[i % len(batches)]), False).backward(),
             RUNS[1]: lambda i: loss_of(cold(batches[i % len(batches)]), False).backward(),
             RUNS[2]: lambda i: theirs(FeaturesBatch(batches[i % len(batches)]))[0].backward()}
    runs = timed_loop(steps, size, budget_s, pg, counter, link=hosts > 1 and rank % per_host == 0)
    predicted = {name: sum(t.inter_host_sent for t in rank_traffic_bytes(specs, plan.topology, p.tables))
                 for name, p in ((RUNS[0], plan), (RUNS[1], cold_plan))}
    return {"zipf": s, "tables": [(t.name, t.num_embeddings, t.embedding_dim, t.pooling_factor) for t in specs],
            "layout": {t.name: f"{t.sharding_type.value}/{len(t.shards)}" for t in plan.tables},
            "torchrec_layout": None if text[1] is None else {t.name: f"{t.sharding_type.value}/{len(t.shards)}" for t in theirs_plan.tables},
            "hot_rows": {t.name: t.hot_rows for t in plan.tables},
            "hot_share": {t.name: lookup_share(plan.spec(t.name), t.hot_rows) for t in plan.tables},
            "runs": runs, "predicted_inter_host_bytes": predicted, "setup_s": setup_s,
            "predicted_ms": plan.max_rank_ms, "predicted_cold_ms": planner.evaluate(specs, plan.topology, cold_plan.tables).max_rank_ms}


# ---- sharded weight updates ------------------------------------------------------------------
def mlp(widths: tuple[int, ...]) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def run_dense(size: dict, pg, budget_s: float) -> dict:
    """DDP + adam, unsharded and sharded (ZeroRedundancyOptimizer), from the same weights on the same batches."""
    from torch.nn.parallel import DistributedDataParallel

    from embshard.train.checkpoint import local_optimizer
    from embshard.train.optim import DenseOptimConfig
    from embshard.train.trainer import dense_optimizer

    rank = dist.get_rank(pg)
    gen = torch.Generator().manual_seed(rank)
    data = [(torch.randn(size["batch_size"], size["widths"][0], generator=gen), torch.randn(size["batch_size"], 1, generator=gen))
            for _ in range(2)]
    config = DenseOptimConfig(name="adam", learning_rate=1e-3)
    models, optimizers = {}, {}
    for name, sharded in DENSE_RUNS:
        torch.manual_seed(0)
        models[name] = DistributedDataParallel(mlp(size["widths"]), process_group=pg)
        optimizers[name] = dense_optimizer(config, models[name].parameters(), pg if sharded else None)

    def step_of(name: str):
        model, optimizer = models[name], optimizers[name]

        def step(i: int) -> None:
            x, y = data[i % len(data)]
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)  # gradients stay allocated: they count in the memory below
        return step

    runs = timed_loop({name: step_of(name) for name in models}, size, budget_s, pg, None, link=False)
    for name, sharded in DENSE_RUNS:
        model = models[name]
        state = local_optimizer(optimizers[name]).state.values()
        mine = {"params": tensor_bytes(model.parameters()), "grads": tensor_bytes(p.grad for p in model.parameters()),
                "optimizer_state": tensor_bytes(v for st in state for v in st.values())}
        gathered = [None] * dist.get_world_size(pg)
        dist.all_gather_object(gathered, mine, group=pg)
        runs[name]["bytes_per_rank"] = {k: max(g[k] for g in gathered) for k in mine}  # the fullest rank
        runs[name]["predicted_bytes"] = dense_bytes_per_rank([p.numel() for p in model.parameters()], state_floats("adam"),
                                                             dist.get_world_size(pg), sharded)
    plain, sharded = ([p.detach() for p in m.parameters()] for m in models.values())
    diff = max(float((a - b).abs().max()) for a, b in zip(plain, sharded))
    return {"widths": size["widths"], "num_params": sum(p.numel() for p in plain), "batch_size": size["batch_size"],
            "runs": runs, "max_weight_diff": diff}


def worker(args: argparse.Namespace) -> None:
    size, dense = (TINY, DENSE_TINY) if args.tiny else (FULL, DENSE_FULL)
    torch.set_num_threads(1)
    rank, world, per_host = init_rank()
    hosts = world // per_host
    pg = dist.group.WORLD
    counter = ByteCounter(per_host)
    work_dir = Path(args.json).parent
    t0 = time.perf_counter()
    results = [run_workload(s, size, pg, per_host, counter, work_dir, size["budget_s"][hosts - 1]) for s in WORKLOADS]
    dense_result = run_dense(dense, pg, dense["budget_s"][hosts - 1])
    if rank == 0:
        Path(args.json).write_text(json.dumps({"size": size, "hosts": hosts, "ranks_per_host": per_host, "results": results,
                                               "dense": dense_result, "seconds": time.perf_counter() - t0}))
    dist.barrier(group=pg)  # no rank leaves while rank 0 (the store's host) still writes
    dist.destroy_process_group()


# ---- report ----------------------------------------------------------------------------------
def markdown_hosts(data: dict) -> list[str]:
    size, results, H, L = data["size"], data["results"], data["hosts"], data["ranks_per_host"]
    samples = H * L * size["batch_size"]
    where = "one host" if H == 1 else f"{H} emulated hosts x {L} ranks (links: {data['shaping']})"
    lines = [f"## {H * L} ranks on {where}", "",
             f"Batch {size['batch_size']:,} per rank, rowwise_adagrad; the ranks' part of the run took {data['seconds']:.0f} s "
             f"(spawning not included). Bytes per step: all-to-all and all-reduce payload the busiest rank sends to other "
             f"ranks; inter-host: what all ranks send to another host (counted the same way; predicted: the plan's "
             f"`traffic_bytes`, inter-host sent, summed over ranks)" +
             ("; link: both hosts' veth0 tx bytes (every packet, barriers and TCP headers included)" if H > 1 else "") +
             ". Step: forward + backward + fused update, median, the three runs alternating.", ""]
    for r in results:
        runs = r["runs"]
        lines += [f"### Zipf exponent {r['zipf']}", "",
                  "Tables: " + ", ".join(f"{n} {rows:,}x{d} pf {pf:g}" for n, rows, d, pf in r["tables"]) + ".", "",
                  "Planner: " + ", ".join(f"{n} {r['layout'][n]}, hot {r['hot_rows'][n]:,} rows "
                                          f"({r['hot_rows'][n] / rows:.1%} of rows, {r['hot_share'][n]:.0%} of lookups)"
                                          for n, rows, _, _ in r["tables"]) +
                  f"; predicted {r['predicted_ms']:.2f} ms per step with hot rows, {r['predicted_cold_ms']:.2f} ms without. "
                  f"Set-up (statistics, planning, three models) {r['setup_s']:.0f} s." +
                  ("" if r["torchrec_layout"] is None else " TorchRec cannot run that layout (row_wise over some ranks): its DMP "
                   "runs the planner's torchrec_compatible plan, " + ", ".join(f"{n} {v}" for n, v in r["torchrec_layout"].items()) + "."), "",
                  "| run | all-to-all MB/step | all-reduce MB/step | inter-host MB/step counted | predicted | link MB/step "
                  "| step ms | samples/s | steps |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, x in runs.items():
            predicted = r["predicted_inter_host_bytes"].get(name)
            link = f"{x['link_bytes'] / 1e6:.2f}" if H > 1 else "-"
            lines.append(f"| {name} | {x['bytes'][0] / 1e6:.3f} | {x['bytes'][1] / 1e6:.3f} | {x['inter_host_bytes'] / 1e6:.3f} | "
                         f"{'-' if predicted is None else f'{predicted / 1e6:.3f}'} | {link} | {1e3 * x['step_s']:.1f} | "
                         f"{samples / x['step_s']:,.0f} | {x['steps']} |")
        hot, cold, theirs = (runs[n] for n in RUNS)
        key = "inter_host_bytes" if H > 1 else "bytes"
        lines.append("")
        base, mine = (cold[key], hot[key]) if H > 1 else (cold["bytes"][0], hot["bytes"][0])
        what = "inter-host bytes (all collectives)" if H > 1 else "all-to-all bytes"
        lines.append(f"With hot rows: {what} {mine / base - 1:+.0%} against the same layout without (target: -50% or less), "
                     f"step {hot['step_s'] / cold['step_s'] - 1:+.0%} (target: faster); against TorchRec's DMP: step "
                     f"{hot['step_s'] / theirs['step_s'] - 1:+.0%}.")
        lines.append("")
    d = data["dense"]
    lines += [f"### Sharded weight update ({H * L} ranks)", "",
              f"MLP {' x '.join(map(str, d['widths']))} ({d['num_params'] / 1e6:.1f} M parameters, all data-parallel), adam, "
              f"batch {d['batch_size']} per rank; MB per rank (the fullest rank). Largest weight difference between the two "
              f"after the same steps: {d['max_weight_diff']:.1e}.", "",
              "| run | parameters MB | gradients MB | optimizer state MB | total MB | planner's model MB | step ms | steps |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, x in d["runs"].items():
        b = x["bytes_per_rank"]
        lines.append(f"| {name} | {b['params'] / 1e6:.1f} | {b['grads'] / 1e6:.1f} | {b['optimizer_state'] / 1e6:.1f} | "
                     f"{sum(b.values()) / 1e6:.1f} | {x['predicted_bytes'] / 1e6:.1f} | {1e3 * x['step_s']:.1f} | {x['steps']} |")
    plain, sharded = d["runs"].values()
    lines += ["", f"Sharded update: optimizer state {sharded['bytes_per_rank']['optimizer_state'] / plain['bytes_per_rank']['optimizer_state'] - 1:+.0%} "
                  f"per rank, step {sharded['step_s'] / plain['step_s'] - 1:+.0%}.", ""]
    return lines


def markdown(parts: list[dict], skipped: str, command: str, seconds: float) -> str:
    lines = ["# Hot-row replication on skewed sequence tables; sharded weight updates", "",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, gloo on CPU, 1 thread per rank. "
             f"Command: `{command}` ({seconds:.0f} s in all). Embedding runs: embshard with the planner's hot rows, embshard on "
             "the same layout without them, TorchRec's DMP on that layout (or, where TorchRec cannot run it, on the planner's "
             "torchrec_compatible plan of the same tables).", ""]
    for data in parts:
        lines += markdown_hosts(data)
    if skipped:
        lines += [f"Not run: {skipped}", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/hot_rows.md")
    parser.add_argument("--tiny", action="store_true", help="tiny tables and batches: checks that it runs")
    parser.add_argument("--hosts", default="1,2", help="1, 2 (emulated hosts x 2 ranks, needs root) or 1,2 (default)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    hosts = sorted({int(h) for h in args.hosts.split(",") if h.strip()} if args.hosts.replace(",", "").isdigit() else {0})
    if not hosts or not set(hosts) <= {1, 2}:
        parser.exit(2, f"{parser.prog}: error: --hosts {args.hosts!r}: give 1, 2 or 1,2\n")
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="embshard-hot-"))
    parts, skipped = [], ""
    for H in hosts:
        json_path = work / f"hot_rows_{H}.json"
        rank_args = ["--worker", "--json", str(json_path)] + (["--tiny"] if args.tiny else [])
        try:
            shaping = run_ranks(__file__, rank_args, hosts=H, ranks_per_host=RANKS_PER_HOST, timeout_s=420)
        except Exception as e:  # no root or no namespaces: report the one-host part alone
            from embshard.emulated_hosts import EmulationUnavailable
            if H == 1 or not isinstance(e, EmulationUnavailable):
                raise
            skipped = f"{H} emulated hosts ({e})."
            continue
        parts.append({**json.loads(json_path.read_text()), "shaping": shaping})
    command = ".venv/bin/python benchmarks/hot_rows.py" + (" --tiny" if args.tiny else "") + \
        ("" if args.hosts == "1,2" else f" --hosts {args.hosts}") + f" --out {args.out}"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(markdown(parts, skipped, command, time.perf_counter() - t0))
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
