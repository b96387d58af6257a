"""embshard's planner vs TorchRec's EmbeddingShardingPlanner, scored by both cost models.

    .venv/bin/python benchmarks/planner_vs_torchrec.py --markdown benchmarks/results/planner.md

Cases: criteo_kaggle, criteo_tb, generate_tables(150, seed=0) and generate_tables(856,
seed=0) at 8, 16, 64 and 128 ranks (8 per host, cuda defaults of embshard.topology).
Memory per rank is tight on purpose: HEADROOM x (weights + optimizer state) / world size,
divided by (1 - reserved_fraction), so every table larger than HEADROOM/W of the model must
be split. TorchRec plans GPU layouts (compute_device "cuda") for the same topology
(`to_torchrec_topology`), batch size, pooling factors, sharding types and HBM-resident
kernels (`torchrec_constraints`), and the same reserved fraction. It runs in a subprocess
with a wall-clock limit (--torchrec-limit-s) and its own search timeout
(--torchrec-search-s); a killed run is reported as a timeout.

Each plan is scored by embshard's model (`evaluate`) and by TorchRec's EmbeddingPerfEstimator
(`torchrec_estimate`; TorchRec's own plan by the rating its planner computed). Wall times
and CPU times are those of the planning call alone; the speedup uses CPU time where both
runs recorded it (on a shared machine wall time mostly measures the other processes). Per-case results are cached in --cache (JSON), keyed
by the case inputs, so an interrupted run resumes; --rerun-embshard replans embshard only.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from embshard.interop.torchrec import from_torchrec_plan, torchrec_estimate
from embshard.machine import cpu_model
from embshard.planner import PlanInfeasibleError, evaluate, plan
from embshard.planner.plan import ShardingPlan
from embshard.specs import TableSpec, load_tables_file, tables_from_list
from embshard.topology import GIB, Topology
from embshard.workloads import generate_tables
from sections import commit_label

REPO = Path(__file__).resolve().parent.parent
PLANNER_PATHS = ("embshard/planner", "embshard/interop")  # an embshard run's "commit" notes changes under these
HEADROOM = 2.0
LOCAL_WORLD_SIZE = 8
WORLD_SIZES = (8, 16, 64, 128)
WORKLOADS = ("criteo_kaggle", "criteo_tb", "dlrm_150", "dlrm_856")
ANALYSIS_HEADING = "## Analysis (hand-written, kept across reruns)"
COMMAND = ".venv/bin/python benchmarks/planner_vs_torchrec.py --markdown benchmarks/results/planner.md"


def load_workload(name: str) -> tuple[TableSpec, ...]:
    if name.startswith("dlrm_"):
        return generate_tables(int(name.split("_")[1]), seed=0)
    specs, _ = load_tables_file(REPO / "embshard" / "configs" / "tables" / f"{name}.yaml")
    return specs


def state_bytes(specs: tuple[TableSpec, ...]) -> int:
    return sum(s.num_embeddings * (s.embedding_dim * s.element_bytes + s.optimizer_state_bytes_per_row(s.embedding_dim)) for s in specs)


def case_topology(specs: tuple[TableSpec, ...], world_size: int) -> Topology:
    """HEADROOM x the model's state per rank, before the reserved fraction, rounded up to 0.01 GiB."""
    reserved = Topology(world_size=world_size).reserved_fraction
    hbm_gib = HEADROOM * state_bytes(specs) / world_size / GIB / (1 - reserved)
    return Topology(world_size=world_size, local_world_size=LOCAL_WORLD_SIZE, hbm_gib=math.ceil(hbm_gib * 100) / 100)


