"""Tables bigger than HBM: embshard's tiered plans vs TorchRec's planner with UVM caching, scored by both cost models.

    .venv/bin/python benchmarks/tiered_vs_torchrec.py --markdown benchmarks/results/tiered.md
    .venv/bin/python benchmarks/tiered_vs_torchrec.py --quick     # a small check that it runs (minutes)

Cases (neither fits the cluster's HBM; host memory for tables `--ddr-gib` per rank):
- criteo_tb_measured (embshard/configs/tables/: criteo_tb with pooling factors and hot_rows that
  `embshard-stats` measured on the synthetic Criteo stream) on 8 ranks x 8 GiB of HBM;
- generate_tables(2000, seed=0) with hot_rows measured here (embshard.stats.measure) from the
  synthetic stream with Zipf skew `--id-skew` (`--samples` of it, 15,000 by default: measuring takes
  about 3 CPU ms per sample for the 2,000 tables, 16,384 sketch rows a table), on 64 ranks x `--gen-hbm-gib` (default 8: the set's
  594 GiB of weights and optimizer state fit 64 x 16 GiB of HBM, so 16 would not test tiers).
TorchRec plans the same topology (`to_torchrec_topology`: HBM, host memory as ddr_cap, ddr_gb_per_s
as its HBM-to-DDR bandwidth), batch size, pooling factors and sharding types, with the compute
kernels fused, dense, fused_uvm_caching and fused_uvm allowed (`torchrec_constraints(uvm=True)`)
and the cache load factor its enumerator gives (TorchRec's default, 0.2, where it sets none),
in a subprocess (benchmarks/planner_vs_torchrec.py's child) with a wall-clock limit after which the
case reports "TorchRec did not finish in N s" and the run goes on. criteo_tb_measured gets TorchRec's
default proposers and timeout_seconds=240 (it finishes in seconds; killed after 120 s). The 2,000-table
set gets TorchRec's best proposer for it alone, GreedyProposer(use_depth=False): on generate_tables(200,
seed=0) at 64 ranks (HBM for half of it) its best plan rates 54 ms, the default list's first proposer,
GreedyProposer(), gets 1,413 ms, and a time cap would end the default list inside that one; with
`timeout_seconds=--torchrec-search-s` (200) for its search and `--torchrec-limit-s` (1,500) of wall
clock for the whole child, since TorchRec's enumeration of the options comes first and no cap of its
own bounds it (about 0.1 CPU s per table at 64 ranks: 21 s for 200 tables, 60 s for 600, so 200 to
250 s for the 2,000). With 2,000 tables, 64 ranks and its search capped at 140 s on a loaded machine,
GreedyProposer(use_depth=False) found no plan that fits (the row then says so); with 200 s it found
one, over embshard's HBM caps (TorchRec counts fewer bytes of I/O buffers: 1.07 GiB a rank in
embshard's model at 2,000 tables), whose embshard-model cost is then given without the caps, marked +.
Each planner plans alone: per case embshard's plan and its scoring, then TorchRec's child (planning
times are each process's CPU seconds, with no other planner running beside it). The full run takes
about 10 minutes on a quiet 2-core machine (the pieces timed here, in CPU seconds: measuring 49 (1.5
GiB peak), criteo_tb_measured 15 with TorchRec's child 7, embshard on the set 12, again
torchrec_compatible 12 where TorchRec cannot run its plan, TorchRec's estimate of embshard's plans
17 each, then TorchRec's child on the set up to its 1,500 s limit: 447 CPU s on the slower AMD EPYC VM of
2026-12-06, where 480 s of wall clock, the earlier limit, cut it off).

Each plan is scored by embshard's model (`evaluate`) and by TorchRec's EmbeddingPerfEstimator
(`torchrec_estimate`; TorchRec's plan by its own rating). Planning times are CPU seconds of the
planning call. A run's speedup is one pair of noisy CPU times, so `--pairs` (9) more alternating pairs on
criteo_tb_measured follow the run, each planner in a fresh process (`paired_planning`); their median is the
planning-speed figure (about 25 s a pair). `--quick`: criteo_tb_measured, and 100 generated tables on 8 ranks with HBM for
half of them, 2,000 measured samples, short budgets; it writes nothing unless --markdown is given.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_vs_torchrec import PLANNER_PATHS, TorchRecRun, layout_mix, run_embshard, state_bytes, torchrec_model_ms  # noqa: E402
from sections import commit_label, load_average  # noqa: E402
from tiered_plan_profile import case, cold_plan  # noqa: E402

from embshard.data.config import SyntheticConfig  # noqa: E402
from embshard.machine import cpu_model  # noqa: E402
from embshard.planner import PlanInfeasibleError, evaluate  # noqa: E402
from embshard.planner.plan import ShardingPlan  # noqa: E402
from embshard.planner.types import Location  # noqa: E402
from embshard.planner.report import tiered_tables  # noqa: E402
from embshard.specs import TableSpec  # noqa: E402
from embshard.stats.measure import measure, measured_spec  # noqa: E402
from embshard.topology import GIB, Topology  # noqa: E402
from embshard.workloads import generate_tables  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/tiered_vs_torchrec.py --markdown benchmarks/results/tiered.md"


def measured_tables(specs: tuple[TableSpec, ...], id_skew: float, num_samples: int) -> tuple[TableSpec, ...]:
    """specs with pooling factors and hot_rows measured from the synthetic stream (sketched counters:
    memory bounded by the sketch size, not by the tables' rows; 16,384 sketch rows: about 0.6 GiB for
    the 2,000-table set's 800 tables over 65,536 rows, and tails within about 0.03 of the stream's,
    where 4,096 saw a handful of sampled rows of a 40M-row table and missed by 0.3; embshard/stats/tail.py)."""
    stats = measure(specs, SyntheticConfig(id_skew=id_skew), num_samples, 1024, exact_max_rows=65_536, sketch_rows=16_384)
    return tuple(measured_spec(s, stats[s.name]) for s in specs)


@dataclass(frozen=True)
class TorchRecSearch:
    """What TorchRec's planner is given for one case."""

    proposers: str  # planner_vs_torchrec.TORCHREC_PROPOSERS
    search_s: int  # its timeout_seconds
    limit_s: float  # wall clock for the whole child, after which it is killed

    @property
    def label(self) -> str:
        names = {"default": "default proposers", "greedy_no_depth": "GreedyProposer(use_depth=False)"}
        return f"{names[self.proposers]}, timeout_seconds={self.search_s}, killed after {self.limit_s:g} s"


