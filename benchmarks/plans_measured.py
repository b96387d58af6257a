"""Are embshard's plans faster when run? embshard vs TorchRec's planner vs a greedy baseline, measured.

    .venv/bin/python benchmarks/plans_measured.py --profile cpu_gloo_measured
    sudo .venv/bin/python benchmarks/plans_measured.py --hosts 2 --ranks-per-host 2 --link-gbit 2   # benchmarks/plans_multihost.py
    sudo .venv/bin/python benchmarks/plans_measured.py --hosts 2 --ranks-per-host 2 --link-gbit 2 --quick  # its tiny check

Three pooled workloads for 4 CPU ranks (batch 512 per rank), each a case where placement
decides the step time (see `workloads`): "one_hot_table" (one table read by 80 ids per sample
carries most of the work), "skewed_pooling" (wide tables read 10 times, narrow deep ones read
30 times, two big ones read once: bytes and work disagree) and "criteo_tight" (Criteo
Kaggle's 26 one-hot features, rows capped at 1M, in 1 GiB per rank). Plans, all for the
same topology (the calibrated profile at 4 ranks and the workload's memory):
- embshard: `embshard.planner.plan`;
- TorchRec: its EmbeddingShardingPlanner (CPU compute device, so table_wise, column_wise,
  table_column_wise or data_parallel, given the profile's bandwidths through
  `to_torchrec_topology`, run in a subprocess as benchmarks/planner_vs_torchrec.py does),
  imported with `from_torchrec_plan` and run on embshard's runtime, so only placement differs;
  and the same plan through TorchRec's own DistributedModelParallel (DMP);
- greedy: tables by size (weights + optimizer state), largest first, table_wise on the rank
  holding the fewest bytes so far.
Every plan runs on 4 local gloo ranks; a rank's step (forward + backward + fused update) is
measured as its process's CPU time (median of --steps steps), and the step time of a plan is
its slowest rank's: what the step takes on one core per rank (4 ranks share 2 cores here,
so wall-clock per step is also reported but measures the machine, not the plan). Rounds
alternate the order of all nine plans (--rounds); the median round counts, and a sign test
over the paired rounds (benchmarks/paired.py) says whether two plans separate beyond noise. Results: a section of
benchmarks/results/cost_model.md and --json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cost_model_accuracy import TITLE, today  # noqa: E402
from sections import update_section, write_keeping_section  # noqa: E402
from local_ranks import run_script_ranks  # noqa: E402
from paired import paired_rounds  # noqa: E402
import profiles  # noqa: E402

from embshard.calibrate.measure import measure_rounds  # noqa: E402
from embshard.machine import cpu_model  # noqa: E402
from embshard.planner import ShardingPlan, evaluate, manual_plan, plan  # noqa: E402
from embshard.specs import TableSpec, load_tables_file  # noqa: E402
from embshard.topology import Topology  # noqa: E402

NOTES_SECTION = "notes"  # multihost.md's hand-written part, which a --hosts run keeps
W, BATCH, LR = 4, 512, 0.01
PLANNERS = ("embshard", "torchrec", "greedy")


def workloads() -> dict[str, tuple[tuple[TableSpec, ...], float]]:
    """name -> (tables, memory per rank in GiB). Each is a case where placement decides the step time."""
    # one table read by 80 ids per sample carries most of the work; twelve light ones around it
    one_hot = [TableSpec("hot", 400_000, 64, 80.0)] + [TableSpec(f"t{i}", 10_000 * (i + 1), 32, 1.0 + i % 4) for i in range(12)]
    # wide tables (dim 128, 5k rows) read 10 times per sample, narrow deep ones (dim 16, 300k rows)
    # read 30 times, two big ones read once: a deep table's distinct rows (optimizer updates)
    # cost far more than its bytes say, a wide table's less
    skewed = ([TableSpec(f"wide{i}", 5_000, 128, 10.0) for i in range(6)] + [TableSpec(f"deep{i}", 300_000, 16, 30.0) for i in range(5)]
              + [TableSpec(f"big{i}", 1_000_000, 64, 1.0) for i in range(2)])
    # Criteo Kaggle's 26 one-hot features, rows capped at 1M, dim 64, in 1 GiB per rank: the five
    # tables of 1M rows (260 MB each with optimizer state) must be spread with care
    criteo, _ = load_tables_file(REPO / "embshard" / "configs" / "tables" / "criteo_kaggle.yaml")
    criteo_tight = tuple(TableSpec(s.name, min(s.num_embeddings, 1_000_000), 64, 1.0, feature_names=s.feature_names) for s in criteo)
    return {"one_hot_table": (tuple(one_hot), 4.0), "skewed_pooling": (tuple(skewed), 4.0), "criteo_tight": (criteo_tight, 1.0)}


def profile_topology(name: str, hbm_gib: float) -> Topology:
    return profiles.profile_topology(name, world_size=W, local_world_size=W, batch_size_per_rank=BATCH, hbm_gib=hbm_gib)


def greedy_plan(specs, topo: Topology) -> ShardingPlan:
    size = {s.name: s.num_embeddings * (s.embedding_dim * s.element_bytes + s.optimizer_state_bytes_per_row(s.embedding_dim)) for s in specs}
    held = [0] * topo.world_size
    layout = {}
    for s in sorted(specs, key=lambda s: -size[s.name]):
        r = min(range(topo.world_size), key=lambda r: (held[r], r))
        held[r] += size[s.name]
        layout[s.name] = ("table_wise", [r])
    return manual_plan(specs, topo, layout)


def torchrec_plan(specs, topo: Topology, search_s: int) -> ShardingPlan:
    from planner_vs_torchrec import run_torchrec

    out = run_torchrec(tuple(specs), topo, limit_s=600, search_s=search_s)
    if out["status"] != "ok":
        raise RuntimeError(f"TorchRec planner: {out['status']}: {out.get('detail', '')}")
    return evaluate(specs, topo, ShardingPlan.from_dict(out["plan"]).tables)


# ---- TorchRec DMP on local ranks ---------------------------------------------------------------
def dmp_rank(rank: int, port: int, job_path: str, out_path: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=W,
                            timeout=datetime.timedelta(seconds=600))
    Path(out_path).write_text(json.dumps(dmp_plans(json.loads(Path(job_path).read_text()), rank, time.process_time)))
    dist.destroy_process_group()


def dmp_plans(job: dict, rank: int, clock) -> list[float]:
    """Each plan of the job through TorchRec's DMP on this rank (its process group made): median ms per
    step by ``clock`` (time.process_time: CPU; time.perf_counter: wall)."""
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torch import nn
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from embshard.calibrate.synthetic import synthetic_batch
    from embshard.interop.torchrec import to_torchrec_plan

    torch.set_num_threads(1)
    results = []
    for raw in job["plans"]:
        p = ShardingPlan.from_dict(raw)

        class Wrapper(nn.Module):
            def __init__(self, emb):
                super().__init__()
                self.emb = emb

            def forward(self, kjt):
                return self.emb(kjt)

        ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=s.name, num_embeddings=s.num_embeddings, embedding_dim=s.embedding_dim,
                                                                feature_names=list(s.feature_names)) for s in p.specs], device=torch.device("meta"))
        fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR, "eps": 1e-8}
        dmp = DistributedModelParallel(Wrapper(ebc), env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
                                       plan=to_torchrec_plan(p, "emb"), sharders=[EmbeddingBagCollectionSharder(fused_params=fused)])
        fused_names = set(dmp.fused_optimizer.params)
        dense = [q for n, q in dmp.named_parameters() if q.requires_grad and q.dim() == 2 and n not in fused_names]
        dense_opt = RowWiseAdagrad(dense, lr=LR) if dense else None
        gen = torch.Generator().manual_seed(rank)
        batches = [synthetic_batch(p.specs, BATCH, gen) for _ in range(3)]
        times = []
        for i in range(job["warmup"] + job["steps"]):
            c0 = clock()
            out = dmp(batches[i % 3])
            out.values().backward(torch.ones_like(out.values()))
            if dense_opt is not None:
                dense_opt.step()
                dense_opt.zero_grad()
            if i >= job["warmup"]:
                times.append((clock() - c0) * 1e3)
        results.append(statistics.median(times))
        del dmp
        dist.barrier()
    return results


def measure_dmp(plans: list[ShardingPlan], steps: int, warmup: int) -> list[list[float]]:
    """Per plan, per rank median CPU ms per step through TorchRec's DMP."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"plans": [p.to_dict() for p in plans], "steps": steps, "warmup": warmup}))
        run_script_ranks(__file__, W, lambda r, port: ["--dmp-rank", str(r), str(port), str(job), str(Path(tmp) / f"r{r}.json")],
                         timeout_s=3600)
        per_rank = [json.loads((Path(tmp) / f"r{r}.json").read_text()) for r in range(W)]
    return [[per_rank[r][i] for r in range(W)] for i in range(len(plans))]


