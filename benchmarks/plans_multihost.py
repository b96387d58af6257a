"""plans_measured.py's multi-host mode: the same plans on H emulated hosts x L ranks joined by a slow link.

    sudo .venv/bin/python benchmarks/plans_measured.py --hosts 2 --ranks-per-host 2 --link-gbit 2

For each workload of plans_measured.workloads, embshard's plan, TorchRec's planner's plan (on
embshard's runtime) and greedy are made for the topology H x L (the profile's terms; inter-host
bandwidth from --inter-host-gb-per-s, default 2 x the link rate each way: the half-duplex CPU
model sums a rank's sent and received bytes, which is what embshard-calibrate fits through such a
link, see tests/calibrate/test_calibrate_hosts.py). One torchrun job per round on
embshard.emulated_hosts runs every plan (this file with --rank-job); a rank's step is its wall time
(the link's waits cost no CPU), a plan's step its slowest rank's. Inter-host bytes per step are
read from each host's link counters (veth0 tx/rx, every packet: warmup and barriers included),
and counted by the runtime (`embshard.runtime.comm.counting_traffic`: the embedding collectives'
inter-host bytes, sent + received, summed over ranks, the collections' set-up included) beside the plan's predicted
``traffic_bytes``. TorchRec's DMP is not run across hosts here. Results:
benchmarks/results/multihost.md with the link settings, and --json.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _link_bytes() -> int:
    """Bytes this host's link sent + received so far (inside an emulated host's namespace)."""
    from embshard.emulated_hosts import IFNAME

    stats = Path("/sys/class/net") / IFNAME / "statistics"
    return int((stats / "tx_bytes").read_text()) + int((stats / "rx_bytes").read_text())


def rank_job(job_path: str, out_path: str) -> None:
    """One torchrun rank: every plan of the job, in order; rank 0 writes every rank's results."""
    import torch
    import torch.distributed as dist

    from embshard.calibrate.measure import run_plan_in_rank, summarize_rank
    from embshard.planner import ShardingPlan
    from embshard.runtime.comm import counting_traffic

    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    first_of_host = int(os.environ["LOCAL_RANK"]) == 0
    results = []
    for raw in job["plans"]:
        before = _link_bytes() if first_of_host else 0
        plan = ShardingPlan.from_dict(raw)
        with counting_traffic(dist.group.WORLD, plan.topology.local_world_size) as counter:
            measured = summarize_rank(run_plan_in_rank(plan, dist.group.WORLD, job["steps"], job["warmup"]))
        link = (_link_bytes() - before) / (job["steps"] + job["warmup"]) if first_of_host else None
        counted = (counter.bytes.inter_host_sent + counter.bytes.inter_host_received) / (job["steps"] + job["warmup"])
        results.append({"wall_ms": measured.wall_ms["total_ms"], "cpu_ms": measured.cpu_ms["total_ms"], "link_bytes_per_step": link,
                        "counted_inter_host_bytes_per_step": counted})
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(results, gathered, dst=0)
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def run_multihost(args) -> dict:
    from plans_measured import PLANNERS, greedy_plan, layout_mix, profile_topology, torchrec_plan, workloads

    from embshard.emulated_hosts import run_torchrun
    from embshard.planner import evaluate, plan

    H, L = args.hosts, args.ranks_per_host
    inter = args.inter_host_gb_per_s or 2 * args.link_gbit / 8
    t0, load_start = time.time(), os.getloadavg()
    cases = {}
    for name, (specs, hbm_gib) in workloads().items():
        if args.workloads and name not in args.workloads:
            continue
        topo = replace(profile_topology(args.profile, hbm_gib), world_size=H * L, local_world_size=L, inter_host_gb_per_s=inter)
        print(f"planning {name} for {H} hosts x {L} ranks", flush=True)
        cases[name] = {"embshard": plan(specs, topo, time_budget_s=args.embshard_budget_s),
                       "torchrec": torchrec_plan(specs, topo, args.torchrec_search_s), "greedy": greedy_plan(specs, topo)}
    flat = [(n, k) for n in cases for k in PLANNERS]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="plans-multihost-") as tmp:
        for rnd in range(args.rounds):
            order = flat if rnd % 2 == 0 else flat[::-1]
            job = Path(tmp) / "job.json"
            job.write_text(json.dumps({"plans": [cases[n][k].to_dict() for n, k in order], "steps": args.steps, "warmup": args.warmup}))
            out = Path(tmp) / f"round{rnd}.json"
            print(f"round {rnd + 1}/{args.rounds}: {len(order)} plans on {H} emulated hosts x {L} ranks", flush=True)
            exits, _, shaping = run_torchrun(H, L, [str(Path(__file__).resolve()), "--rank-job", str(job), str(out)],
                                             timeout_s=args.round_timeout_s, rate_gbit=args.link_gbit, delay_ms=args.delay_ms,
                                             log_dir=Path(tmp))
            if any(e.returncode != 0 for e in exits):
                logs = " | ".join((Path(tmp) / f"host{e.host}.log").read_text()[-1500:] for e in exits)
                raise RuntimeError(f"round {rnd + 1}: hosts exited {[e.returncode for e in exits]}: {logs}")
            per_rank = json.loads(out.read_text())  # [rank][plan in order]
            rounds.append({key: [per_rank[r][i] for r in range(H * L)] for i, key in enumerate(order)})
    result = {"hosts": H, "ranks_per_host": L, "link": shaping, "link_gbit": args.link_gbit, "inter_host_gb_per_s": inter,
              "profile": args.profile, "steps": args.steps, "rounds": args.rounds, "load_start": load_start,
              "load_end": os.getloadavg(), "seconds": time.time() - t0, "cases": {n: {} for n in cases}}
    for n, k in flat:
        p = cases[n][k]
        got = [rd[(n, k)] for rd in rounds]
        maxes = [max(r["wall_ms"] for r in g) for g in got]
        result["cases"][n][k] = {
            "layout": layout_mix(p), "predicted_max_rank_ms": p.max_rank_ms,
            "predicted_per_rank_ms": [r.perf.total_ms for r in evaluate(p.specs, p.topology, p.tables).ranks],
            "measured_max_rank_ms": statistics.median(maxes), "rounds_max_rank_ms": maxes,
            "measured_per_rank_ms": [statistics.median(g[r]["wall_ms"] for g in got) for r in range(H * L)],
            "link_bytes_per_step": [statistics.median(g[h * L]["link_bytes_per_step"] for g in got) for h in range(H)],
            "counted_inter_host_bytes_per_step": statistics.median(sum(r["counted_inter_host_bytes_per_step"] for r in g) for g in got),
            "predicted_inter_host_bytes_per_step": sum(t.inter_host_sent + t.inter_host_received for t in p.traffic),
            "plan": p.to_dict()}
    return result