def cases(args) -> list[tuple[str, tuple[TableSpec, ...], Topology, TorchRecSearch]]:
    out = [("criteo_tb_measured", *case(args.ddr_gib), TorchRecSearch("default", 240, 120.0))]
    n, world = (100, 8) if args.quick else (2000, 64)
    print(f"measuring hot_rows of {n} generated tables from {args.samples:,} synthetic samples ...", flush=True)
    gen = measured_tables(generate_tables(n, seed=0), args.id_skew, args.samples)
    hbm = args.gen_hbm_gib if not args.quick else math.ceil(50 * state_bytes(gen) / world / GIB / 0.9) / 100  # half fits
    out.append((f"generated {n}", gen, Topology(world_size=world, local_world_size=8, hbm_gib=hbm, ddr_gib=args.ddr_gib),
                TorchRecSearch("greedy_no_depth", args.torchrec_search_s, args.torchrec_limit_s)))
    return out


def fits_hbm(specs: tuple[TableSpec, ...], topo: Topology) -> bool:
    return state_bytes(specs) <= topo.world_size * topo.shard_memory_cap_bytes


def embshard_row(name: str, specs: tuple[TableSpec, ...], topo: Topology, es: dict, budget_s: float) -> dict:
    """A result row's embshard half, both models. If TorchRec cannot run embshard's plan, its TorchRec-model
    cost is that of embshard's plan with torchrec_compatible=True (planned here), marked as such."""
    r = {"case": f"{name} on {topo.world_size} x {topo.hbm_gib:g} GiB HBM + {topo.ddr_gib:g} GiB host",
         "state_gib": state_bytes(specs) / GIB, "fits_hbm": fits_hbm(specs, topo), "es_status": es["status"],
         "detail": es.get("detail", "")}
    if es["status"] == "ok":
        p = ShardingPlan.from_dict(es["plan"])
        tr_ms, why = torchrec_model_ms(p)
        tiered = tiered_tables(p)
        r.update(es_cpu_s=es["cpu_s"], es_es_ms=p.max_rank_ms, es_tr_ms=tr_ms, es_tr_why=why, es_mix=layout_mix(p),
                 es_tiered=len(tiered), es_hit=_mean_hit(tiered), lower_bound_ms=p.lower_bound_ms, es_shares=_cache_shares(p))
        if tr_ms is None:
            runnable = run_embshard(specs, topo, budget_s, torchrec_compatible=True)
            if runnable["status"] == "ok":
                rp = ShardingPlan.from_dict(runnable["plan"])
                r.update(es_tr_ms=torchrec_model_ms(rp)[0], es_tr_fallback=rp.max_rank_ms)
    return r