# ---- driver --------------------------------------------------------------------------------------
def layout_mix(p: ShardingPlan) -> str:
    short = {"data_parallel": "DP", "table_wise": "TW", "row_wise": "RW", "column_wise": "CW", "table_row_wise": "TWRW", "table_column_wise": "TWCW"}
    counts: dict[str, int] = {}
    for t in p.tables:
        counts[short[t.sharding_type.value]] = counts.get(short[t.sharding_type.value], 0) + 1
    return " ".join(f"{k}{v}" for k, v in sorted(counts.items()))


def run(args: argparse.Namespace) -> dict:
    t0, load_start = time.time(), os.getloadavg()
    cases = {}
    for name, (specs, hbm_gib) in workloads().items():
        topo = profile_topology(args.profile, hbm_gib)
        print(f"planning {name}", flush=True)
        cases[name] = {"embshard": plan(specs, topo, time_budget_s=args.embshard_budget_s),
                       "torchrec": torchrec_plan(specs, topo, args.torchrec_search_s),
                       "greedy": greedy_plan(specs, topo)}
    flat = [(name, k) for name in cases for k in PLANNERS]
    measured = measure_rounds([cases[n][k] for n, k in flat], args.rounds, steps=args.steps, warmup=args.warmup,
                              log=lambda m: print(m, flush=True))
    dmp: dict[str, list[list[float]]] = {name: [] for name in cases}
    if not args.skip_dmp:
        for rnd in range(args.rounds):
            print(f"TorchRec DMP on the TorchRec plans, round {rnd + 1}/{args.rounds}", flush=True)
            for name, per_rank in zip(cases, measure_dmp([cases[n]["torchrec"] for n in cases], args.steps, args.warmup)):
                dmp[name].append(per_rank)
    out = {"cases": {name: {} for name in cases}, "profile": args.profile, "steps": args.steps, "rounds": args.rounds,
           "load_start": load_start, "load_end": os.getloadavg(), "seconds": time.time() - t0, "date": today(),
           "cpu": cpu_model(), "cores": os.cpu_count()}
    for (name, k), rounds in zip(flat, measured):
        p = cases[name][k]
        maxes = [m.max_rank_cpu_ms for m in rounds]
        out["cases"][name][k] = {"measured_max_rank_ms": statistics.median(maxes), "rounds_max_rank_ms": maxes,
                                 "per_rank_ms": [[r.cpu_ms["total_ms"] for r in m.ranks] for m in rounds],
                                 "step_wall_ms": statistics.median(m.step_wall_ms for m in rounds),
                                 "predicted_max_rank_ms": p.max_rank_ms, "layout": layout_mix(p),
                                 "hbm_gib": p.topology.hbm_gib, "plan": p.to_dict()}
    for name, rounds in dmp.items():
        if rounds:
            maxes = [max(r) for r in rounds]
            out["cases"][name]["torchrec_dmp"] = {"measured_max_rank_ms": statistics.median(maxes), "rounds_max_rank_ms": maxes,
                                                  "per_rank_ms": rounds}
    return out


