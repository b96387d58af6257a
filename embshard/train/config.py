"""The training run's configuration: Hydra schema (type-checked at start) and the frozen settings.

`TrainConfig` is the structured-config schema behind configs/train.yaml: every key has a
type, so a typo or a wrong type fails at composition with the key named. Group options
merge into their field's schema (components' frozen configs, via `schema_of`); the data
group's options each start from their own schema (``/schema/data/NAME@_here_``).
`settings_from_config` validates the composed config into `TrainSettings`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from embshard.data.config import (CriteoNpyConfig, CriteoTsvConfig, DataConfig, SyntheticConfig, check_files,
                                  register_data_schemas)
from embshard.models.config import DLRMConfig
from embshard.comms import CommsPrecision
from embshard.planner.types import Constraints
from embshard.specs import TableSpec, tables_from_list
from embshard.topology import Topology
from embshard.launch.launcher import LauncherConfig
from embshard.train.optim import OptimConfig
from embshard.schema import schema_of, value_of



@dataclass(frozen=True)
class PlannerConfig:
    """Keyword arguments of `embshard.planner.plan` (configs/planner/)."""

    time_budget_s: float = 10.0
    use_ilp: bool = False
    ilp_time_s: float = 1.0
    torchrec_compatible: bool = False  # only layouts TorchRec's runtime also runs (benchmarks against it)
    comms: CommsPrecision = CommsPrecision()  # wire dtypes: forward, backward, dp_allreduce (fp32, fp16, bf16)


@dataclass(frozen=True)
class EvalConfig:
    every_steps: int = 100  # 0: only after the last step
    # synthetic data: the eval set is the first num_samples samples of its eval split; Criteo files: every
    # sample of data.eval_files / eval_days. Each is evaluated once, whatever the number of ranks.
    num_samples: int = 20_480


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 0  # 0: only after the last step
    dir: str = ""  # "" = <out_dir>/checkpoints
    resume_from: Optional[str] = None  # a step_NNNNNN folder, or a checkpoints folder (its latest step)
    keep_last: int = 2  # older step folders are deleted after a successful save


@dataclass
class ConstraintsConfig:
    # table -> {sharding_types: [...], ranks: [...]}; checked by Constraints.from_dict, which names
    # the key (untyped here so that `+constraints.tables.NAME.sharding_types=[...]` can add a table).
    tables: Dict[str, Any] = field(default_factory=dict)
    keep_together: List[List[str]] = field(default_factory=list)


@dataclass
class TrainConfig:
    tables: List[schema_of(TableSpec)] = MISSING  # type: ignore[valid-type]
    tables_file: Optional[str] = None  # a plain YAML tables file (embshard.tables_option) instead of tables=NAME
    topology: schema_of(Topology) = MISSING  # type: ignore[valid-type]
    constraints: ConstraintsConfig = field(default_factory=ConstraintsConfig)
    planner: schema_of(PlannerConfig) = field(default_factory=schema_of(PlannerConfig))  # type: ignore[valid-type]
    model: schema_of(DLRMConfig) = field(default_factory=schema_of(DLRMConfig))  # type: ignore[valid-type]
    data: Any = MISSING
    optim: schema_of(OptimConfig) = field(default_factory=schema_of(OptimConfig))  # type: ignore[valid-type]
    launcher: schema_of(LauncherConfig) = field(default_factory=schema_of(LauncherConfig))  # type: ignore[valid-type]
    eval: schema_of(EvalConfig) = field(default_factory=schema_of(EvalConfig))  # type: ignore[valid-type]
    checkpoint: schema_of(CheckpointConfig) = field(default_factory=schema_of(CheckpointConfig))  # type: ignore[valid-type]
    steps: int = 300
    seed: int = 0
    log_every_steps: int = 10
    tensorboard: bool = False
    unsharded: bool = False  # one process, TorchRec's modules unsharded (the reference)
    # read the next batch and run its input dist while this one trains (runtime/pipeline.py); None (the default): only
    # where the ranks span more than one host, where it measured faster (on one host slower: README, Training)
    pipeline: Optional[bool] = None
    plan_file: Optional[str] = None  # load this plan.json instead of planning
    out_dir: str = MISSING


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    register_data_schemas()


@dataclass(frozen=True)
class TrainSettings:
    specs: tuple[TableSpec, ...]  # the tables file's, plus the model's sequence table
    topology: Topology
    constraints: Constraints
    planner: PlannerConfig
    model: DLRMConfig
    data: DataConfig
    optim: OptimConfig
    launcher: LauncherConfig
    eval: EvalConfig
    checkpoint: CheckpointConfig
    steps: int
    seed: int
    log_every_steps: int
    tensorboard: bool
    unsharded: bool
    pipeline: bool | None
    plan_file: str | None
    out_dir: Path

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.out_dir / "checkpoints"


def settings_from_config(cfg: DictConfig) -> TrainSettings:
    """Validate the composed config; ValueError names the key and how to fix it."""
    if isinstance(cfg.get("tables"), DictConfig):
        raise ValueError("tables: the tables file's blocks landed under 'tables'; make '# @package _global_' its first line")
    obj = OmegaConf.to_object(cfg)
    raw = OmegaConf.to_container(cfg, resolve=True)
    optim: OptimConfig = value_of(obj.optim)
    model: DLRMConfig = value_of(obj.model)
    specs = run_specs(raw["tables"], model, optim.table_optimizer)
    launcher: LauncherConfig = value_of(obj.launcher)
    if not launcher.nproc > 0:  # before the topology, whose world size follows it (configs/train_ranks.yaml)
        raise ValueError(f"launcher.nproc: must be a positive number of local ranks, got {launcher.nproc}")
    topology = Topology.from_dict(raw["topology"])
    if topology.comms != CommsPrecision():
        raise ValueError(f"topology.comms: {topology.comms} set in the topology; set the wire dtypes with planner.comms.* "
                         "(e.g. planner.comms.forward=fp16), the plan records them")
    # The unsharded reference does not plan: its constraints (for a sharded run's ranks) are not used.
    constraints = Constraints() if obj.unsharded else \
        Constraints.from_dict(raw["constraints"], [s.name for s in specs], topology.world_size)
    data = value_of(obj.data)
    settings = TrainSettings(
        specs=specs, topology=topology, constraints=constraints, planner=value_of(obj.planner), model=model, data=data,
        optim=optim, launcher=launcher, eval=value_of(obj.eval), checkpoint=value_of(obj.checkpoint),
        steps=obj.steps, seed=obj.seed, log_every_steps=obj.log_every_steps, tensorboard=obj.tensorboard,
        unsharded=obj.unsharded, pipeline=obj.pipeline, plan_file=obj.plan_file, out_dir=Path(obj.out_dir))
    check(settings)
    return settings


def run_specs(tables: list[Any], model: DLRMConfig, table_optimizer: str | None) -> tuple[TableSpec, ...]:
    """The run's tables: the tables file's (optimizer overridden by ``optim.table_optimizer``), plus the
    model's sequence table (also read by embshard-export from a run's config.yaml)."""
    if table_optimizer is not None:
        tables = [{**t, "optimizer": table_optimizer} for t in tables]
    specs = tables_from_list(tables, "tables")
    if model.sequence.enabled:
        taken = [s.name for s in specs if s.name == model.sequence.table]
        if taken:
            raise ValueError(f"model.sequence.table: {taken[0]!r} is already a table of the tables file; choose another name")
        specs += (model.sequence.table_spec(model.dense_dim, table_optimizer or specs[0].optimizer),)
    return specs


def check(s: TrainSettings) -> None:
    positive = {"steps": s.steps, "log_every_steps": s.log_every_steps,
                "eval.num_samples": s.eval.num_samples, "checkpoint.keep_last": s.checkpoint.keep_last,
                "planner.time_budget_s": s.planner.time_budget_s, "planner.ilp_time_s": s.planner.ilp_time_s,
                "launcher.collective_timeout_s": s.launcher.collective_timeout_s}
    for key, value in positive.items():
        if not value > 0:
            raise ValueError(f"{key}: must be positive, got {value}")
    for key in ("eval.every_steps", "checkpoint.every_steps"):
        section, name = key.split(".")
        if getattr(getattr(s, section), name) < 0:
            raise ValueError(f"{key}: must be >= 0 (0 = only after the last step), got {getattr(getattr(s, section), name)}")
    if s.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("tensorboard=true: the tensorboard package is not installed; "
                         "pip install 'embshard[tensorboard]' or set tensorboard=false")
    existing = next(p for p in (s.checkpoint_dir, *s.checkpoint_dir.absolute().parents) if p.exists())
    if not os.access(existing, os.W_OK):
        raise ValueError(f"checkpoint.dir: {s.checkpoint_dir} cannot be written ({existing} is read-only); choose a "
                         "writable folder")
    if s.unsharded and s.launcher.nproc != 1:
        raise ValueError(f"unsharded: the unsharded reference runs in one process; drop launcher.nproc={s.launcher.nproc}")
    if s.model.sequence.enabled and not isinstance(s.data, SyntheticConfig):
        raise ValueError("model.sequence.enabled: Criteo has no user history; sequence features need data=synthetic")
    if isinstance(s.data, (CriteoTsvConfig, CriteoNpyConfig)):
        eval_split = s.data.eval_files if isinstance(s.data, CriteoTsvConfig) else s.data.eval_days
        if not eval_split:
            name = "eval_files" if isinstance(s.data, CriteoTsvConfig) else "eval_days"
            raise ValueError(f"data.{name}: empty; evaluation needs held-out data (e.g. data.{name}=[...])")
    if isinstance(s.data, CriteoTsvConfig):  # here, before any rank starts
        check_files(s.data.train_files, "data.train_files")
        check_files(s.data.eval_files, "data.eval_files")