def row(r: dict, specs: tuple[TableSpec, ...], topo: Topology, tr: dict, search: TorchRecSearch) -> dict:
    """The embshard half `r` with TorchRec's plan and the ratios added."""
    r = {**r, "tr_status": tr["status"], "tr_search": search.label,
         "detail": "; ".join(x for x in (r["detail"], tr.get("detail", "")) if x)}
    if tr["status"] == "ok":
        tp = ShardingPlan.from_dict(tr["plan"])
        try:
            tp = evaluate(specs, topo, tp.tables)
        except PlanInfeasibleError as e:  # the child scored it under lifted caps (costs do not depend on them)
            r["tr_es_why"] = (f"(cost marked +) is over embshard's memory caps ({str(e)[:240]} ...); its cost under "
                              "embshard's model is without them")
        r.update(tr_es_ms=tp.max_rank_ms, tr_tiered=len(tiered_tables(tp)), tr_hit=_mean_hit(tiered_tables(tp)),
                 tr_shares=_cache_shares(tp))
        r.update(tr_cpu_s=tr["cpu_s"], tr_tr_ms=tr["torchrec_rating_ms"], tr_proposals=tr["num_proposals"])
    if tr["status"] == "timeout" and "es_cpu_s" in r:  # TorchRec ran the whole limit, one core
        r["speedup_above"] = search.limit_s / r["es_cpu_s"]
    elif tr["status"] == "no_plan" and "es_cpu_s" in r:  # the CPU s TorchRec spent finding none
        r["speedup_above"] = tr["cpu_s"] / r["es_cpu_s"]
    if "es_cpu_s" in r and "tr_cpu_s" in r:
        r["speedup"] = r["tr_cpu_s"] / r["es_cpu_s"]
        if "tr_es_ms" in r:
            r["ratio_es_model"] = r["es_es_ms"] / r["tr_es_ms"]
        if r.get("es_tr_ms") is not None:
            r["ratio_tr_model"] = r["es_tr_ms"] / r["tr_tr_ms"]
    return r


