"""Tables bigger than HBM: embshard's tiered plans vs TorchRec's planner with UVM caching, scored by both cost models.

    .venv/bin/python benchmarks/tiered_vs_torchrec.py --markdown benchmarks/results/tiered.md
    .venv/bin/python benchmarks/tiered_vs_torchrec.py --quick     # a small check that it runs (minutes)

Cases (neither fits the cluster's HBM; host memory for tables `--ddr-gib` per rank):
- criteo_tb_measured (embshard/configs/tables/: criteo_tb with pooling factors and hot_rows that
  `embshard-stats` measured on the synthetic Criteo stream) on 8 ranks x 8 GiB of HBM;
- generate_tables(2000, seed=0) with hot_rows measured here (embshard.stats.measure) from the
  synthetic stream with Zipf skew `--id-skew`, on 64 ranks x `--gen-hbm-gib` (default 8: the set's
  594 GiB of weights and optimizer state fit 64 x 16 GiB of HBM, so 16 would not test tiers).
TorchRec plans the same topology (`to_torchrec_topology`: HBM, host memory as ddr_cap, ddr_gb_per_s
as its HBM-to-DDR bandwidth), batch size, pooling factors and sharding types, with the compute
kernels fused, dense, fused_uvm_caching and fused_uvm allowed (`torchrec_constraints(uvm=True)`)
and the cache load factor its enumerator gives (TorchRec's default, 0.2, where it sets none),
in a subprocess (benchmarks/planner_vs_torchrec.py's child) with a wall-clock limit.

Each plan is scored by embshard's model (`evaluate`) and by TorchRec's EmbeddingPerfEstimator
(`torchrec_estimate`; TorchRec's plan by its own rating). Planning times are CPU seconds of the
planning call. `--quick`: criteo_tb_measured, and 100 generated tables on 8 ranks with HBM for
half of them, 2,000 measured samples, short budgets; it writes nothing unless --markdown is given.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_vs_torchrec import REPO, git_commit, layout_mix, run_embshard, run_torchrec, state_bytes, torchrec_model_ms  # noqa: E402

from embshard.data.config import SyntheticConfig  # noqa: E402
from embshard.machine import cpu_model  # noqa: E402
from embshard.planner import PlanInfeasibleError, evaluate  # noqa: E402
from embshard.planner.plan import ShardingPlan  # noqa: E402
from embshard.planner.report import tiered_tables  # noqa: E402
from embshard.specs import TableSpec, load_tables_file  # noqa: E402
from embshard.stats.measure import measure, measured_spec  # noqa: E402
from embshard.topology import GIB, Topology  # noqa: E402
from embshard.workloads import generate_tables  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/tiered_vs_torchrec.py --markdown benchmarks/results/tiered.md"


def measured_tables(specs: tuple[TableSpec, ...], id_skew: float, num_samples: int) -> tuple[TableSpec, ...]:
    """specs with pooling factors and hot_rows measured from the synthetic stream (sketched counters:
    memory bounded by the sketch size, not by the tables' rows)."""
    stats = measure(specs, SyntheticConfig(id_skew=id_skew), num_samples, 1024, exact_max_rows=65_536, sketch_rows=4096)
    return tuple(measured_spec(s, stats[s.name]) for s in specs)


def cases(args) -> list[tuple[str, tuple[TableSpec, ...], Topology]]:
    tb, _ = load_tables_file(REPO / "embshard" / "configs" / "tables" / "criteo_tb_measured.yaml")
    out = [("criteo_tb_measured", tb, Topology(world_size=8, local_world_size=8, hbm_gib=8.0, ddr_gib=args.ddr_gib,
                                               batch_size_per_rank=4096))]  # the batch of the file's topology (README's dry run)
    n, world = (100, 8) if args.quick else (2000, 64)
    print(f"measuring hot_rows of {n} generated tables from {args.samples:,} synthetic samples ...", flush=True)
    gen = measured_tables(generate_tables(n, seed=0), args.id_skew, args.samples)
    hbm = args.gen_hbm_gib if not args.quick else math.ceil(50 * state_bytes(gen) / world / GIB / 0.9) / 100  # half fits
    out.append((f"generated {n}", gen, Topology(world_size=world, local_world_size=8, hbm_gib=hbm, ddr_gib=args.ddr_gib)))
    return out


def fits_hbm(specs: tuple[TableSpec, ...], topo: Topology) -> bool:
    return state_bytes(specs) <= topo.world_size * topo.shard_memory_cap_bytes


def row(name: str, specs: tuple[TableSpec, ...], topo: Topology, es: dict, tr: dict) -> dict:
    r = {"case": f"{name} on {topo.world_size} x {topo.hbm_gib:g} GiB HBM + {topo.ddr_gib:g} GiB host",
         "state_gib": state_bytes(specs) / GIB, "fits_hbm": fits_hbm(specs, topo), "es_status": es["status"],
         "tr_status": tr["status"], "detail": "; ".join(x.get("detail", "") for x in (es, tr) if x.get("detail"))}
    if es["status"] == "ok":
        p = ShardingPlan.from_dict(es["plan"])
        tr_ms, why = torchrec_model_ms(p)
        tiered = tiered_tables(p)
        r.update(es_cpu_s=es["cpu_s"], es_es_ms=p.max_rank_ms, es_tr_ms=tr_ms, es_tr_why=why, es_mix=layout_mix(p),
                 es_tiered=len(tiered), es_hit=_mean_hit(tiered), lower_bound_ms=p.lower_bound_ms)
    if tr["status"] == "ok":
        try:
            tp = evaluate(specs, topo, ShardingPlan.from_dict(tr["plan"]).tables)
            r.update(tr_es_ms=tp.max_rank_ms, tr_tiered=len(tiered_tables(tp)), tr_hit=_mean_hit(tiered_tables(tp)))
        except PlanInfeasibleError as e:
            r["tr_es_why"] = f"over embshard's memory caps: {str(e)[:160]}"
        r.update(tr_cpu_s=tr["cpu_s"], tr_tr_ms=tr["torchrec_rating_ms"])
    if "es_cpu_s" in r and "tr_cpu_s" in r:
        r["speedup"] = r["tr_cpu_s"] / r["es_cpu_s"]
        if "tr_es_ms" in r:
            r["ratio_es_model"] = r["es_es_ms"] / r["tr_es_ms"]
        if r.get("es_tr_ms") is not None:
            r["ratio_tr_model"] = r["es_tr_ms"] / r["tr_tr_ms"]
    return r


def _mean_hit(tiered: list[tuple[str, str, int, float]]) -> float | None:
    hits = [hit for _, where, _, hit in tiered if where == "uvm_cache"]
    return sum(hits) / len(hits) if hits else None


def _f(v, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def markdown(rows: list[dict], args) -> str:
    lines = [f"# Tiered plans vs TorchRec's planner with UVM caching\n",
             f"`{COMMAND}`{' --quick' if args.quick else ''} on {cpu_model()}, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, embshard {git_commit()}; embshard budget "
             f"{args.embshard_budget_s:g} s, TorchRec search {args.torchrec_search_s} s. Costs are predicted ms per step of the "
             "slowest rank; ratio = embshard / TorchRec (below 1: embshard's plan is cheaper under that model); speedup = "
             "TorchRec's planning CPU s / embshard's.\n",
             "| case | state GiB | fits HBM | embshard ms (es model / tr model) | TorchRec ms (es model / tr model) | "
             "ratio es model | ratio tr model | tables out of HBM (es / tr) | mean hit rate (es / tr) | planning CPU s (es / tr) | speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['state_gib']:.1f} | {'yes' if r['fits_hbm'] else 'no'} | {_f(r.get('es_es_ms'))} / "
            f"{_f(r.get('es_tr_ms'))} | {_f(r.get('tr_es_ms'))} / {_f(r.get('tr_tr_ms'))} | {_f(r.get('ratio_es_model'))} | "
            f"{_f(r.get('ratio_tr_model'))} | {r.get('es_tiered', '-')} / {r.get('tr_tiered', '-')} | "
            f"{_f(r.get('es_hit'), '.1%')} / {_f(r.get('tr_hit'), '.1%')} | {_f(r.get('es_cpu_s'), '.2f')} / "
            f"{_f(r.get('tr_cpu_s'), '.2f')} | {_f(r.get('speedup'), '.1f')} |")
    notes = [f"- {r['case']}: embshard {r['es_status']}, TorchRec {r['tr_status']}"
             + (f" ({r['detail']})" if r["detail"] else "") + (f"; {r['es_tr_why']}" if r.get("es_tr_why") else "")
             + (f"; TorchRec's plan {r['tr_es_why']}" if r.get("tr_es_why") else "") for r in rows]
    return "\n".join(lines + ["", *notes, ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small cases and budgets: checks that the benchmark runs")
    parser.add_argument("--ddr-gib", type=float, default=64.0, help="host memory per rank for tables")
    parser.add_argument("--gen-hbm-gib", type=float, default=8.0, help="HBM per rank of the generated set's 64 ranks")
    parser.add_argument("--id-skew", type=float, default=1.1, help="Zipf exponent of the synthetic stream's ids")
    parser.add_argument("--samples", type=int, default=None, help="synthetic samples measured (default 100,000; quick 2,000)")
    parser.add_argument("--embshard-budget-s", type=float, default=None, help="default 10 (quick 2)")
    parser.add_argument("--torchrec-search-s", type=int, default=None, help="TorchRec's timeout_seconds (default 240; quick 20)")
    parser.add_argument("--torchrec-limit-s", type=float, default=None, help="wall-clock kill limit (default 900; quick 120)")
    parser.add_argument("--markdown", type=Path, help="write the results here (e.g. benchmarks/results/tiered.md)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.samples = args.samples or (2000 if quick else 100_000)
    args.embshard_budget_s = args.embshard_budget_s or (2.0 if quick else 10.0)
    args.torchrec_search_s = args.torchrec_search_s or (20 if quick else 240)
    args.torchrec_limit_s = args.torchrec_limit_s or (120.0 if quick else 900.0)
    rows = []
    for name, specs, topo in cases(args):
        t0 = time.perf_counter()
        es = run_embshard(specs, topo, args.embshard_budget_s)
        print(f"{name}: embshard {es['status']} ({time.perf_counter() - t0:.1f} s); TorchRec planning ...", flush=True)
        tr = run_torchrec(specs, topo, args.torchrec_limit_s, args.torchrec_search_s, uvm=True)
        r = row(name, specs, topo, es, tr)
        rows.append(r)
        print(f"{r['case']}: embshard {_f(r.get('es_es_ms'))} ms (es model) / {_f(r.get('es_tr_ms'))} ms (tr model), TorchRec "
              f"{_f(r.get('tr_es_ms'))} / {_f(r.get('tr_tr_ms'))} ms; ratios {_f(r.get('ratio_es_model'))} (es model), "
              f"{_f(r.get('ratio_tr_model'))} (tr model); planning speedup {_f(r.get('speedup'), '.1f')}x"
              + (f"; {r['detail']}" if r["detail"] else ""), flush=True)
    text = markdown(rows, args)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
