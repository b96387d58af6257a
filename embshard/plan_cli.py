"""embshard-plan: a dry run of the sharding planner; needs no GPU.

    embshard-plan tables=criteo_tb topology.world_size=64 topology.local_world_size=8 topology.hbm_gib=16 out=plan.json
    embshard-plan tables_file=my_tables.yaml topology.world_size=16   # a plain YAML file anywhere
    embshard-plan --config-dir my_configs tables=mine      # my_configs/tables/mine.yaml

A Hydra app over embshard/configs/plan.yaml (groups tables/, topology/, planner/). It prints the
predicted load of every rank and a summary, writes the plan to `out` (JSON) and a chart of
per-rank load and memory beside it (`.png`). ``--multirun`` sweeps overrides (what-if runs,
e.g. ``topology.world_size=256,512,1024 topology.hbm_gib=16,32``): one line per run and a
table of them (embshard.plan_sweep). Bad input ends with exit status 2 and one
line on stderr, ``embshard-plan: error: ...``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console

from embshard import plan_sweep, planner
from embshard.cli import CONFIG_DIR, fail, run_hydra_app
from embshard.extras import MissingExtra, require
from embshard.planner.footprint import PlannerMemoryError
from embshard.planner.cost.hot_rows import hot_row_counts
from embshard.planner.report import rank_table, save_chart, summary
from embshard.comms import CommsPrecision
from embshard.planner.types import Constraints
from embshard.specs import tables_from_list
from embshard.stats.hot_ids import read_hot_ids
from embshard.tables_option import with_tables_file
from embshard.topology import Topology

CONFIG_KEYS = ("tables", "tables_file", "topology", "constraints", "planner", "out", "max_report_ranks", "measure", "measure_steps",
               "hot_ids")
PLANNER_KEYS = ("time_budget_s", "use_ilp", "ilp_time_s", "torchrec_compatible", "comms")
PROG = "embshard-plan"


def run(cfg: Mapping[str, Any], tables_option: str, console: Console, sweep_job: tuple[Path, int, list[str]] | None = None) -> None:
    """Plan the composed config, print the report, write the JSON and the chart.

    sweep_job (--multirun): (sweep dir, job number, overrides): the plan goes to the job's
    folder and the run is one summary line and a row of the sweep table (embshard.plan_sweep)."""
    where = f"tables_file={cfg['tables_file']}" if cfg.get("tables_file") else f"tables={tables_option} ({tables_option}.yaml)"
    if isinstance(cfg.get("tables"), Mapping):
        raise ValueError(f"{where}: the file's blocks landed under 'tables'; make '# @package _global_' its first line")
    if "tables" not in cfg:
        raise ValueError(f"{where}: no top-level 'tables:' list in the file")
    unknown = sorted(set(cfg) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown top-level key(s) {unknown}; a tables file holds 'tables:', 'topology:' and 'constraints:'")
    specs = tables_from_list(cfg["tables"], f"{where}: tables")
    topology = Topology.from_dict(cfg["topology"])
    constraints = Constraints.from_dict(cfg["constraints"], [s.name for s in specs], topology.world_size)
    options = planner_options(cfg["planner"])
    max_ranks = cfg["max_report_ranks"]
    if isinstance(max_ranks, bool) or not isinstance(max_ranks, int) or max_ranks < 2:
        raise ValueError(f"max_report_ranks: must be an integer >= 2 (the slowest and the fastest rank), got {max_ranks!r}")
    if not isinstance(cfg["measure"], bool):
        raise ValueError(f"measure: must be true or false, got {cfg['measure']!r}")
    if cfg["measure"]:
        require("measure=true", "torch")  # before planning: it runs the plan on local ranks
    steps = cfg["measure_steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"measure_steps: must be a positive integer, got {steps!r}")
    out = Path(cfg["out"])
    if out.suffix != ".json":
        raise ValueError(f"out: must be a path ending in .json (the chart goes beside it as .png), got {str(out)!r}")
    chart = out.with_suffix(".png")
    if cfg.get("hot_ids"):
        options["hot_ids_file"] = checked_hot_ids(specs, cfg["hot_ids"])
    if sweep_job is not None:
        _sweep_run(specs, topology, constraints, options, out.name, sweep_job, console)
        return

    ilp = f"ilp up to {options['ilp_time_s']:g} s more" if options["use_ilp"] else "ilp off"
    console.print(f"planning {len(specs)} tables on {topology.world_size} ranks "
                  f"(search {options['time_budget_s']:g} s, {ilp})", markup=False)
    t0 = time.perf_counter()
    result = planner.plan(specs, topology, constraints, **options)
    planning_s = time.perf_counter() - t0
    try:
        result.save(out)
        save_chart(result, chart)
    except OSError as e:
        raise ValueError(f"out={out}: cannot write the plan ({e.strerror or e}); choose a writable path") from None
    console.print(rank_table(result, max_ranks))
    console.print(summary(result, planning_s), markup=False, highlight=False)
    console.print(f"wrote {out} and {chart}", markup=False, highlight=False)
    if cfg["measure"]:  # run the plan on local ranks: measured time by phase next to the prediction
        from embshard.calibrate.report import measure_report
        try:
            measure_report(result, steps, console)
        except RuntimeError as e:
            raise ValueError(f"measure: {e}") from None


def _sweep_run(specs, topology: Topology, constraints: Constraints, options: dict[str, Any], out_name: str,
               sweep_job: tuple[Path, int, list[str]], console: Console) -> None:
    sweep_dir, job, overrides = sweep_job
    t0 = time.perf_counter()
    try:
        result = planner.plan(specs, topology, constraints, **options)
    except (planner.PlanInfeasibleError, PlannerMemoryError) as e:  # a row of the table; the sweep goes on
        row = plan_sweep.infeasible_row(job, overrides, topology.world_size, topology.hbm_gib, str(e))
    else:
        out = sweep_dir / str(job) / out_name
        result.save(out)
        row = plan_sweep.plan_row(job, overrides, result, time.perf_counter() - t0, out)
    table = plan_sweep.add_row(sweep_dir, row)
    console.print(f"{plan_sweep.summary_line(row)} (table: {table})", markup=False, highlight=False, soft_wrap=True)


def checked_hot_ids(specs, path: str) -> str:
    """The absolute path of a hot-ids file that ranks enough ids of every table with a measured curve."""
    rankings = read_hot_ids(path, f"hot_ids={path}")
    for spec in specs:
        if spec.hot_rows is None:
            continue
        need = hot_row_counts(spec)[-1]
        have = len(rankings.get(spec.name, ()))
        if have < need:
            raise ValueError(f"hot_ids={path}: table {spec.name!r} has {have} ranked ids, the planner may replicate "
                             f"{need}; re-run embshard-stats hot_ids= on these tables (with sketch_rows >= {need})")
    return str(Path(path).resolve())


def planner_options(raw: Any, where: str = "planner") -> dict[str, Any]:
    """Validate configs/planner/*.yaml: keyword arguments of `embshard.planner.plan`."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping with keys {list(PLANNER_KEYS)}")
    unknown = sorted(set(raw) - set(PLANNER_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed keys are {list(PLANNER_KEYS)}")
    seconds = {}
    for key, default in (("time_budget_s", 10.0), ("ilp_time_s", 1.0)):
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{where}.{key}: must be a positive number of seconds, got {value!r}")
        seconds[key] = float(value)
    flags = {}
    for key, default in (("use_ilp", False), ("torchrec_compatible", False)):
        flags[key] = raw.get(key, default)
        if not isinstance(flags[key], bool):
            raise ValueError(f"{where}.{key}: must be true or false, got {flags[key]!r}")
    return {**seconds, **flags, "comms": CommsPrecision.from_dict(raw.get("comms", {}), f"{where}.comms")}


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="plan")
def hydra_main(cfg: DictConfig) -> None:
    console = Console()
    if not console.is_terminal:  # piped or captured: keep the rank table's columns whole
        console = Console(width=160)
    try:
        raw = OmegaConf.to_container(cfg, resolve=True)
        hc = HydraConfig.get()
        sweep_job = None
        if hc.mode == RunMode.MULTIRUN:
            sweep_job = (Path(hc.sweep.dir), hc.job.num, list(hc.overrides.task))
        run(raw, hc.runtime.choices.get("tables", "?"), console, sweep_job)
    except (ValueError, OmegaConfBaseException, MissingExtra) as e:
        fail(PROG, str(e))


def main() -> None:
    try:
        sys.argv = with_tables_file(sys.argv)
    except ValueError as e:
        fail(PROG, str(e))
    run_hydra_app(PROG, hydra_main)


if __name__ == "__main__":
    main()