def markdown(result: dict, command: str) -> str:
    H, L = result["hosts"], result["ranks_per_host"]
    lines = [f"## Plans on {H} emulated hosts x {L} CPU ranks: embshard vs TorchRec's planner vs greedy", "",
             f"Command: `{command}`. Links: {result['link']}; the plans' topology prices inter-host traffic at "
             f"{result['inter_host_gb_per_s']:g} GB/s (half-duplex sum of sent and received). Load average "
             f"{result['load_start'][0]:.1f} at start, {result['load_end'][0]:.1f} at end; {result['seconds']:.0f} s. "
             f"Step = slowest rank's wall time per step (median of {result['steps']} steps), median of {result['rounds']} "
             "rounds; link bytes = each host's veth counters (sent + received) per step, warmup and barriers included. "
             "TorchRec's plan runs on embshard's runtime; TorchRec's DMP is not run across hosts.", "",
             "| workload | plan | layouts | predicted ms (slowest) | measured ms (slowest) | predicted / measured | "
             "predicted ms per rank | measured ms per rank | link bytes/step per host | inter-host bytes/step counted / predicted |",
             "|---|---|---|---:|---:|---:|---|---|---|---|"]
    for name, e in result["cases"].items():
        for k, x in e.items():
            lines.append(f"| {name} | {k} | {x['layout']} | {x['predicted_max_rank_ms']:.1f} | {x['measured_max_rank_ms']:.1f} | "
                         f"{x['predicted_max_rank_ms'] / x['measured_max_rank_ms']:.2f} | "
                         f"{' / '.join(f'{v:.0f}' for v in x['predicted_per_rank_ms'])} | "
                         f"{' / '.join(f'{v:.0f}' for v in x['measured_per_rank_ms'])} | "
                         f"{' / '.join(f'{v / 1e6:.2f} MB' for v in x['link_bytes_per_step'])} | "
                         f"{x['counted_inter_host_bytes_per_step'] / 1e6:.2f} / {x['predicted_inter_host_bytes_per_step'] / 1e6:.2f} MB |")
    fastest = {n: min(e, key=lambda k: e[k]["measured_max_rank_ms"]) for n, e in result["cases"].items()}
    lines += ["", *(f"- {n}: fastest measured: {k}" for n, k in fastest.items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank-job"]:
        sys.path.insert(0, str(HERE))
        rank_job(sys.argv[2], sys.argv[3])
