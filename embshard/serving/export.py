"""Export a training run as a serving artifact: plan for the serving ranks, reshard, quantize, checksum.

    settings = ExportSettings(checkpoint=Path("outputs/train/RUN"), out=Path("artifact"), world_size=2, dtype="int8")
    export(settings)        # what embshard-export does (embshard/serving/export_cli.py)

Reads the run's config.yaml (tables and model, through the train app's own code) and its
DCP checkpoint (the latest step, or the step folder given; every file it reads verified
against the checksums it was written with), plans the tables for
``world_size`` serving ranks with the planner in inference mode (forward only, weights in
their serving dtype; it replicates every table that fits, for local look-ups, unless
``split``), then reads one table at a time, cuts it into the plan's blocks,
quantizes each block (embshard.serving.quantize) and writes the artifact described in
embshard.serving.artifact. Hot rows: a table the run trained with hot rows (its plan.json's
``hot_rows``, the ids from its ``hot_ids_file``) keeps them wherever the serving plan shards it
(not under ``split``, nor where it replicates the whole table): its ``NAME@hot`` block (the
rows at the sorted hot ids) goes to every rank and the ids into the artifact's hot_ids.npz.
Everything is written into a temporary folder next to ``out`` and renamed at the end, so a
failed export leaves nothing that looks like an artifact.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed.checkpoint as dcp
import yaml
from torch import Tensor
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from embshard import planner
from embshard.data.batch import NUM_DENSE
from embshard.fsutil import swap_in
from embshard.models.config import DLRMConfig
from embshard.planner.plan import ShardingPlan
from embshard.planner.types import Constraints, ShardingType, TableConstraint
from embshard.runtime.lookup import TORCH_DTYPE
from embshard.runtime.hot_rows import HOT, hot_id_sets
from embshard.serving.artifact import (DENSE_FILE, HOT_IDS_FILE, MODEL_FILE, PLAN_FILE, ModelInfo, block_tensors,
                                       model_config, rank_file, save_tensors, write_manifest)
from embshard.serving.quantize import quantize
from embshard.specs import DTYPE_BYTES, TableSpec
from embshard.stats.hot_ids import write_hot_ids
from embshard.topology import Topology
from embshard.train import checkpoint
from embshard.train.config import run_specs

TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class ExportSettings:
    """What embshard-export takes (configs/export.yaml documents each)."""

    checkpoint: Path  # an embshard-train out_dir, its checkpoints folder, or one step_NNNNNN folder
    out: Path  # the artifact folder to write
    world_size: int = 2  # serving ranks
    dtype: str = "fp32"  # every table's serving dtype ...
    table_dtypes: Mapping[str, str] = field(default_factory=dict)  # ... except these (table -> dtype)
    hbm_gib: float = 16.0  # memory per serving rank
    batch_size_per_rank: int = 512  # serving batch per rank the planner costs
    time_budget_s: float = 2.0  # planner search time
    overwrite: bool = False  # replace an existing artifact at ``out``
    split: bool = False  # no table replicated (data_parallel): every rank holds only its shards
    # {tables: {NAME: {sharding_types: [...], ranks: [...]}}, keep_together: [[A, B]]}, as embshard-plan takes them
    constraints: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("world_size", "batch_size_per_rank"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key}: must be a positive integer, got {value!r}")
        for key in ("hbm_gib", "time_budget_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key}: must be positive, got {getattr(self, key)!r}")


@dataclass(frozen=True)
class TrainingRun:
    """What export needs of a training run."""

    step_dir: Path  # the DCP checkpoint read
    step: int
    specs: tuple[TableSpec, ...]  # as trained
    model: DLRMConfig
    topology: Mapping[str, Any]  # the run's topology (bandwidths and calibrated terms carry over)
    hot_ids: Mapping[str, Tensor] = field(default_factory=dict)  # table -> its sorted hot ids, as the run trained them


def find_run(path: Path) -> TrainingRun:
    """The run behind ``path`` (out_dir, checkpoints folder or step folder), its files verified against their
    checksums; ValueError says what is missing or damaged."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"checkpoint={path}: no such folder; give an embshard-train out_dir, its checkpoints folder "
                         "or a step_NNNNNN folder")
    if (path / "config.yaml").exists():
        run_dir = path
        raw = _read_config(run_dir)
        step_dir = checkpoint.resolve(Path(raw["checkpoint"]["dir"] or run_dir / "checkpoints"), "checkpoint")
    else:
        step_dir = checkpoint.resolve(path, "checkpoint")
        run_dir = step_dir.parent.parent
        if not (run_dir / "config.yaml").exists():
            raise ValueError(f"checkpoint={path}: no config.yaml in {run_dir}; give the out_dir of the embshard-train run, "
                             "which holds the run's config.yaml next to its checkpoints")
        raw = _read_config(run_dir)
    info = checkpoint.read_info(step_dir)
    try:
        model = model_config(raw["model"], f"{run_dir}/config.yaml: model")
        specs = run_specs(raw["tables"], model, raw["optim"]["table_optimizer"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{run_dir}/config.yaml: not an embshard-train config (missing {e}); point checkpoint= at a run "
                         "written by embshard-train") from None
    saved = {t["name"]: (t["num_embeddings"], t["embedding_dim"]) for t in info["tables"]}
    if saved != {s.name: (s.num_embeddings, s.embedding_dim) for s in specs}:
        raise ValueError(f"checkpoint {step_dir}: its tables {sorted(saved)} do not match {run_dir}/config.yaml's; "
                         "the checkpoint belongs to another run")
    checkpoint.verify_files(step_dir, info, with_rank_files=False)  # before anything is read or written
    return TrainingRun(step_dir, int(info["step"]), specs, model, raw["topology"], trained_hot_ids(run_dir))


def trained_hot_ids(run_dir: Path) -> dict[str, Tensor]:
    """table -> sorted hot ids of the run's plan (run_dir/plan.json; none without one, as after an unsharded run)."""
    path = run_dir / "plan.json"
    if not path.exists():
        return {}
    try:
        plan = ShardingPlan.load(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a readable plan ({e}); export needs the plan the run trained with") from None
    return hot_id_sets(plan.specs, plan, None, f"{path} (the run's plan)")


def _read_config(run_dir: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{run_dir}/config.yaml: unreadable ({e}); export needs the run's config") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{run_dir}/config.yaml: not a mapping; export needs the config embshard-train wrote")
    return raw


def serving_specs(specs: tuple[TableSpec, ...], dtype: str, table_dtypes: Mapping[str, str]) -> tuple[TableSpec, ...]:
    """The tables in their serving dtypes; ValueError for an unknown dtype or table."""
    allowed = sorted(DTYPE_BYTES)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype: must be one of {allowed}, got {dtype!r}")
    names = [s.name for s in specs]
    for table, d in table_dtypes.items():
        if table not in names:
            raise ValueError(f"table_dtypes.{table}: no such table; the run's tables are {names}")
        if d not in DTYPE_BYTES:
            raise ValueError(f"table_dtypes.{table}: must be one of {allowed}, got {d!r}")
    return tuple(replace(s, dtype=table_dtypes.get(s.name, dtype)) for s in specs)


def serving_plan(run: TrainingRun, settings: ExportSettings) -> ShardingPlan:
    """The inference-mode plan of the serving tables on ``settings.world_size`` ranks of one host."""
    specs = serving_specs(run.specs, settings.dtype, settings.table_dtypes)
    topology = Topology.from_dict({**run.topology, "world_size": settings.world_size,
                                   "local_world_size": settings.world_size, "hbm_gib": settings.hbm_gib,
                                   "batch_size_per_rank": settings.batch_size_per_rank,
                                   # serving replicas look up their own rank's samples only
                                   "replicated_dp_lookup": False}, "serving topology")
    constraints = Constraints.from_dict(settings.constraints, [s.name for s in specs], settings.world_size)
    if settings.split:
        constraints = without_replicas(constraints, [s.name for s in specs])
    plan = planner.plan(specs, topology, constraints, time_budget_s=settings.time_budget_s, inference=True)
    hot = {} if settings.split else {name: ids for name, ids in run.hot_ids.items()
                                     if plan.placement(name).sharding_type is not ShardingType.DATA_PARALLEL}
    if not hot:
        return plan
    placements = [replace(t, hot_rows=hot[t.name].numel() if t.name in hot else 0) for t in plan.tables]
    return planner.evaluate(specs, topology, placements, constraints, lower_bound=plan.lower_bound_ms, search=plan.search,
                            inference=True, hot_ids_file=HOT_IDS_FILE)


def without_replicas(constraints: Constraints, tables: list[str]) -> Constraints:
    """``constraints`` with data_parallel taken out of every table's sharding types (``split=true``)."""
    per_table = {}
    for name in tables:
        allowed = constraints.for_table(name)
        types = tuple(t for t in allowed.sharding_types if t is not ShardingType.DATA_PARALLEL)
        if not types:
            raise ValueError(f"split: constraints.tables.{name} allows only data_parallel (a replica on every rank); "
                             "drop split=true or allow another sharding type")
        per_table[name] = TableConstraint(types, allowed.ranks)
    return replace(constraints, tables=per_table)


def export(settings: ExportSettings) -> Path:
    """Write the artifact to ``settings.out``; returns it. ValueError (nothing written) for bad input."""
    out = Path(settings.out)
    if out.exists() and not settings.overwrite:
        raise ValueError(f"out={out}: already exists; choose another folder or pass overwrite=true")
    run = find_run(settings.checkpoint)
    plan = serving_plan(run, settings)
    parent = out.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(os.path.join(parent, f"{TMP_PREFIX}{out.name}-{os.getpid()}"))
        tmp.mkdir()
    except OSError as e:
        raise ValueError(f"out={out}: cannot create it ({e.strerror}); choose a writable folder") from None
    try:
        _write(tmp, run, plan, settings)
        write_manifest(tmp, settings.world_size)
        swap_in(tmp, out, parent / f"{TMP_PREFIX}old-{out.name}-{os.getpid()}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write(folder: Path, run: TrainingRun, plan: ShardingPlan, settings: ExportSettings) -> None:
    W = settings.world_size
    per_rank: list[dict[str, Tensor]] = [{} for _ in range(W)]
    for spec in plan.specs:  # one table in memory at a time (its blocks stay, quantized)
        table = read_table(run.step_dir, spec.name, (spec.num_embeddings, spec.embedding_dim),
                           next(s.dtype for s in run.specs if s.name == spec.name))
        placement = plan.placement(spec.name)
        for shard in placement.shards:
            block = quantize(table[shard.row_offset:shard.row_offset + shard.num_rows,
                                   shard.col_offset:shard.col_offset + shard.num_cols], spec.dtype)
            ranks = range(W) if placement.sharding_type is ShardingType.DATA_PARALLEL else (shard.rank,)
            for r in ranks:
                per_rank[r].update(block_tensors(spec.name, block))
            if placement.sharding_type is ShardingType.DATA_PARALLEL:
                break  # every replica holds the same full block
        if placement.hot_rows:  # the replica of the hot rows, on every rank
            block = quantize(table.index_select(0, run.hot_ids[spec.name]), spec.dtype)
            for tensors in per_rank:
                tensors.update(block_tensors(spec.name + HOT, block))
    hot = {t.name: run.hot_ids[t.name].numpy() for t in plan.tables if t.hot_rows}
    if hot:
        write_hot_ids(folder / HOT_IDS_FILE, hot)
    for r, tensors in enumerate(per_rank):
        save_tensors(tensors, folder / rank_file(r))
    save_tensors(read_dense(run.step_dir), folder / DENSE_FILE)
    plan.save(folder / PLAN_FILE)
    source = {"checkpoint": str(run.step_dir.absolute()), "step": run.step}
    (folder / MODEL_FILE).write_text(ModelInfo(run.model, plan.specs, NUM_DENSE, source).to_json())


def read_table(step_dir: Path, name: str, shape: tuple[int, int], dtype: str) -> Tensor:
    """One table's full weights (fp32) from a DCP checkpoint, without reading the others."""
    return _read(step_dir, {f"tables.{name}.weight": torch.empty(shape, dtype=TORCH_DTYPE[dtype])})[f"tables.{name}.weight"].float()


def read_dense(step_dir: Path) -> dict[str, Tensor]:
    """The dense parameters (name -> tensor) of a DCP checkpoint."""
    shapes = checkpoint.read_info(step_dir)["dense"]
    loaded = _read(step_dir, {f"dense.{n}": torch.empty(shape) for n, shape in shapes.items()})
    return {n: loaded[f"dense.{n}"].contiguous() for n in shapes}


def _read(step_dir: Path, dest: dict[str, Tensor]) -> dict[str, Tensor]:
    metadata = checkpoint.read_metadata(step_dir)
    for key, tensor in dest.items():
        entry = metadata.state_dict_metadata.get(key)
        if not isinstance(entry, TensorStorageMetadata) or list(entry.size) != list(tensor.shape) \
                or entry.properties.dtype != tensor.dtype:
            raise ValueError(f"checkpoint {step_dir}: no {tensor.dtype} tensor {key} of shape {list(tensor.shape)}; the "
                             "checkpoint is incomplete or from another run")
    try:
        dcp.load(dest, storage_reader=checkpoint.SafeReader(step_dir), no_dist=True)
    except (Exception, CheckpointException) as e:  # DCP wraps read failures (truncated or corrupt files)
        raise ValueError(f"checkpoint {step_dir}: cannot read {next(iter(dest))}, the files are corrupt or truncated "
                         f"({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]})") from None
    return dest