def verdict(e: dict) -> str:
    """embshard vs the best other plan on embshard's runtime: by median, and by a sign test over the paired rounds
    (benchmarks/paired.py) against each other plan."""
    base = e["embshard"]
    k = min((k for k in PLANNERS if k != "embshard"), key=lambda k: e[k]["measured_max_rank_ms"])
    margin = e[k]["measured_max_rank_ms"] / base["measured_max_rank_ms"] - 1
    if margin <= 0:
        return f"embshard NOT fastest: {k} is {-margin:.1%} faster by median"
    tests = [(o, *paired_rounds(base["rounds_max_rank_ms"], e[o]["rounds_max_rank_ms"])) for o in PLANNERS if o != "embshard"]
    measurable = all(p < 0.05 for *_, p in tests)
    pairs = ", ".join(f"{o} in {wins} of {n} rounds (sign test p = {p:.3f})" for o, wins, n, p in tests)
    out = (f"embshard fastest, {margin:.1%} ahead of the next best ({k}) by median; faster than {pairs}: "
           f"{'measurably fastest' if measurable else 'NOT measurably fastest (p >= 0.05)'}")
    if "torchrec_dmp" in e:  # another runtime too: TorchRec's plan where TorchRec runs it (its rounds run after the others: not paired)
        d = e["torchrec_dmp"]
        dmp_margin = d["measured_max_rank_ms"] / base["measured_max_rank_ms"] - 1
        apart = max(base["rounds_max_rank_ms"]) < min(d["rounds_max_rank_ms"])
        out += (f". TorchRec's plan on TorchRec's DMP: {dmp_margin:+.1%} vs embshard's plan on embshard's runtime"
                f" ({'rounds apart' if apart else 'rounds overlap: not measurably slower'})")
    return out