def paired_planning(specs: tuple[TableSpec, ...], topo: Topology, search: TorchRecSearch, pairs: int, ddr_gib: float) -> dict:
    """Planning CPU s of `pairs` alternating pairs on criteo_tb_measured (embshard first in even pairs, TorchRec first in
    odd ones), each planner in a fresh process: embshard's first plan after the benchmark's imports
    (`tiered_plan_profile.cold_plan`), TorchRec's child as in the main run. One pair is one sample of two noisy CPU times
    (TorchRec's child took 1.16 to 2.00 CPU s in twenty pairs on the 2026-12-06 VM): the median of the pairs' speedups
    is the figure to read. Returns each pair's CPU s (embshard, TorchRec) and speedup."""
    es, tr = [], []
    for i in range(pairs):
        for who in ("es", "tr") if i % 2 == 0 else ("tr", "es"):
            if who == "es":
                es.append(cold_plan(ddr_gib)["cpu_s"])
                continue
            r = TorchRecRun(specs, topo, search.limit_s, search.search_s, uvm=True, proposers=search.proposers).result()
            if r["status"] != "ok":
                raise RuntimeError(f"paired timing: TorchRec's child {r['status']}: {r.get('detail', '')}")
            tr.append(r["cpu_s"])
        print(f"pair {i}: embshard {es[-1]:.3f}, TorchRec {tr[-1]:.3f} CPU s: {tr[-1] / es[-1]:.1f}x", flush=True)
    return {"es_cpu_s": es, "tr_cpu_s": tr, "speedups": [t / e for e, t in zip(es, tr)]}


def paired_line(paired: dict) -> str:
    ups, n = paired["speedups"], len(paired["speedups"])
    return (f"Planning time on criteo_tb_measured, {n} alternating pairs after the run (each planner a fresh process; "
            f"embshard's first plan after the benchmark's imports, `tiered_plan_profile.py --cold-child`; TorchRec's child as "
            f"above): speedup median **{statistics.median(ups):.1f}x** (min {min(ups):.1f}, max {max(ups):.1f}; "
            f"{sum(u >= 10 for u in ups)} of {n} pairs at 10x or more; in pair order "
            f"{', '.join(f'{u:.1f}' for u in ups)}); embshard median {statistics.median(paired['es_cpu_s']):.3f} CPU s, "
            f"TorchRec {statistics.median(paired['tr_cpu_s']):.3f}.")


def _cache_shares(p: ShardingPlan) -> str:
    """Tables out of HBM by cache share of their rows (host: none), e.g. '4 x 20%'."""
    counts: dict[str, int] = {}
    for t in p.tables:
        if t.shards[0].location is not Location.HBM:
            share = sum(s.cache_rows for s in t.shards) / sum(s.num_rows for s in t.shards)
            key = f"{share:.0%}" if t.shards[0].location is Location.UVM_CACHE else "host"
            counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} x {k}" for k, n in sorted(counts.items())) or "none"


def _mean_hit(tiered: list[tuple[str, str, int, float]]) -> float | None:
    hits = [hit for _, where, _, hit in tiered if where == "uvm_cache"]
    return sum(hits) / len(hits) if hits else None