def case_key(specs: tuple[TableSpec, ...], topo: Topology) -> str:
    payload = json.dumps({"specs": [s.to_dict() for s in specs], "topology": topo.to_dict()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# ---- the two planners ----------------------------------------------------------------


def run_embshard(specs: tuple[TableSpec, ...], topo: Topology, time_budget_s: float, torchrec_compatible: bool = False) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        p = plan(specs, topo, time_budget_s=time_budget_s, torchrec_compatible=torchrec_compatible)
    except PlanInfeasibleError as e:
        return {"status": "infeasible", "detail": str(e)}
    return {"status": "ok", "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "plan": p.to_dict(),
            "commit": commit_label(PLANNER_PATHS)}


TORCHREC_PROPOSERS = ("default", "greedy_no_depth")  # TorchRec's default proposer list, or its GreedyProposer(use_depth=False) alone


def run_torchrec(specs: tuple[TableSpec, ...], topo: Topology, limit_s: float, search_s: int, uvm: bool = False,
                 proposers: str = "default") -> dict:
    """TorchRec's planner in a subprocess (killed after limit_s); uvm: it may also keep tables in host
    memory (FUSED_UVM_CACHING at the cache load factor its enumerator gives, FUSED_UVM); proposers: one
    of TORCHREC_PROPOSERS (default: GridSearch, Greedy, Greedy(use_depth=False), Uniform)."""
    return TorchRecRun(specs, topo, limit_s, search_s, uvm, proposers).result()


class TorchRecRun:
    """`run_torchrec` started now, in the background; `result()` waits for it (up to limit_s after the start)."""

    def __init__(self, specs: tuple[TableSpec, ...], topo: Topology, limit_s: float, search_s: int, uvm: bool = False,
                 proposers: str = "default") -> None:
        assert proposers in TORCHREC_PROPOSERS, proposers
        self.limit_s, self.search_s = limit_s, search_s
        self.tmp = tempfile.TemporaryDirectory()
        job, self.out = Path(self.tmp.name) / "job.json", Path(self.tmp.name) / "out.json"
        job.write_text(json.dumps({"specs": [s.to_dict() for s in specs], "topology": topo.to_dict(), "search_s": search_s,
                                   "uvm": uvm, "proposers": proposers}))
        cmd = [sys.executable, __file__, "--torchrec-child", str(job), str(self.out)]
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)

    def result(self) -> dict:
        try:
            _, stderr = self.proc.communicate(timeout=max(self.limit_s - (time.perf_counter() - self.start), 0.0))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            self.tmp.cleanup()
            return {"status": "timeout", "detail": f"TorchRec did not finish in {self.limit_s:.0f} s wall clock (killed; its "
                                                   f"search timeout_seconds={self.search_s})"}
        try:
            if self.proc.returncode != 0 or not self.out.exists():
                return {"status": "error", "detail": stderr.strip().splitlines()[-1][:400] if stderr.strip()
                        else f"exit {self.proc.returncode}"}
            return json.loads(self.out.read_text())
        finally:
            self.tmp.cleanup()


def torchrec_child(job_path: str, out_path: str) -> None:
    """Plan with TorchRec; write its plan as embshard placements, its own rating and wall time."""
    import torch
    from torch import nn
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.constants import UVM_CACHING_RATIO
    from torchrec.distributed.types import CacheParams
    from torchrec.distributed.planner.perf_models import NoopPerfModel
    from torchrec.distributed.planner.proposers import GreedyProposer
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    from embshard.interop.torchrec import to_embedding_configs, to_torchrec_topology, torchrec_constraints

    job = json.loads(Path(job_path).read_text())
    specs = tables_from_list(job["specs"])
    topo = Topology.from_dict(job["topology"])
    bags, _ = to_embedding_configs([s for s in specs if s.pooled])
    model = nn.Module()
    if bags:
        model.ebc = EmbeddingBagCollection(tables=bags, device=torch.device("meta"))
    # an EmbeddingCollection takes one embedding_dim: one collection per width of the sequence tables
    for dim in sorted({s.embedding_dim for s in specs if not s.pooled}):
        _, sequences = to_embedding_configs([s for s in specs if not s.pooled and s.embedding_dim == dim])
        setattr(model, f"ec_{dim}", EmbeddingCollection(tables=sequences, device=torch.device("meta")))
    tr_topology = to_torchrec_topology(topo)
    planner = EmbeddingShardingPlanner(
        topology=tr_topology, batch_size=topo.batch_size_per_rank, constraints=torchrec_constraints(specs, job.get("uvm", False)),
        storage_reservation=FixedPercentageStorageReservation(topo.reserved_fraction), stats=[], debug=False,
        timeout_seconds=job["search_s"],
        proposer=[GreedyProposer(use_depth=False)] if job.get("proposers") == "greedy_no_depth" else None)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        tr_plan = planner.plan(model, [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()])
    except PlannerError as e:  # no proposal fitted (in the search time): a result, not a crash
        first_line = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        Path(out_path).write_text(json.dumps({
            "status": "no_plan", "cpu_s": time.process_time() - c0, "num_proposals": planner._num_proposals,
            "detail": f"TorchRec's planner found no plan that fits in {time.perf_counter() - t0:.0f} s "
                      f"({time.process_time() - c0:.0f} CPU s, {planner._num_proposals} proposals, "
                      f"timeout_seconds={job['search_s']}): {e.error_type.value}: {first_line}"}))
        return
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    rating_ms = NoopPerfModel(tr_topology).rate(planner._best_plan)
    for module_plan in tr_plan.plan.values():  # a cached table without cache_params runs at TorchRec's default load factor
        for name, ps in module_plan.items():
            if ps.compute_kernel == "fused_uvm_caching" and (ps.cache_params is None or ps.cache_params.load_factor is None):
                module_plan[name] = dataclasses.replace(ps, cache_params=CacheParams(load_factor=UVM_CACHING_RATIO))
    try:
        as_embshard = from_torchrec_plan(tr_plan, specs, topo)
    except PlanInfeasibleError:  # TorchRec's storage model let it fill a rank past embshard's caps: the
        # placements go back all the same, scored under caps lifted 4x (costs do not depend on them); the
        # caller's evaluate with the real topology says what is over
        lifted = dataclasses.replace(topo, hbm_gib=4 * topo.hbm_gib, ddr_gib=4 * topo.ddr_gib)
        as_embshard = from_torchrec_plan(tr_plan, specs, lifted)
    Path(out_path).write_text(json.dumps({"status": "ok", "wall_s": wall_s, "cpu_s": cpu_s, "torchrec_rating_ms": rating_ms,
                                          "num_proposals": planner._num_proposals, "plan": as_embshard.to_dict()}))


# ---- scoring and reporting -------------------------------------------------------------


def torchrec_model_ms(p: ShardingPlan) -> tuple[float | None, str]:
    """max over ranks of TorchRec's estimate, or None and why TorchRec cannot run the layout."""
    try:
        return max(torchrec_estimate(p)), ""
    except ValueError as e:
        return None, str(e)


def layout_mix(p: ShardingPlan) -> str:
    counts: dict[str, int] = {}
    short = {"data_parallel": "DP", "table_wise": "TW", "row_wise": "RW", "column_wise": "CW",
             "table_row_wise": "TWRW", "table_column_wise": "TWCW"}
    for t in p.tables:
        counts[short[t.sharding_type.value]] = counts.get(short[t.sharding_type.value], 0) + 1
    return " ".join(f"{k}{v}" for k, v in sorted(counts.items()))


def score(workload: str, specs: tuple[TableSpec, ...], topo: Topology, entry: dict) -> dict:
    """One result row; TorchRec's cached placements are re-scored with the current embshard model.
    If TorchRec cannot run embshard's plan, its TorchRec-model cost is that of embshard's plan
    with torchrec_compatible=True, marked as such."""
    es, tr, runnable = entry["embshard"], entry["torchrec"], entry.get("embshard_runnable")
    row = {"case": f"{workload} W={topo.world_size}", "hbm_gib": topo.hbm_gib, "es_status": es["status"], "tr_status": tr["status"],
           "es_detail": es.get("detail", ""), "tr_detail": tr.get("detail", "")}
    es_plan = ShardingPlan.from_dict(es["plan"]) if es["status"] == "ok" else None
    tr_plan = None
    if tr["status"] == "ok":
        try:  # TorchRec's own memory model may place more on a rank than embshard's cap allows
            tr_plan = evaluate(specs, topo, ShardingPlan.from_dict(tr["plan"]).tables)
        except PlanInfeasibleError as e:
            row.update(tr_status="over_cap", tr_detail=f"over embshard's memory cap: {str(e).splitlines()[0]}")
    if es_plan:
        tr_ms, why = torchrec_model_ms(es_plan)
        row.update(es_wall_s=es["wall_s"], es_es_ms=es_plan.max_rank_ms, es_tr_ms=tr_ms, es_tr_why=why,
                   lower_bound_ms=es_plan.lower_bound_ms, es_gap=es_plan.gap, es_mix=layout_mix(es_plan),
                   es_method=es_plan.search.get("method", ""), es_commit=es.get("commit"))
        if tr_ms is None and runnable and runnable["status"] == "ok":
            runnable_plan = ShardingPlan.from_dict(runnable["plan"])
            row.update(es_tr_ms=torchrec_model_ms(runnable_plan)[0], es_tr_fallback=True,
                       runnable_es_ms=runnable_plan.max_rank_ms, runnable_mix=layout_mix(runnable_plan),
                       runnable_wall_s=runnable["wall_s"])
    if tr_plan:
        row.update(tr_wall_s=tr["wall_s"], tr_es_ms=tr_plan.max_rank_ms, tr_tr_ms=tr["torchrec_rating_ms"],
                   tr_gap=tr_plan.max_rank_ms / tr_plan.lower_bound_ms - 1, tr_mix=layout_mix(tr_plan))
        check_ms, _ = torchrec_model_ms(tr_plan)
        row["tr_rating_check"] = None if check_ms is None else check_ms / tr["torchrec_rating_ms"] - 1
    if es_plan and tr_plan:
        # CPU seconds when both runs recorded them: on a shared machine wall time mostly
        # measures the other processes
        if "cpu_s" in tr and "cpu_s" in es:
            row.update(es_cpu_s=es["cpu_s"], tr_cpu_s=tr["cpu_s"], speedup=tr["cpu_s"] / es["cpu_s"], speedup_basis="cpu")
        else:
            row.update(speedup=tr["wall_s"] / es["wall_s"], speedup_basis="wall")
        row["reduction_es"] = 1 - row["es_es_ms"] / row["tr_es_ms"]
        if row["es_tr_ms"] is not None:
            row["reduction_tr"] = 1 - row["es_tr_ms"] / row["tr_tr_ms"]
    return row


def fmt(value, spec: str = ".4f", missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


COLUMNS = (
    ("case", "case", "s"), ("hbm GiB", "hbm_gib", ".2f"),
    ("embshard ms (es model)", "es_es_ms", ".4f"), ("TorchRec ms (es model)", "tr_es_ms", ".4f"), ("lower (es)", "reduction_es", "+.1%"),
    ("embshard ms (TR model)", "es_tr_ms", ".4f"), ("TorchRec ms (TR model)", "tr_tr_ms", ".4f"), ("lower (TR)", "reduction_tr", "+.1%"),
    ("embshard s", "es_wall_s", ".2f"), ("TorchRec s", "tr_wall_s", ".1f"),
    ("embshard cpu s", "es_cpu_s", ".2f"), ("TorchRec cpu s", "tr_cpu_s", ".1f"), ("speedup", "speedup", ".1f"), ("by", "speedup_basis", "s"),
    ("gap LB embshard", "es_gap", ".1%"), ("gap LB TorchRec", "tr_gap", ".1%"),
)


def cell(row: dict, key: str, spec: str) -> str:
    if key == "tr_tr_ms" and row.get("tr_status") != "ok":
        return row.get("tr_status", "n/a")
    if key == "es_es_ms" and row.get("es_status") != "ok":
        return row.get("es_status", "n/a")
    value = row.get(key)
    if key == "es_tr_ms" and row.get("es_tr_fallback"):
        return fmt(value, spec) + " †"
    return (value or "n/a") if spec == "s" else fmt(value, spec)


def summary(rows: list[dict]) -> list[str]:
    both = [r for r in rows if "reduction_es" in r]
    lines = [f"- cases with both plans: {len(both)} of {len(rows)}"]
    if not both:
        return lines
    tr_rows = [r for r in both if "reduction_tr" in r]
    lines.append(f"- embshard lower under embshard's model: {sum(r['reduction_es'] > 0 for r in both)} of {len(both)}; "
                 f"mean {sum(r['reduction_es'] for r in both) / len(both):+.1%}")
    if tr_rows:
        lines.append(f"- embshard lower under TorchRec's estimator: {sum(r['reduction_tr'] > 0 for r in tr_rows)} of {len(tr_rows)}; "
                     f"mean {sum(r['reduction_tr'] for r in tr_rows) / len(tr_rows):+.1%}")
    speedups = sorted(r["speedup"] for r in both)
    lines.append(f"- planning speedup: min {speedups[0]:.1f}x, median {speedups[len(speedups) // 2]:.1f}x, max {speedups[-1]:.1f}x")
    for r in rows:
        if r.get("es_tr_why"):
            scored = (f"† scores embshard's torchrec_compatible plan instead ({r['runnable_mix']}; embshard model "
                      f"{r['runnable_es_ms']:.4f} ms vs {r['es_es_ms']:.4f} ms unconstrained, planned in {r['runnable_wall_s']:.2f} s)"
                      if r.get("es_tr_fallback")
                      else "TorchRec's estimator cannot score it")
            lines.append(f"- {r['case']}: TorchRec cannot run embshard's plan ({r['es_tr_why'].split('. To export')[0]}); {scored}")
        check = r.get("tr_rating_check")
        if check is not None and abs(check) > 1e-9:
            lines.append(f"- {r['case']}: torchrec_estimate of TorchRec's own plan differs from its planner's rating by {check:+.2e}")
        for side in ("es", "tr"):
            if r.get(f"{side}_status") not in ("ok", None):
                lines.append(f"- {r['case']}: {'embshard' if side == 'es' else 'TorchRec'} {r[f'{side}_status']}: "
                             f"{r[f'{side}_detail'].split(' ShardingOptionGroup(')[0][:300]}")
    return lines


def print_rich(rows: list[dict]) -> None:
    table = Table(title="embshard vs TorchRec: max-rank step time (ms) under both cost models, planning wall time")
    for title, _, _ in COLUMNS:
        table.add_column(title, justify="left" if title == "case" else "right")
    for r in rows:
        table.add_row(*(cell(r, key, spec) for _, key, spec in COLUMNS))
    console = Console(width=250)
    console.print(table)
    for line in summary(rows):
        console.print(line, markup=False)


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    cpu = cpu_model()
    out = [
        "# Planner vs TorchRec", "",
        f"- date: {datetime.date.today().isoformat()}; machine: {cpu}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores, no GPU",
        f"- command: `{COMMAND}`; embshard plans made at commit "
        f"{', '.join(sorted({r['es_commit'] for r in rows if r.get('es_commit')})) or 'unknown'}",
        f"- topology: W ranks, {LOCAL_WORLD_SIZE} per host, embshard cuda defaults (HBM 1500, NVLink 150, NIC 25 GB/s), "
        f"batch 512 per rank; memory per rank = {HEADROOM} x (weights + optimizer state) / W / (1 - 0.1 reserved)",
        f"- embshard: `plan(specs, topology)` with time_budget_s={args.embshard_budget_s:g}; TorchRec: "
        f"EmbeddingShardingPlanner (compute_device cuda, fused/dense kernels, FixedPercentageStorageReservation(0.1)), "
        f"timeout_seconds={args.torchrec_search_s}, killed after {args.torchrec_limit_s:g} s",
        "- 'lower' = 1 - embshard / TorchRec (positive: embshard's plan is faster); gap = plan / embshard's lower bound - 1 "
        "(embshard's model); TorchRec's own plan under its model is its planner's rating",
        "- †: TorchRec cannot run embshard's plan (row_wise over part of the ranks, or table_row_wise over part of a host), "
        "so its estimator cannot score it; the value is embshard's plan with `torchrec_compatible=True` (row_wise over all "
        "ranks, table_row_wise over whole hosts only), which TorchRec can run", "",
        "| " + " | ".join(title for title, _, _ in COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    out += ["| " + " | ".join(str(cell(r, key, spec)) for _, key, spec in COLUMNS) + " |" for r in rows]
    out += ["", "Layouts (tables per sharding type):", "", "| case | embshard | embshard torchrec_compatible (†) | TorchRec |", "|---|---|---|---|"]
    out += [f"| {r['case']} | {r.get('es_mix', '')} | {r.get('runnable_mix', '')} | {r.get('tr_mix', '')} |" for r in rows]
    out += ["", "## Summary", ""] + summary(rows)
    return "\n".join(out) + "\n"


def keep_hand_written(text: str, path: Path) -> str:
    """Carry over the ANALYSIS_HEADING section (written by hand) of an existing results file."""
    old = path.read_text() if path.exists() else ""
    return text + ("\n" + old[old.index(ANALYSIS_HEADING):] if ANALYSIS_HEADING in old else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--world-sizes", nargs="+", type=int, default=list(WORLD_SIZES))
    parser.add_argument("--embshard-budget-s", type=float, default=10.0)
    parser.add_argument("--torchrec-search-s", type=int, default=240, help="TorchRec's own timeout_seconds")
    parser.add_argument("--torchrec-limit-s", type=float, default=600.0, help="wall-clock kill limit per TorchRec run")
    parser.add_argument("--cache", type=Path, default=REPO / "outputs" / "bench" / "planner_vs_torchrec.json")
    parser.add_argument("--rerun-embshard", action="store_true", help="replan embshard, keep cached TorchRec results")
    parser.add_argument("--fresh", action="store_true", help="ignore the cache")
    parser.add_argument("--markdown", type=Path, help="also write the results as markdown here")
    parser.add_argument("--torchrec-child", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torchrec_child:
        torchrec_child(*args.torchrec_child)
        return
    cache = {} if args.fresh or not args.cache.exists() else json.loads(args.cache.read_text())
    rows = []
    for workload in args.workloads:
        specs = load_workload(workload)
        for world_size in args.world_sizes:
            topo = case_topology(specs, world_size)
            key = f"{workload}/W{world_size}/{case_key(specs, topo)}"
            entry = cache.get(key, {})
            if "embshard" not in entry or args.rerun_embshard:
                entry["embshard"] = run_embshard(specs, topo, args.embshard_budget_s)
            es = entry["embshard"]
            if es["status"] == "ok" and torchrec_model_ms(ShardingPlan.from_dict(es["plan"]))[0] is None:
                if "embshard_runnable" not in entry or args.rerun_embshard:
                    entry["embshard_runnable"] = run_embshard(specs, topo, args.embshard_budget_s, torchrec_compatible=True)
            else:
                entry.pop("embshard_runnable", None)
            if "torchrec" not in entry:
                print(f"{workload} W={world_size}: TorchRec planning (up to {args.torchrec_limit_s:g} s) ...", flush=True)
                entry["torchrec"] = run_torchrec(specs, topo, args.torchrec_limit_s, args.torchrec_search_s)
            cache[key] = entry
            args.cache.parent.mkdir(parents=True, exist_ok=True)
            args.cache.write_text(json.dumps(cache))
            rows.append(score(workload, specs, topo, entry))
            print(f"{workload} W={world_size}: embshard {entry['embshard']['status']}, TorchRec {entry['torchrec']['status']}", flush=True)
    print_rich(rows)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(keep_hand_written(markdown(rows, args), args.markdown))


if __name__ == "__main__":
    main()
