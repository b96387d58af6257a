"""embshard-stats: pooling factors and access skew measured from the training data; needs no torch.

    embshard-stats tables=criteo_small data=synthetic num_samples=200000 out=measured/tables/mine.yaml
    embshard-plan --config-dir measured tables=mine

A Hydra app over embshard/configs/stats.yaml (groups tables/, data/ as embshard-train composes them).
It reads the first ``num_samples`` training samples with a progress bar, prints a summary per
table and writes ``out``: the tables file with each table's measured ``pooling_factor`` and
``hot_rows`` (and the file's ``topology:`` block, if it had one); with ``hot_ids=PATH.npz`` also each
table's hottest ids, hottest first (what embshard-plan hot_ids=PATH may replicate). Bad input ends with exit
status 2 and one line on stderr, ``embshard-stats: error: ...``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from embshard.cli import CONFIG_DIR, fail, run_hydra_app
from embshard.data.config import register_data_schemas
from embshard.schema import value_of
from embshard.specs import TableSpec, tables_from_list
from embshard.stats.hot_ids import write_hot_ids
from embshard.stats.measure import TableStats, measure, measured_spec

PROG = "embshard-stats"
CONFIG_KEYS = ("tables", "topology", "data", "num_samples", "batch_size", "exact_max_rows", "sketch_rows", "fractions", "out", "hot_ids")

register_data_schemas()  # the typed schemas of the data/ options (embshard/configs/data/*.yaml start from /schema/data/NAME)


def run(cfg: DictConfig, tables_option: str, data_option: str, console: Console) -> None:
    raw = OmegaConf.to_container(cfg, resolve=True)
    where = f"tables={tables_option} ({tables_option}.yaml)"
    if isinstance(raw.get("tables"), Mapping):
        raise ValueError(f"{where}: the file's blocks landed under 'tables'; make '# @package _global_' its first line")
    unknown = sorted(set(raw) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown top-level key(s) {unknown}; a tables file holds 'tables:' and 'topology:'")
    specs = tables_from_list(raw["tables"], f"{where}: tables")
    data = value_of(OmegaConf.to_object(cfg.data))
    options = {key: _positive_int(raw[key], key) for key in ("num_samples", "batch_size", "exact_max_rows", "sketch_rows")}
    fractions = _fractions(raw["fractions"])
    out = Path(raw["out"])
    if out.suffix not in (".yaml", ".yml"):
        raise ValueError(f"out: must be a .yaml path (DIR/tables/NAME.yaml, then embshard-plan --config-dir DIR tables=NAME), got {str(out)!r}")
    hot_ids = Path(raw["hot_ids"]) if raw.get("hot_ids") else None
    if hot_ids is not None and hot_ids.suffix != ".npz":
        raise ValueError(f"hot_ids: must be a .npz path (then embshard-plan hot_ids=PATH), got {str(hot_ids)!r}")

    console.print(f"measuring {len(specs)} tables over {options['num_samples']:,} samples of data={data_option}",
                  markup=False, highlight=False)
    t0 = time.perf_counter()
    with tqdm(total=options["num_samples"], unit="samples", unit_scale=True, desc=PROG, leave=False) as bar:
        stats = measure(specs, data, options["num_samples"], options["batch_size"],
                        exact_max_rows=options["exact_max_rows"], sketch_rows=options["sketch_rows"],
                        fractions=fractions, progress=bar.update)
    seconds = time.perf_counter() - t0
    measured = [measured_spec(s, stats[s.name]) for s in specs]
    console.print(summary_table(list(stats.values())))
    samples = next(iter(stats.values())).num_samples
    console.print(f"{samples:,} samples in {seconds:.1f} s ({samples / max(seconds, 1e-9):,.0f} samples/s)",
                  markup=False, highlight=False)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(tables_file_text(measured, raw.get("topology"), f"data={data_option}, {samples:,} samples, tables={tables_option}"))
    except OSError as e:
        raise ValueError(f"out={out}: cannot write the tables file ({e.strerror or e}); choose a writable path") from None
    if hot_ids is not None:
        try:
            hot_ids.parent.mkdir(parents=True, exist_ok=True)
            write_hot_ids(hot_ids, {name: s.hottest_ids for name, s in stats.items()})
        except OSError as e:
            raise ValueError(f"hot_ids={hot_ids}: cannot write the hot-ids file ({e.strerror or e}); choose a writable path") from None
        console.print(f"wrote {hot_ids} (then: embshard-plan ... hot_ids={hot_ids})", markup=False, highlight=False)
    hint = f"embshard-plan --config-dir {out.parent.parent} tables={out.stem}" if out.parent.name == "tables" else \
        f"move it to DIR/tables/ and run embshard-plan --config-dir DIR tables={out.stem}"
    console.print(f"wrote {out} (then: {hint})", markup=False, highlight=False)


def summary_table(stats: Sequence[TableStats]) -> Table:
    fractions = [f for f, _ in stats[0].hot_rows] if stats else []
    table = Table(title="access statistics per table")
    for column in ("table", "rows", "features", "pooling factor", "std", "empty bags", "distinct rows", "counts"):
        table.add_column(column, justify="left" if column in ("table", "counts") else "right")
    for f in fractions:
        table.add_column(f"top {f:.1%}".replace(".0%", "%"), justify="right")
    for s in stats:
        table.add_row(s.name, f"{s.num_rows:,}", str(s.num_features), f"{s.pooling_factor:.3f}", f"{s.pooling_std:.3f}",
                      f"{s.empty_bag_share:.1%}", f"{s.distinct_rows:,.0f} ({s.distinct_rows / s.num_rows:.0%})", s.method,
                      *(f"{lookups:.1%}" for _, lookups in s.hot_rows))
    return table


def tables_file_text(specs: Sequence[TableSpec], topology: Any, source: str) -> str:
    """A tables file like embshard/configs/tables/NAME.yaml (Hydra's '# @package _global_' first), one table a line."""
    lines = ["# @package _global_", f"# Measured by embshard-stats ({source}): pooling_factor and hot_rows",
             "# ([fraction_of_rows, fraction_of_lookups], hottest rows first) of every table.", "tables:"]
    for spec in specs:
        row = spec.to_dict()
        row["pooling_factor"] = round(row["pooling_factor"], 4)
        row["hot_rows"] = [[round(rows, 6), round(lookups, 6)] for rows, lookups in row["hot_rows"]]
        lines.append("  - " + yaml.safe_dump(row, default_flow_style=True, sort_keys=False, width=math.inf).strip())
    if topology:
        lines.append(yaml.safe_dump({"topology": topology}, sort_keys=False).strip())
    return "\n".join(lines) + "\n"


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{key}: must be a positive integer, got {value!r}")
    return value


def _fractions(value: Any) -> tuple[float, ...]:
    how = "give increasing fractions of the rows in (0, 1], e.g. fractions=[0.001,0.01,0.1,0.5]"
    if not isinstance(value, list) or not value or not all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in value):
        raise ValueError(f"fractions: expected a non-empty list of numbers, got {value!r}; {how}")
    if not all(0 < f <= 1 for f in value) or any(b <= a for a, b in zip(value, value[1:])):
        raise ValueError(f"fractions: {value} are not increasing within (0, 1]; {how}")
    return tuple(float(f) for f in value)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="stats")
def hydra_main(cfg: DictConfig) -> None:
    console = Console()
    if not console.is_terminal:  # piped or captured: keep the summary's columns whole
        console = Console(width=200)
    choices = HydraConfig.get().runtime.choices
    try:
        run(cfg, choices.get("tables", "?"), choices.get("data", "?"), console)
    except (ValueError, OmegaConfBaseException) as e:
        fail(PROG, str(e))


def main() -> None:
    run_hydra_app(PROG, hydra_main)


if __name__ == "__main__":
    main()
