"""One rank of the pipelined-step test (test_pipeline.py), started with torchrun's variables.

    RANK=0 WORLD_SIZE=2 ... python tests/train/pipe_worker.py pipe CONFIG_DIR OUT

Trains the same run twice, the plain step then ``pipeline=true`` (each table on another sharding
type, a sequence feature, an eval and a checkpoint in the middle), and writes OUT/pipe_rankR.json:
per run, the train losses (rank 0), the final checkpoint's folder and the threads that ran the
input dists of the training steps.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ckpt_worker import constraints, outcome  # noqa: E402
from embshard.launch import distributed  # noqa: E402
from embshard.runtime.input_dist import InputDist  # noqa: E402
from embshard.train.trainer import Trainer  # noqa: E402
from train_tables import settings  # noqa: E402

COLLECTIVE_TIMEOUT_S = 30
STEPS = 8
BATCH = {2: 24, 3: 16}
LAYOUT = {2: {"t0": ("row_wise", None), "t1": ("table_wise", [1]), "t2": ("column_wise", None),
              "t3": ("data_parallel", None), "t4": ("table_row_wise", None), "t5": ("table_wise", [0]),
              "item": ("row_wise", None)},
          3: {"t0": ("table_wise", [2]), "t1": ("row_wise", None), "t2": ("table_column_wise", None),
              "t3": ("data_parallel", None), "t4": ("column_wise", None), "t5": ("row_wise", None),
              "item": ("table_wise", [1])}}
SEQUENCE = ["model.sequence.enabled=true", "model.sequence.num_items=100", "model.sequence.max_history_length=6"]


def train(config_dir: Path, out: Path, world: int, pipeline: bool) -> dict:
    s = settings(config_dir, out, *constraints(LAYOUT[world]), *SEQUENCE, f"topology.batch_size_per_rank={BATCH[world]}",
                 f"steps={STEPS}", "eval.every_steps=3", "checkpoint.every_steps=4", "eval.num_samples=40",
                 f"launcher.collective_timeout_s={COLLECTIVE_TIMEOUT_S}", f"pipeline={str(pipeline).lower()}")
    trainer = Trainer(s, CTX, console=None)
    threads: list[str] = []  # the thread of each input dist of a training step (not of an eval)
    evaluating = threading.Event()
    plain_dist, plain_eval = InputDist.__call__, Trainer._evaluate

    def recorded(self, *args, **kwargs):
        # the side thread only distributes training batches, and may do so while the main thread evaluates
        name = threading.current_thread().name
        if name.startswith("embshard-input-dist") or not evaluating.is_set():
            threads.append(name)
        return plain_dist(self, *args, **kwargs)

    def evaluate(self) -> None:
        evaluating.set()
        try:
            plain_eval(self)
        finally:
            evaluating.clear()

    with mock.patch.object(InputDist, "__call__", recorded), mock.patch.object(Trainer, "_evaluate", evaluate):
        trainer.train()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] if CTX.is_main else []
    return {"losses": [r["loss"] for r in records if r["split"] == "train"],
            "auc": [r["auc"] for r in records if r["split"] == "eval"],
            "checkpoint": str(trainer.last_checkpoint), "threads": threads}


def main() -> None:
    global CTX
    config_dir, out = Path(sys.argv[2]), Path(sys.argv[3])
    topology = settings(config_dir, out, f"topology.batch_size_per_rank={BATCH[2]}").topology
    CTX = distributed.start(topology, COLLECTIVE_TIMEOUT_S)
    world = CTX.world_size
    result = outcome(lambda: {mode: train(config_dir, out / f"w{world}_{mode}", world, mode == "pipelined")
                              for mode in ("plain", "pipelined")})
    (out / f"pipe_rank{CTX.rank}.json").write_text(json.dumps(result))
    distributed.stop(CTX)


CTX: distributed.RankContext


if __name__ == "__main__":
    main()
    # skip the interpreter's teardown: a gloo worker thread still holding a finished work's tensors can abort
    # it ("terminate called without an active exception", SIGABRT) after the rank has done and said all
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
