"""Shared fixtures of the serving tests: one trained run, and serving artifacts exported from it.

`trained_run`: `embshard-train` on 2 gloo ranks for 200 steps (about 30 s) on a planted-signal
synthetic set with SERVING_TABLES (pooled tables, one of them with bags of ~3 ids) and a
user-history feature (sequence table ``item``), from a plan file with hot rows (HOT_ROWS: t0
and item row-wise, their hottest rows replicated); returns its out_dir (config.yaml, plan.json,
checkpoints/step_000200). `artifact(dtype, world_size)`: that run exported as embshard-export
does it (`embshard.serving.export.export`, in this process: no start-up cost; test_export.py
runs the command line), cached per argument pair; returns the artifact folder. Two-rank
artifacts are laid out by LAYOUT: row-wise, table-wise, column-wise and data-parallel tables.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

BIN = Path(sys.executable).parent
SERVING_TABLES = """# @package _global_
tables:
  - {name: t0, num_embeddings: 400, embedding_dim: 8}
  - {name: t1, num_embeddings: 300, embedding_dim: 8, pooling_factor: 2.0}
  - {name: t2, num_embeddings: 200, embedding_dim: 8}
  - {name: t3, num_embeddings: 100, embedding_dim: 8, pooling_factor: 3.0}
"""
TRAIN_ARGS = ["tables=serving_tiny", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]", "planner.time_budget_s=0.5",
              "model.sequence.enabled=true", "model.sequence.num_items=100", "model.sequence.max_history_length=6",
              "data.signal=3", "launcher.nproc=2", "launcher.collective_timeout_s=60", "steps=200",
              "topology.batch_size_per_rank=128", "eval.every_steps=0", "eval.num_samples=1024"]
HOT_ROWS = {"t0": 40, "item": 10}  # the run's hot rows; artifacts keep them where they shard these tables
TIMEOUT_S = 300
NUM_SAMPLES = 4096  # held-out samples the tests score
# The 2-rank artifacts' layout: every way a table travels (the planner alone would replicate these small tables).
LAYOUT = {"tables": {"t0": {"sharding_types": ["row_wise"]}, "t1": {"sharding_types": ["table_wise"], "ranks": [1]},
                     "t2": {"sharding_types": ["column_wise"]}, "t3": {"sharding_types": ["data_parallel"]},
                     "item": {"sharding_types": ["row_wise"]}}}


def run_cli(args: list[str], timeout_s: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """A console script of the venv, in its own process; output captured as text."""
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def hot_row_plan(root: Path) -> Path:
    """A 2-rank training plan of the run's tables: HOT_ROWS' tables row-wise with hot rows (ranked by a seeded
    permutation in root/hot_ids.npz), the others data-parallel; returns its path."""
    import dataclasses

    import numpy as np
    import yaml

    from embshard import planner
    from embshard.models.config import DLRMConfig, SequenceConfig
    from embshard.stats.hot_ids import write_hot_ids
    from embshard.topology import Topology
    from embshard.train.config import run_specs

    model = DLRMConfig(bottom_mlp=(16, 8), top_mlp=(16, 1), sequence=SequenceConfig(enabled=True, num_items=100,
                                                                                    max_history_length=6))  # TRAIN_ARGS
    specs = run_specs(yaml.safe_load(SERVING_TABLES)["tables"], model, None)
    topology = Topology(world_size=2, local_world_size=2, device="cpu", batch_size_per_rank=128)
    layout = {s.name: ("row_wise" if s.name in HOT_ROWS else "data_parallel", (0, 1)) for s in specs}
    placements = [dataclasses.replace(t, hot_rows=HOT_ROWS.get(t.name, 0))
                  for t in planner.manual_plan(specs, topology, layout).tables]
    rng = np.random.default_rng(0)
    write_hot_ids(root / "hot_ids.npz", {s.name: rng.permutation(s.num_embeddings) for s in specs if s.name in HOT_ROWS})
    planner.evaluate(specs, topology, placements, hot_ids_file=str(root / "hot_ids.npz")).save(root / "plan.json")
    return root / "plan.json"


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serving_run")
    (root / "configs" / "tables").mkdir(parents=True)
    (root / "configs" / "tables" / "serving_tiny.yaml").write_text(SERVING_TABLES)
    out = root / "run"
    done = run_cli(["embshard-train", f"--config-dir={root / 'configs'}", *TRAIN_ARGS, f"plan_file={hot_row_plan(root)}",
                    f"out_dir={out}"])
    assert done.returncode == 0, f"embshard-train failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out


@pytest.fixture(scope="session")
def artifact(trained_run, tmp_path_factory) -> Callable[[str, int], Path]:
    cache: dict[tuple[str, int], Path] = {}

    def make(dtype: str, world_size: int) -> Path:
        if (dtype, world_size) not in cache:
            from embshard.serving.export import ExportSettings, export  # torch: only in tests that use it

            out = tmp_path_factory.mktemp(f"artifact_{dtype}_w{world_size}") / "artifact"
            cache[(dtype, world_size)] = export(ExportSettings(checkpoint=trained_run, out=out, world_size=world_size,
                                                               dtype=dtype, constraints=LAYOUT if world_size == 2 else {}))
        return cache[(dtype, world_size)]

    return make


@pytest.fixture(scope="session")
def reference(trained_run):
    """The unsharded model with the checkpoint's weights, its tables, and the held-out samples."""
    import torch

    from embshard.data.batch import NUM_DENSE, FeatureLayout, to_batch
    from embshard.data.config import SyntheticConfig
    from embshard.data.synthetic import SyntheticSource
    from embshard.models.dlrm import DLRM
    from embshard.serving.export import find_run, read_dense, read_table

    run = find_run(trained_run)
    model_cfg = run.model
    layout = FeatureLayout.from_specs(run.specs, NUM_DENSE, model_cfg.sequence.max_history_length)
    model = DLRM(model_cfg, run.specs, NUM_DENSE).eval()
    tables = {s.name: read_table(run.step_dir, s.name, (s.num_embeddings, s.embedding_dim), s.dtype) for s in run.specs}
    with torch.no_grad():
        for name, param in read_dense(run.step_dir).items():
            model.get_parameter(name).copy_(param)
        for name, bag in model.sparse.embedding_bags.items():
            bag.weight.copy_(tables[name])
        for name, emb in model.sequence.embeddings.items():
            emb.weight.copy_(tables[name])
    data = SyntheticConfig(signal=3.0)  # the trained run's data (TRAIN_ARGS)
    samples = SyntheticSource(data, layout, "eval").read(0, NUM_SAMPLES)
    batch = to_batch(samples, layout)
    with torch.no_grad():
        scores = torch.sigmoid(model(batch.dense, batch.sparse, batch.sequence))
    return {"run": run, "layout": layout, "samples": samples, "batch": batch, "scores": scores, "tables": tables}
