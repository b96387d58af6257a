"""Small table sets, model settings and a one-process trainer shared by the training tests."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from embshard.cli import CONFIG_DIR
from embshard.launch import distributed
from embshard.train import config
from embshard.train.trainer import Trainer

CONFIGS = Path(CONFIG_DIR)
config.register()

# Six small tables; the 2-rank runs put each on a different sharding type (see test_training_runs.py).
TINY = """# @package _global_
tables:
  - {name: t0, num_embeddings: 300, embedding_dim: 8, optimizer: rowwise_adagrad}
  - {name: t1, num_embeddings: 200, embedding_dim: 8, optimizer: rowwise_adagrad}
  - {name: t2, num_embeddings: 100, embedding_dim: 8, pooling_factor: 3.0, optimizer: adagrad}
  - {name: t3, num_embeddings: 50, embedding_dim: 8, optimizer: rowwise_adagrad}
  - {name: t4, num_embeddings: 400, embedding_dim: 8, pooling_factor: 2.0, optimizer: sgd}
  - {name: t5, num_embeddings: 80, embedding_dim: 8, optimizer: adam}
"""
# The same tables with a larger t2, and one table fewer: checkpoints of TINY must be refused.
LARGER = TINY.replace("t2, num_embeddings: 100,", "t2, num_embeddings: 120,")
FEWER = "\n".join(line for line in TINY.splitlines() if "t5" not in line) + "\n"
# The model that fits them: dense vector of width 8 (= the tables' dim for the dot interaction).
MODEL = ["model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]"]
FAST_PLANNER = ["planner.time_budget_s=0.5", "planner.use_ilp=false"]


def criteo_like(num_rows: int = 100) -> str:
    """26 small tables, one per Criteo categorical feature (the Criteo readers need exactly 26)."""
    rows = "\n".join(f"  - {{name: cat_{i}, num_embeddings: {num_rows + i}, embedding_dim: 8}}" for i in range(26))
    return f"# @package _global_\ntables:\n{rows}\n"


def settings(config_dir: Path, out: Path, *overrides: str) -> config.TrainSettings:
    """The settings of a small run on the tiny tables (``config_dir``: the conftest's), output in ``out`` (created)."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"hydra.searchpath=[file://{config_dir}]", "tables=tiny", *MODEL, *FAST_PLANNER,
                                          "topology.batch_size_per_rank=32", "log_every_steps=1", "eval.every_steps=0",
                                          "eval.num_samples=32", f"out_dir={out}", *overrides])
    s = config.settings_from_config(cfg)
    s.out_dir.mkdir(parents=True, exist_ok=True)
    return s


def trainer(config_dir: Path, out: Path, *overrides: str) -> Trainer:
    """An unsharded one-process Trainer on the tiny tables, output in ``out``."""
    s = settings(config_dir, out, "unsharded=true", *overrides)
    return Trainer(s, distributed.start(s.topology, 60, with_group=False), console=None)