def markdown(result: dict, command: str) -> str:
    lines = [
        "## Plans measured: embshard vs TorchRec's planner vs greedy, 4 CPU ranks", "",
        f"Command: `{command}`. {result['cpu']}, {result['cores']} cores, no GPU; {result['date']}; load average "
        f"{result['load_start'][0]:.1f} at start, {result['load_end'][0]:.1f} at end (other engineers' jobs share the machine); "
        f"{result['seconds']:.0f} s. Step time of a plan = its slowest rank's CPU time per step (forward + backward + fused "
        f"update, median of {result['steps']} steps), median of {result['rounds']} rounds that alternate the order of all "
        "nine plans, i.e. the step on one core per rank; wall clock with 4 ranks on 2 cores is shown for reference. "
        "All three plans run on embshard's runtime (only placement differs); TorchRec's plan also through TorchRec's DMP "
        "(its rounds run after the others).",
        "",
        "| workload | GiB/rank | plan | layouts | predicted ms | measured ms (slowest rank, CPU) | vs embshard | rounds (min-max) | wall ms/step |",
        "|---|---:|---|---|---:|---:|---:|---|---:|",
    ]
    verdicts = []
    for name, e in result["cases"].items():
        base = e["embshard"]["measured_max_rank_ms"]
        for k in PLANNERS:
            x = e[k]
            r = x["rounds_max_rank_ms"]
            lines.append(f"| {name} | {x['hbm_gib']:g} | {k} | {x['layout']} | {x['predicted_max_rank_ms']:.1f} | {x['measured_max_rank_ms']:.1f} | "
                         f"{x['measured_max_rank_ms'] / base:.2f}x | {min(r):.0f}-{max(r):.0f} | {x['step_wall_ms']:.0f} |")
        if "torchrec_dmp" in e:
            d = e["torchrec_dmp"]
            lines.append(f"| {name} | | TorchRec plan on TorchRec DMP | {e['torchrec']['layout']} | | {d['measured_max_rank_ms']:.1f} | "
                         f"{d['measured_max_rank_ms'] / base:.2f}x | {min(d['rounds_max_rank_ms']):.0f}-{max(d['rounds_max_rank_ms']):.0f} | |")
        verdicts.append(f"- {name}: {verdict(e)}")
    lines += ["", *verdicts, ""]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--dmp-rank":
        dmp_rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu_gloo_measured")
    parser.add_argument("--steps", type=int, help="default 10 (one host), 6 (--hosts)")
    parser.add_argument("--warmup", type=int, help="default 2 (one host), 1 (--hosts)")
    parser.add_argument("--rounds", type=int, help="default 5 (one host and --hosts: the fewest rounds in which a sign test can tell two plans apart)")
    parser.add_argument("--embshard-budget-s", type=float, default=10.0)
    parser.add_argument("--torchrec-search-s", type=int, help="default 60 (one host), 20 (--hosts)")
    parser.add_argument("--skip-dmp", action="store_true")
    parser.add_argument("--json", default="benchmarks/results/plans_measured.json",
                        help="default: that (one host), benchmarks/results/multihost.json (--hosts)")
    parser.add_argument("--markdown", default="benchmarks/results/cost_model.md",
                        help="default: that, its plans section (one host); benchmarks/results/multihost.md (--hosts: the file "
                             f"anew, but for its hand-written section between <!-- {NOTES_SECTION}:start/end --> marks)")
    parser.add_argument("--from-json")
    hosts = parser.add_argument_group("multi-host mode (benchmarks/plans_multihost.py; needs root: emulated hosts)")
    hosts.add_argument("--hosts", type=int, default=0, help="emulated hosts (0: the one-host benchmark above)")
    hosts.add_argument("--ranks-per-host", type=int, default=2)
    hosts.add_argument("--link-gbit", type=float, default=2.0, help="each host link's rate, each way")
    hosts.add_argument("--delay-ms", type=float, default=0.1, help="each host link's delay (needs netem)")
    hosts.add_argument("--inter-host-gb-per-s", type=float, help="the plans' inter-host bandwidth (default 2 x link rate / ranks per host)")
    hosts.add_argument("--cores-per-rank", type=float, help="cores each rank has, dividing the profile's per-phase factors "
                       "(default: cores / ranks, at most 1: the emulated hosts share this machine's cores)")
    hosts.add_argument("--cpu-cap", action="store_true", help="cap each rank at --cores-per-rank of a core by a cgroup CPU "
                       "quota (embshard/emulated_cpu.py: a waiting rank cannot lend its core to another, as a rank of a real "
                       "cluster has a device of its own; the throttling stalls its peers at every collective); default: "
                       "the ranks share the machine's cores")
    hosts.add_argument("--workloads", nargs="*", help="only these workloads (default all three)")
    hosts.add_argument("--round-timeout-s", type=float, default=3600.0)
    hosts.add_argument("--quick", action="store_true", help="tiny tables, 2 steps, 1 round: a check that it runs (seconds)")
    args = parser.parse_args()
    args.rounds = args.rounds or 5
    args.steps = args.steps or (6 if args.hosts else 10)
    args.warmup = args.warmup if args.warmup is not None else 1 if args.hosts else 2
    args.torchrec_search_s = args.torchrec_search_s or (20 if args.hosts else 60)
    if args.cores_per_rank is not None and not 0 < args.cores_per_rank <= 1:
        parser.error(f"--cores-per-rank: must be in (0, 1] (a rank's share of a core), got {args.cores_per_rank:g}")
    if args.hosts:
        from plans_multihost import markdown as multihost_markdown, run_multihost

        # --quick checks that it runs: its numbers go to stdout (and --json if given), not to the results
        default_json = args.json == parser.get_default("json")
        json_path = None if args.quick and default_json else REPO / "benchmarks" / "results" / "multihost.json" if default_json \
            else Path(args.json)
        result = json.loads(Path(args.from_json).read_text()) if args.from_json else run_multihost(args)
        if json_path:
            json_path.write_text(json.dumps(result, indent=1))
        text = multihost_markdown(result, "sudo .venv/bin/python benchmarks/plans_measured.py " + " ".join(sys.argv[1:]))
        default_md = args.markdown == parser.get_default("markdown")
        if not (result["quick"] and default_md):
            md_path = REPO / "benchmarks" / "results" / "multihost.md" if default_md else Path(args.markdown)
            write_keeping_section(md_path, f"# Multi-host benchmarks\n\n{text}", NOTES_SECTION)
        print(text)
        return
    if not (REPO / "embshard" / "configs" / "topology" / f"{args.profile}.yaml").exists():
        sys.exit(f"plans_measured: error: no profile configs/topology/{args.profile}.yaml; run embshard-calibrate profile={args.profile}")
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
    else:
        result = run(args)
        Path(args.json).write_text(json.dumps(result, indent=1))

    text = markdown(result, f".venv/bin/python benchmarks/plans_measured.py --profile {args.profile}")
    update_section(Path(args.markdown), "plans", text, TITLE)
    print(text)


if __name__ == "__main__":
    main()
