"""plans_measured.py's multi-host mode: plans on H emulated hosts x L ranks joined by a slow link.

    sudo .venv/bin/python benchmarks/plans_measured.py --hosts 2 --ranks-per-host 2 --link-gbit 2          # 6-8 min, 2 cores
    sudo .venv/bin/python benchmarks/plans_measured.py --hosts 2 --ranks-per-host 2 --link-gbit 2 --quick  # ~2 min check

The full run: planning (embshard 10 s, TorchRec's planner up to 20 s, per workload), then 5 rounds of
13 plans (6 steps + 1 warmup each; setting up a plan's collections costs more than its steps), the first
with TorchRec's DMP on 2 more. Measured parts of it at load ~8 on 2 cores: 5 full-size plans of one
workload, 4 steps each, 45 s with planning; --quick (every part, tiny tables) 2 min at load 14.

Three workloads of its own (`workloads`), each a case where placement across hosts decides:
"big_pooled" (two wide pooled tables, four features each, whose outputs are megabytes per
step: table_wise, row_wise over all ranks or table_row_wise inside one host), "skewed_sizes" (one huge
table, four medium, twenty tiny ones: what goes where, and which tiny ones are replicated)
and "sequence_outputs" (sequence tables whose per-id outputs are megabytes per step, and two
deep ones that must be sharded). For each, embshard's plan, TorchRec's planner's plan (on
embshard's runtime) and greedy (table_wise on the emptiest rank where the table fits, else
row_wise over all ranks) are made for the topology H x L (the profile's terms; inter-host
bandwidth from --inter-host-gb-per-s, default 2 x the link rate / L: the half-duplex CPU model sums
a rank's sent and received bytes, which is what embshard-calibrate fits through such a link with one
rank per host, and the model gives each rank a link of its own, where here a host's L ranks share one).
The emulated cluster is priced as it is (`emulated_topology`): its H x L ranks share this machine's cores,
so each rank has cores / (H x L) of one (at most 1; --cores-per-rank), and the profile's per-phase factors,
which scale a rank's CPU work and not the time its bytes spend on inter-host links, are divided by that:
on 2 cores, 4 ranks' CPU phases take twice what a rank on a core of its own takes. The ranks share the cores:
a rank that waits in a collective lends its core to the others, so a plan that leaves one rank idle costs about
the ranks' summed work over the cores rather than its slowest rank's, and plans of the same total work tie
whatever their balance. --cpu-cap holds each rank to its share by a cgroup CPU quota (embshard/emulated_cpu.py),
so that, as on a real cluster, the slowest rank sets the step; but a throttled rank stalls its peers at every
collective, which the model does not price (benchmarks/results/multihost.md, "CPU caps"). A real cluster's
topology keeps the factors as fitted.
Also, on big_pooled with its big tables row_wise over all ranks and the small ones data-parallel
("allreduce"): the runtime with in-host reduction (and the hierarchical all-reduce) against flat
collectives (``topology.reduce_in_host: false``); and on sequence_outputs, embshard's placement
with fp16 and bf16 on the wire (``topology.comms``) against fp32.

One torchrun job per round on embshard.emulated_hosts runs every plan (this file with
--rank-job); a rank's step is its wall time (the link's waits cost no CPU), a plan's step its
slowest rank's. Inter-host bytes per step are counted by the runtime
(`embshard.runtime.comm.counting_traffic`: the embedding collectives' inter-host bytes, sent +
received, summed over ranks) beside the plan's predicted ``traffic_bytes``, and read from each
host's link counters (veth0 tx + rx, every packet: warmup, set-up and barriers included).
TorchRec's plans of the pooled workloads also run through TorchRec's DMP in the first round's job (wall
time per step; where it fails, the results say why). Results: benchmarks/results/multihost.md
with the link settings, machine, date, commit and load, and --json.
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

from paired import paired_rounds
from sections import commit_label

HERE = Path(__file__).resolve().parent
QUICK = {"steps": 2, "warmup": 1, "rounds": 1, "embshard_budget_s": 1.0, "torchrec_search_s": 3, "scale": 0.02}


def workloads(scale: float = 1.0):
    """name -> (tables, memory per rank in GiB) for 2 hosts x 2 ranks; ``scale`` shrinks rows and memory (--quick)."""
    from embshard.specs import TableSpec

    def rows(n: int) -> int:
        return max(64, int(n * scale))

    # two wide tables (250k x 256, 256 MB each; one per rank at most in 0.3 GiB), 4 features each: their pooled
    # outputs are 8 MB per table and step for the global batch, so table_wise, row_wise over all ranks (partial
    # sums reduced in each host) or table_row_wise inside one host decide what crosses hosts; six small ones
    wide = tuple(f"f{j}" for j in range(4))
    big = ([TableSpec(f"big{i}", rows(250_000), 256, 4.0, feature_names=tuple(f"big{i}_{f}" for f in wide)) for i in range(2)]
           + [TableSpec(f"small{i}", rows(5_000), 32, 2.0) for i in range(6)])
    # one huge table (2M x 32, read once: a rank of its own), four medium ones read 8 times, twenty tiny ones
    skewed = ([TableSpec("huge", rows(2_000_000), 32, 1.0)] + [TableSpec(f"medium{i}", rows(200_000), 64, 8.0) for i in range(4)]
              + [TableSpec(f"tiny{i}", rows(1_000), 16, 4.0) for i in range(20)])
    # sequence tables: every id's row goes back to its sample's owner (512 x 20 x 64 floats = 2.6 MB per
    # rank and table): replicating the light ones saves that; two deep ones must be sharded
    sequence = ([TableSpec(f"seq{i}", rows(20_000), 64, 20.0, pooled=False) for i in range(4)]
                + [TableSpec(f"deep{i}", rows(500_000), 64, 2.0, pooled=False) for i in range(2)])
    def gib(full: float) -> float:  # small tables, the same I/O buffers (they scale with the batch)
        return full if scale == 1 else full * scale + 0.1

    return {"big_pooled": (tuple(big), gib(0.3)), "skewed_sizes": (tuple(skewed), gib(0.35)),
            "sequence_outputs": (tuple(sequence), gib(0.25))}


def emulated_topology(base, hosts: int, ranks_per_host: int, inter_host_gb_per_s: float, cores_per_rank: float):
    """``base`` on hosts x ranks_per_host ranks, inter-host traffic at inter_host_gb_per_s, with its per-phase factors (a
    rank's CPU work; inter-host link time is not scaled, embshard.planner.cost.perf._factored) divided by the cores each
    rank has: the emulated hosts share this machine's cores. (dp_allreduce_factor, like the others, leaves the
    all-reduce's inter-host legs unscaled.)"""
    from embshard.topology import PHASE_FACTORS

    assert 0 < cores_per_rank <= 1, cores_per_rank
    return replace(base, world_size=hosts * ranks_per_host, local_world_size=ranks_per_host, inter_host_gb_per_s=inter_host_gb_per_s,
                   **{f: getattr(base, f) / cores_per_rank for f in PHASE_FACTORS})


def greedy_plan(specs, topo):
    """Tables by size (weights + optimizer state), largest first: table_wise on the rank holding the fewest
    bytes so far if it fits under the memory cap there, else row_wise over all ranks."""
    from embshard.planner import manual_plan

    size = {s.name: s.num_embeddings * (s.embedding_dim * s.element_bytes + s.optimizer_state_bytes_per_row(s.embedding_dim)) for s in specs}
    held, layout, W = [0] * topo.world_size, {}, topo.world_size
    for s in sorted(specs, key=lambda s: -size[s.name]):
        r = min(range(W), key=lambda r: (held[r], r))
        if held[r] + size[s.name] <= topo.shard_memory_cap_bytes * 0.9:  # room for the buffers
            held[r] += size[s.name]
            layout[s.name] = ("table_wise", [r])
        else:
            held = [h + size[s.name] / W for h in held]
            layout[s.name] = ("row_wise", list(range(W)))
    return manual_plan(specs, topo, layout)


def row_wise_heavy(specs, topo):
    """The big tables row_wise over all ranks, the others data-parallel by all-reduce: in-host reduction and
    the hierarchical all-reduce at work; and the same placement with flat collectives."""
    from embshard.planner import evaluate, manual_plan

    p = manual_plan(specs, topo, {s.name: ("row_wise" if s.name.startswith("big") else "data_parallel", list(range(topo.world_size)))
                                  for s in specs})
    tables = [replace(t, data_parallel_mode="allreduce") if t.sharding_type.value == "data_parallel" else t for t in p.tables]
    return {"in-host reduction": evaluate(specs, topo, tables), "flat": evaluate(specs, replace(topo, reduce_in_host=False), tables)}


def with_wire(p):
    """The plan's placement with fp16 and bf16 embeddings, gradients and data-parallel gradients on the wire (fp32: the plan)."""
    from embshard.comms import CommsPrecision
    from embshard.planner import evaluate

    return {d: evaluate(p.specs, replace(p.topology, comms=CommsPrecision(d, d, d)), p.tables) for d in ("fp16", "bf16")}


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
    steps = job["steps"] + job["warmup"]
    results = []
    for raw in job["plans"]:
        before = _link_bytes() if first_of_host else 0
        plan = ShardingPlan.from_dict(raw)
        with counting_traffic(dist.group.WORLD, plan.topology.local_world_size) as counter:
            measured = summarize_rank(run_plan_in_rank(plan, dist.group.WORLD, job["steps"], job["warmup"]))
        link = (_link_bytes() - before) / steps if first_of_host else None
        results.append({"wall_ms": measured.wall_ms["total_ms"], "cpu_ms": measured.cpu_ms["total_ms"], "link_bytes_per_step": link,
                        "counted_inter_host_bytes_per_step": (counter.bytes.inter_host_sent + counter.bytes.inter_host_received) / steps})
    dmp: list[float] | str = []
    if job["dmp_plans"]:  # TorchRec's plans through TorchRec's DMP, wall time per step
        from plans_measured import dmp_plans

        try:
            dmp = dmp_plans({**job, "plans": job["dmp_plans"]}, dist.get_rank(), time.perf_counter)
        except Exception as e:  # noqa: BLE001 -- recorded in the results: why TorchRec's DMP does not run here
            dmp = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object({"plans": results, "dmp": dmp}, gathered, dst=0)
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def run_multihost(args) -> dict:
    from cost_model_accuracy import today
    from local_ranks import run_ranks
    from plans_measured import layout_mix, profile_topology, torchrec_plan

    from embshard.machine import cpu_model
    from embshard.planner import evaluate, plan

    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    H, L = args.hosts, args.ranks_per_host
    inter = args.inter_host_gb_per_s or 2 * args.link_gbit / 8 / L  # a host's L ranks share its one link
    cores = args.cores_per_rank or min(1.0, (os.cpu_count() or 1) / (H * L))  # the emulated hosts share this machine's cores
    t0, load_start = time.time(), os.getloadavg()
    sections: dict[str, dict] = {"placement": {}, "reduction": {}, "wire": {}}
    torchrec_errors: dict[str, str] = {}
    for name, (specs, hbm_gib) in workloads(getattr(args, "scale", 1.0)).items():
        if args.workloads and name not in args.workloads:
            continue
        topo = emulated_topology(profile_topology(args.profile, hbm_gib), H, L, inter, cores)
        print(f"planning {name} for {H} hosts x {L} ranks", flush=True)
        plans = {"embshard": plan(specs, topo, time_budget_s=args.embshard_budget_s)}
        try:
            plans["torchrec"] = torchrec_plan(specs, topo, args.torchrec_search_s)
        except (RuntimeError, ValueError) as e:  # no plan, or one that does not fit embshard's memory model
            torchrec_errors[name] = str(e).splitlines()[0][:300]
        plans["greedy"] = greedy_plan(specs, topo)
        sections["placement"][name] = plans
        if name == "big_pooled":
            sections["reduction"][name] = row_wise_heavy(specs, topo)
        if name == "sequence_outputs":
            sections["wire"][name] = with_wire(plans["embshard"])
    keys = [(sec, n, k) for sec, cases in sections.items() for n in cases for k in cases[n]]
    # TorchRec's DMP harness builds EmbeddingBagCollections: pooled workloads only
    dmp_cases = [n for n, plans in sections["placement"].items() if "torchrec" in plans and all(s.pooled for s in plans["torchrec"].specs)]
    rounds, dmp_rounds = [], []
    with tempfile.TemporaryDirectory(prefix="plans-multihost-") as tmp:
        for rnd in range(args.rounds):
            order = keys if rnd % 2 == 0 else keys[::-1]
            job = Path(tmp) / "job.json"
            job.write_text(json.dumps({"plans": [sections[s][n][k].to_dict() for s, n, k in order], "steps": args.steps,
                                       "warmup": args.warmup, "dmp_plans": [sections["placement"][n]["torchrec"].to_dict()
                                                                           for n in dmp_cases] if rnd == 0 else []}))
            out = Path(tmp) / f"round{rnd}.json"
            print(f"round {rnd + 1}/{args.rounds}: {len(order)} plans on {H} emulated hosts x {L} ranks", flush=True)
            shaping = run_ranks(str(Path(__file__).resolve()), ["--rank-job", str(job), str(out)], hosts=H, ranks_per_host=L,
                                link_gbit=args.link_gbit, delay_ms=args.delay_ms, timeout_s=args.round_timeout_s,
                                cpu_per_rank=cores if args.cpu_cap else None)
            per_rank = json.loads(out.read_text())  # [rank] -> plans: [plan in order], dmp: [case] or why not
            rounds.append({key: [per_rank[r]["plans"][i] for r in range(H * L)] for i, key in enumerate(order)})
            if rnd == 0:  # TorchRec's DMP in the first round only (the full run's time)
                dmp_rounds.append([per_rank[r]["dmp"] for r in range(H * L)])
    result = {"hosts": H, "ranks_per_host": L, "link": shaping, "link_gbit": args.link_gbit, "inter_host_gb_per_s": inter,
              "cores_per_rank": cores, "cpu_capped": args.cpu_cap, "profile": args.profile, "steps": args.steps, "rounds": args.rounds, "quick": bool(args.quick),
              "load_start": load_start, "load_end": os.getloadavg(), "seconds": time.time() - t0, "date": today(),
              "cpu": cpu_model(), "cores": os.cpu_count(), "commit": commit_label(), "torchrec_errors": torchrec_errors,
              **{sec: {n: {} for n in cases} for sec, cases in sections.items()}}
    errors = sorted({d for rd in dmp_rounds for d in rd if isinstance(d, str)})
    result["dmp"] = {"error": "; ".join(errors)} if errors else {
        n: {"measured_max_rank_ms": statistics.median(max(d[i] for d in rd) for rd in dmp_rounds),
            "measured_per_rank_ms": [statistics.median(rd[r][i] for rd in dmp_rounds) for r in range(H * L)]}
        for i, n in enumerate(dmp_cases)}
    for sec, n, k in keys:
        p = sections[sec][n][k]
        got = [rd[(sec, n, k)] for rd in rounds]
        maxes = [max(r["wall_ms"] for r in g) for g in got]
        result[sec][n][k] = {
            "layout": layout_mix(p), "predicted_max_rank_ms": p.max_rank_ms,
            "predicted_per_rank_ms": [r.perf.total_ms for r in evaluate(p.specs, p.topology, p.tables).ranks],
            "measured_max_rank_ms": statistics.median(maxes), "rounds_max_rank_ms": maxes,
            "measured_per_rank_ms": [statistics.median(g[r]["wall_ms"] for g in got) for r in range(H * L)],
            "link_bytes_per_step": [statistics.median(g[h * L]["link_bytes_per_step"] for g in got) for h in range(H)],
            "counted_inter_host_bytes_per_step": statistics.median(sum(r["counted_inter_host_bytes_per_step"] for r in g) for g in got),
            "predicted_inter_host_bytes_per_step": sum(t.inter_host_sent + t.inter_host_received for t in p.traffic),
            "plan": p.to_dict()}
    return result


def _mb(x: float) -> str:
    return f"{x / 1e6:.2f}"


def _row(label: str, x: dict) -> str:
    return (f"| {label} | {x['layout']} | {x['predicted_max_rank_ms']:.1f} | {x['measured_max_rank_ms']:.1f} | "
            f"{x['predicted_max_rank_ms'] / x['measured_max_rank_ms']:.2f} | "
            f"{' / '.join(f'{v:.0f}' for v in x['predicted_per_rank_ms'])} | {' / '.join(f'{v:.0f}' for v in x['measured_per_rank_ms'])} | "
            f"{_mb(x['counted_inter_host_bytes_per_step'])} / {_mb(x['predicted_inter_host_bytes_per_step'])} | "
            f"{' / '.join(_mb(v) for v in x['link_bytes_per_step'])} |")


HEAD = ("| {what} | layouts | predicted ms (slowest) | measured ms (slowest) | predicted / measured | predicted ms per rank | "
        "measured ms per rank | inter-host MB/step counted / predicted | link MB/step per host |\n|---|---|---:|---:|---:|---|---|---|---|")


def verdict(e: dict) -> str:
    fastest = min(e, key=lambda k: e[k]["measured_max_rank_ms"])
    base = e["embshard"]
    err = base["predicted_max_rank_ms"] / base["measured_max_rank_ms"] - 1
    if fastest == "embshard":
        nxt = min((k for k in e if k != "embshard"), key=lambda k: e[k]["measured_max_rank_ms"])
        apart = all(max(base["rounds_max_rank_ms"]) < min(e[k]["rounds_max_rank_ms"]) for k in e if k != "embshard")
        tests = [(k, *paired_rounds(base["rounds_max_rank_ms"], e[k]["rounds_max_rank_ms"])) for k in e if k != "embshard"]
        measurable = all(p < 0.05 for *_, p in tests)
        pairs = ", ".join(f"{k} in {wins} of {n} rounds (sign test p = {p:.3f})" for k, wins, n, p in tests)
        head = (f"embshard fastest, {e[nxt]['measured_max_rank_ms'] / base['measured_max_rank_ms'] - 1:.1%} ahead of {nxt}"
                f" ({'every round apart' if apart else 'rounds overlap'}); faster than {pairs}: "
                f"{'measurably fastest' if measurable else 'NOT measurably fastest (p >= 0.05)'}")
    else:
        head = f"embshard NOT fastest: {fastest} is {1 - e[fastest]['measured_max_rank_ms'] / base['measured_max_rank_ms']:.1%} faster"
    return f"{head}; embshard's predicted step {err:+.0%} off measured ({'within' if abs(err) <= 0.2 else 'outside'} the 20% target)"


def markdown(result: dict, command: str) -> str:
    H, L = result["hosts"], result["ranks_per_host"]
    lines = [f"## Plans on {H} emulated hosts x {L} CPU ranks: embshard vs TorchRec's planner vs greedy", "",
             f"Command: `{command}`{' (QUICK: tiny tables and steps, a check that it runs, not a measurement)' if result['quick'] else ''}. "
             f"{result['cpu']}, {result['cores']} cores, no GPU; {result['date']}; commit {result['commit']}; load average "
             f"{result['load_start'][0]:.1f} at start, {result['load_end'][0]:.1f} at end; {result['seconds']:.0f} s.", "",
             f"Links: {result['link']} (network namespaces and a bridge, embshard.emulated_hosts); the plans' topology prices "
             f"inter-host traffic at {result['inter_host_gb_per_s']:g} GB/s (half-duplex sum of sent and received), the rest is "
             f"profile {result['profile']}, its per-phase factors (a rank's CPU work, not inter-host link time) divided by the "
             f"{result.get('cores_per_rank', 1.0):g} core(s) each rank has here ({H * L} ranks on {result['cores']} cores: the emulated "
             f"cluster priced as it is; "
             + ("each rank capped at that share by a cgroup CPU quota, so a rank that waits cannot lend its core to another, as "
                "a rank of a real cluster cannot lend its device (--cpu-cap)" if result.get("cpu_capped") else
                "the ranks share the cores, so a rank that waits lends its core to the others")
             + f"). Step = slowest rank's wall time per step (median of {result['steps']} steps), median of "
             f"{result['rounds']} rounds that alternate the order of all plans; inter-host bytes counted by the runtime's counter "
             "(embedding collectives, sent + received, all ranks) against the plan's `traffic_bytes`; link bytes = each host's veth "
             "counters (sent + received) per step, set-up, warmup and barriers included. TorchRec's plan runs on embshard's "
             "runtime (and through TorchRec's DMP, below).",
             "", "### Placement", "", HEAD.format(what="workload / plan")]
    verdicts = []
    for name, e in result["placement"].items():
        lines += [_row(f"{name} / {k}", x) for k, x in e.items()]
        verdicts.append(f"- {name}: {verdict(e)}")
    verdicts += [f"- {name}: TorchRec's planner gave no plan that embshard's runtime can run: {why}"
                 for name, why in result["torchrec_errors"].items()]
    lines += ["", *verdicts, ""]
    for name, e in result["reduction"].items():
        lines += ["### In-host reduction against flat collectives", "",
                  f"{name}, its big tables row_wise over all {H * L} ranks and the small ones data-parallel (all-reduce): "
                  "with in-host reduction (row-wise partial sums summed inside each host first; data-parallel gradients "
                  "all-reduced hierarchically where the cost model says it pays) and with `topology.reduce_in_host: false` "
                  "(every row shard's partial sums to every sample owner, one ring all-reduce).", "", HEAD.format(what="runtime"),
                  *(_row(k, x) for k, x in e.items()), ""]
        a, b = e["in-host reduction"], e["flat"]
        lines += [f"- inter-host bytes: in-host reduction {b['counted_inter_host_bytes_per_step'] / max(a['counted_inter_host_bytes_per_step'], 1):.2f}x "
                  f"fewer than flat (counted); step time {a['measured_max_rank_ms'] / b['measured_max_rank_ms']:.2f}x flat's "
                  f"(predicted {a['predicted_max_rank_ms'] / b['predicted_max_rank_ms']:.2f}x)", ""]
    for name, e in result["wire"].items():
        e = {"fp32": result["placement"][name]["embshard"], **e}
        lines += ["### Quantized against fp32 communication", "",
                  f"{name}, embshard's placement (fp32: its row above), embeddings, their gradients and data-parallel gradients "
                  "on the wire as each dtype (`topology.comms`).", "", HEAD.format(what="wire dtype"), *(_row(k, x) for k, x in e.items()), ""]
        lines += [f"- {d}: inter-host bytes {e[d]['counted_inter_host_bytes_per_step'] / max(e['fp32']['counted_inter_host_bytes_per_step'], 1):.2f}x "
                  f"fp32's, step {e[d]['measured_max_rank_ms'] / e['fp32']['measured_max_rank_ms']:.2f}x fp32's" for d in e if d != "fp32"]
        lines.append("")
    dmp = result["dmp"]
    lines += ["### TorchRec's plan through TorchRec's DMP", "",
              "The first round's torchrun job also runs TorchRec's plans of the pooled workloads through TorchRec's "
              "DistributedModelParallel (gloo, CPU; plans_measured.dmp_plans, wall time per step, one round; its "
              "EmbeddingCollection does not run on CPU with data-parallel tables, so sequence_outputs is left out).", ""]
    if "error" in dmp:
        lines += [f"TorchRec's DMP did not run across the emulated hosts: {dmp['error']}", ""]
    else:
        lines += [f"- {n}: TorchRec's plan on TorchRec's DMP {d['measured_max_rank_ms']:.1f} ms (slowest rank; per rank "
                  f"{' / '.join(f'{v:.0f}' for v in d['measured_per_rank_ms'])}), on embshard's runtime "
                  f"{result['placement'][n]['torchrec']['measured_max_rank_ms']:.1f} ms; embshard's plan on embshard's runtime "
                  f"{result['placement'][n]['embshard']['measured_max_rank_ms']:.1f} ms" for n, d in dmp.items()]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank-job"]:
        sys.path.insert(0, str(HERE))
        rank_job(sys.argv[2], sys.argv[3])