def _f(v, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


FINDING = """## Where embshard's and TorchRec's models disagree on tiered plans (hand-written)

The conversion is exact: TorchRec's cost model applied to TorchRec's own plan through `torchrec_estimate` gives its
planner's rating; tiered shards export as `fused_uvm_caching` with `cache_load_factor` = cache rows / rows
(`fused_uvm` in host memory), pooling factors and batch are the same. The models differ in how they price a cached
lookup: TorchRec's EmbeddingPerfEstimator reads every row of a cached table at (load_factor x HBM bandwidth +
(1 - load_factor) x HBM-to-host bandwidth) / 10, so its hit rate is the load factor (ids uniform) and even hits pay
a 10x UVM penalty; embshard takes the hit rate from the table's measured `hot_rows` curve and prices only the misses
(fetch and evict) at host bandwidth.

The curves were wrong where tables have more rows than the sample has lookups: the sample's own counts reach 1 at
the share of rows it touched (criteo_tb_measured's big tables: 100% at 1% of their rows, where Zipf 1.1 gives 88%).
`embshard-stats` now keeps the rows seen 10+ times as measured and spreads the other lookups over the rest of the
table by a power law fitted to how many distinct rows they touched (embshard/stats/tail.py: cat_19 87.9% at 1% of
48.9M rows, the stream 88.0%), and writes the curve at the planner's cache sizes too (5%, 20%). With true curves a
cache's share matters to embshard's model, and four things in the search showed (h14's commits): a local search
going round a 2-cycle of re-shards for 100 steps (criteo_tb_measured 1.8 CPU s; it now stops where a placement
repeats); a greedy pass filling HBM to the byte so that small tables fit no rank (the 2,000-table set was
infeasible; a largest later shard per rank is now kept free); the greedy start putting the big tables in HBM and
polishing into a local minimum (criteo_tb_measured 0.675 ms, 10.8 ms under TorchRec's model, one table-wise 5%
cache; a start that places the tables that may leave HBM out of it first reaches 0.641 ms, 3.86 ms); and 1% caches
on full ranks beside ranks with idle HBM (tables out of HBM now move to better tiers on any ranks where no rank
goes above the plan's maximum: on a 100-table set at 8 ranks, TorchRec's model of the same plan fell from 5.23 to
2.63 ms at the same 0.749 ms under embshard's). `--quick` at h14: criteo_tb_measured 0.370 / 0.470 (es / tr model
ratios), its 100 generated tables 0.615 / 1.584: where HBM is short the models part ways, as below.

Where HBM is short (the 2,000-table set) the models part ways most. embshard's memory model leaves
64 x 6.59 GiB = 422 GiB of HBM for shards (HBM less the reserve and 0.61 GiB of output buffers a rank) for 594 GiB
of weights and optimizer state, so at least 172 GiB stay in host memory; TorchRec counts fewer buffer bytes, keeps
11 to 15 tables out of HBM and is over embshard's caps on 41 to 59 ranks. embshard's search runs out of its time at
this size (its first start's local search is cut at its share of the budget, still improving, and the plan names the
start that did not run), so how far its search gets decides how many tables leave HBM with 1% caches, which embshard's model prices cheaply (misses are a few percent of lookups) and TorchRec's
dearly (every cached lookup at a blend of HBM and host bandwidth, a tenth of it). Planned at h14 (Intel Xeon, two
runs) it kept 120 to 121 tables out of HBM, 31 to 39 of them with 1% caches: 27.6 to 27.9 ms under its model, 175 to
199 ms under TorchRec's, above TorchRec's own plan (62 to 83 ms); at c9ed743 on the same machine 159 ms (1.92x). On
the AMD EPYC machine, at 67bb210 as at h14e, 0c4b01f and 437037d (whose searches are cheaper for the same plans), it
scores 24.08 ms under its model and 49.10 ms under TorchRec's, 0.83x to 0.59x TorchRec's own plan (59.1 to 83.0 ms
in the runs of 2026-12-06: TorchRec's search, cut at its wall-clock limit, ends at another plan from run to run): the target is met there, by a plan whose TorchRec-model cost moved 3x with the machine it was planned on, so not robustly. Which model is right about
cached lookups needs the kernels on a GPU.

I/O buffers: what the runtime allocates (h14e, `benchmarks/io_buffers.py`). Is embshard's memory model over-counting
the buffers that keep the 2,000-table set's shards out of HBM? Measured on the runtime (2 gloo ranks on CPU, 6
table-wise tables of 64 columns, batch 512 per rank, pooling factor 8; the peak of the tensors one training step
allocates, torch's MemTracker, less weights and optimizer state): a rank that runs one pooled kernel peaks at 2.70 MiB,
in the forward (the backward, with a dense layer on the embeddings, stays below): its kernel's output for the global
batch (0.75 MiB, freed once sent), the received block and the assembled [B, sum of dims] output of every table for its
own samples (0.75 MiB each), the received ids and lengths (0.19 MiB) and routing indexes; with two kernels (two
optimizers) output dist concatenates their outputs, one copy more: 3.45 MiB. embshard's model counts 3.21 MiB (holder
1.71: ids, lengths, the output and its gradient; requester 1.50: every table's output and gradient for the rank's
samples), 1.19x the one-kernel peak and 0.93x the two-kernel one: an additive bound that is about right where a rank
runs several kernels and one holder output over where it runs one (the holder's output and its gradient never
coexist; where outputs are concatenated, the copy takes the gradient's place). TorchRec's estimator counts 0.94 MiB
(each shard's input and output once, nothing for the rank's own samples): 0.27 to 0.35 of what the runtime allocates.
On the 2,000-table set (every table rowwise_adagrad: one pooled kernel a rank) the one-kernel over-count is a holder
output a rank, 0.31 GiB on average (32,768 samples x 160,020 columns x 4 bytes / 64 ranks), 19.5 GiB over the 64 ranks
of the 172 GiB or more kept in host memory; the requester buffers TorchRec leaves out are 0.61 GiB on every rank
(2 x 512 x 160,020 x 4 bytes), 39 GiB in all, and its plan fits its HBM only by leaving out buffers the runtime
allocates. The model is kept as it is: counting the holder's output once would under-count ranks that run several
kernels (tiered plans of mixed optimizers, sequence tables) unless output dist wrote the kernels' outputs into one
buffer instead of concatenating them (a follow-up for the runtime and the model together).
"""


def markdown(rows: list[dict], args, total_s: float, paired: dict | None, loads: tuple[str, str]) -> str:
    lines = ["# Tiered plans vs TorchRec's planner with UVM caching\n",
             f"`{COMMAND}`{' --quick' if args.quick else ''} on {cpu_model()}, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, embshard {commit_label(PLANNER_PATHS)}, {total_s:.0f} s in all; "
             f"load average (1/5/15 min) {loads[0]} before, {loads[1]} after; "
             f"embshard budget {args.embshard_budget_s:g} s; hot_rows of the generated set from {args.samples:,} synthetic samples. "
             "Costs are predicted ms per step of the slowest rank; ratio = embshard / TorchRec (below 1: embshard's plan is "
             "cheaper under that model); speedup = TorchRec's planning CPU s / embshard's (TorchRec's CPU s include the "
             "enumeration of its options, which no time cap of its planner bounds; '> N' where TorchRec found no plan: "
             "the CPU s it spent / embshard's, or was killed: its wall-clock limit / embshard's CPU s).\n",
             "| case | state GiB | fits HBM | embshard ms (es model / tr model) | TorchRec ms (es model / tr model) | "
             "ratio es model | ratio tr model | tables out of HBM (es / tr) | mean hit rate (es / tr) | planning CPU s (es / tr) | speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speedup = f"> {r['speedup_above']:.0f}" if "speedup_above" in r else _f(r.get("speedup"), ".1f")
        lines.append(
            f"| {r['case']} | {r['state_gib']:.1f} | {'yes' if r['fits_hbm'] else 'no'} | {_f(r.get('es_es_ms'))} / "
            f"{_f(r.get('es_tr_ms'))}{'*' if 'es_tr_fallback' in r else ''} | {_f(r.get('tr_es_ms'))}{'+' if 'tr_es_why' in r else ''} / {_f(r.get('tr_tr_ms'))} | {_f(r.get('ratio_es_model'))} | "
            f"{_f(r.get('ratio_tr_model'))} | {r.get('es_tiered', '-')} / {r.get('tr_tiered', '-')} | "
            f"{_f(r.get('es_hit'), '.1%')} / {_f(r.get('tr_hit'), '.1%')} | {_f(r.get('es_cpu_s'), '.2f')} / "
            f"{_f(r.get('tr_cpu_s'), '.2f')} | {speedup} |")
    notes = [f"- {r['case']}: embshard {r['es_status']}, TorchRec {r['tr_status']} ({r['tr_search']}"
             + (f"; {r['tr_proposals']} proposals" if "tr_proposals" in r else "") + ")"
             + (f"; {r['detail']}" if r["detail"] else "") + (f"; {r['es_tr_why'].split('. To export')[0]}" if r.get("es_tr_why") else "")
             + (f"; * TorchRec cannot run that layout, so its TorchRec-model cost is that of embshard's plan with "
                f"torchrec_compatible=True ({r['es_tr_fallback']:.3f} ms under embshard's model)" if "es_tr_fallback" in r else "")
             + (f"; TorchRec's plan {r['tr_es_why']}" if r.get("tr_es_why") else "")
             + f"; cache shares of the tables out of HBM: embshard {r.get('es_shares', '-')}, TorchRec {r.get('tr_shares', '-')}"
             for r in rows]
    return "\n".join(lines + ["", *notes, "", *([paired_line(paired), ""] if paired else []), FINDING])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small cases and budgets: checks that the benchmark runs")
    parser.add_argument("--ddr-gib", type=float, default=64.0, help="host memory per rank for tables")
    parser.add_argument("--gen-hbm-gib", type=float, default=8.0, help="HBM per rank of the generated set's 64 ranks")
    parser.add_argument("--id-skew", type=float, default=1.1, help="Zipf exponent of the synthetic stream's ids")
    parser.add_argument("--samples", type=int, default=None, help="synthetic samples measured (default 15,000; quick 2,000)")
    parser.add_argument("--embshard-budget-s", type=float, default=None, help="default 10 (quick 2)")
    parser.add_argument("--torchrec-search-s", type=int, default=None,
                        help="TorchRec's timeout_seconds on the generated set (default 200; quick 20)")
    parser.add_argument("--torchrec-limit-s", type=float, default=None,
                        help="wall clock after which TorchRec's child on the generated set is killed (default 1500; quick 120)")
    parser.add_argument("--pairs", type=int, default=None,
                        help="alternating embshard / TorchRec planning-time pairs on criteo_tb_measured after the run (default 9; quick 2; 0: none)")
    parser.add_argument("--markdown", type=Path, help="write the results here (e.g. benchmarks/results/tiered.md)")
    args = parser.parse_args(argv)
    quick = args.quick
    t_start = time.perf_counter()
    args.samples = args.samples or (2000 if quick else 15_000)
    args.embshard_budget_s = args.embshard_budget_s or (2.0 if quick else 10.0)
    args.torchrec_search_s = args.torchrec_search_s or (20 if quick else 200)
    args.torchrec_limit_s = args.torchrec_limit_s or (120.0 if quick else 1500.0)
    args.pairs = (2 if quick else 9) if args.pairs is None else args.pairs
    load_before = load_average()
    rows, paired = [], None
    cases_run = cases(args)
    for name, specs, topo, search in cases_run:  # each planner alone on the machine: its CPU s are its own
        t0 = time.perf_counter()
        es = run_embshard(specs, topo, args.embshard_budget_s)
        print(f"{name}: embshard {es['status']} ({time.perf_counter() - t0:.1f} s); scoring it ...", flush=True)
        half = embshard_row(name, specs, topo, es, args.embshard_budget_s)
        print(f"{name}: TorchRec planning ({search.label}) ...", flush=True)
        torchrec_run = TorchRecRun(specs, topo, search.limit_s, search.search_s, uvm=True, proposers=search.proposers)
        tr = torchrec_run.result()
        print(f"{name}: TorchRec {tr['status']} ({time.perf_counter() - torchrec_run.start:.1f} s after its start)", flush=True)
        r = row(half, specs, topo, tr, search)
        rows.append(r)
        print(f"{r['case']}: embshard {_f(r.get('es_es_ms'))} ms (es model) / {_f(r.get('es_tr_ms'))} ms (tr model), TorchRec "
              f"{_f(r.get('tr_es_ms'))} / {_f(r.get('tr_tr_ms'))} ms; ratios {_f(r.get('ratio_es_model'))} (es model), "
              f"{_f(r.get('ratio_tr_model'))} (tr model); planning speedup {_f(r.get('speedup'), '.1f')}x"
              + (f"; {r['detail']}" if r["detail"] else "") + f" ({time.perf_counter() - t_start:.0f} s so far)", flush=True)
    name, specs, topo, search = cases_run[0]
    if args.pairs and rows[0].get("tr_status") == "ok":
        print(f"{name}: {args.pairs} alternating planning-time pairs ...", flush=True)
        paired = paired_planning(specs, topo, search, args.pairs, args.ddr_gib)
    text = markdown(rows, args, time.perf_counter() - t_start, paired, (load_before, load_average()))
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
