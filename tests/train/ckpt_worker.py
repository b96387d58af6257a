"""One rank of the multi-process checkpoint tests (test_checkpoint_ranks.py), started with torchrun's variables.

    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P \\
        python tests/train/ckpt_worker.py JOB CONFIG_DIR OUT

JOB ``two`` (2 ranks): train STEPS + MORE_STEPS steps under LAYOUT_2, a checkpoint every STEPS;
then saves that fail on one rank (its shard file, its rank file, rank 0's folder swap), each
followed by a load of the last good checkpoint; then resumes from a copy whose rank_1.json is
corrupt (through the trainer without checksums, through the load with them). JOB ``three``
(3 ranks): resume the STEPS checkpoint under each 3-rank layout and train MORE_STEPS steps, and
under "exact"'s layout with hot rows replicated (a plan file).
Each rank writes what it saw to OUT/JOB_rankR.json.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import sys
import time
import traceback
from pathlib import Path
from dataclasses import replace
from typing import Any, Callable
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from torch.distributed.checkpoint import FileSystemWriter  # noqa: E402

from embshard.launch import distributed  # noqa: E402
from embshard.train import checkpoint  # noqa: E402
from embshard.train.trainer import Trainer  # noqa: E402
from train_tables import settings  # noqa: E402

COLLECTIVE_TIMEOUT_S = 30
STEPS, MORE_STEPS = 10, 20
BATCH = {2: 24, 3: 16}  # per rank: the same global batches on 2 and 3 ranks
# t3 (rowwise_adagrad) is split in two column blocks on 2 ranks: one row-wise accumulator per block.
LAYOUT_2 = {"t0": ("row_wise", None), "t1": ("table_wise", [1]), "t2": ("column_wise", None),
            "t3": ("column_wise", [0, 1]), "t4": ("table_row_wise", None), "t5": ("table_wise", [0])}
# Another plan on 3 ranks; "exact" keeps t3's column blocks, "merged" puts t3 whole on one rank.
LAYOUT_3 = {"exact": {"t0": ("table_wise", [2]), "t1": ("row_wise", None), "t2": ("table_wise", [0]),
                      "t3": ("column_wise", [1, 2]), "t4": ("data_parallel", None), "t5": ("row_wise", None)}}
LAYOUT_3["merged"] = {**LAYOUT_3["exact"], "t3": ("table_wise", [1])}
# hot rows on "exact"'s layout (t4 is data-parallel: all its rows are on every rank; t3's column blocks keep one
# rowwise_adagrad accumulator each, its hot replica one per row: that would train differently, as "merged" does)
HOT_TABLES = ("t0", "t1", "t5")


def constraints(layout: dict[str, tuple[str, list[int] | None]]) -> list[str]:
    out = []
    for table, (stype, ranks) in layout.items():
        out.append(f"+constraints.tables.{table}.sharding_types=[{stype}]")
        if ranks is not None:
            out.append(f"+constraints.tables.{table}.ranks=[{','.join(map(str, ranks))}]")
    return out


def make_trainer(config_dir: Path, out: Path, world: int, layout: dict, *overrides: str,
                 console: Console | None = None) -> Trainer:
    s = settings(config_dir, out, *constraints(layout), f"topology.batch_size_per_rank={BATCH[world]}",
                 "checkpoint.keep_last=3", f"launcher.collective_timeout_s={COLLECTIVE_TIMEOUT_S}", *overrides)
    return Trainer(s, CTX, console)


def placements(t: Trainer) -> dict[str, list[list[Any]]]:
    return {p.name: [[p.sharding_type.value, s.rank, s.row_offset, s.num_rows, s.col_offset, s.num_cols]
                     for s in p.shards] for p in t.plan.tables}


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """What ``fn()`` did on this rank: its error (type and message) or its value, and how long it took."""
    t0 = time.monotonic()
    try:
        value, error = fn(), None
    except Exception as e:
        value, error = None, {"type": type(e).__name__, "message": str(e), "trace": traceback.format_exc()[-3000:]}
    return {"seconds": time.monotonic() - t0, "error": error, "value": value}


def fail_on(rank: int, target: Any, name: str, error: OSError, when: Callable[..., bool] = lambda *a, **k: True):
    """Patch ``target.name`` to raise ``error`` on ``rank`` (when ``when(args)``), and to work elsewhere."""
    original = getattr(target, name)

    def patched(*args: Any, **kwargs: Any) -> Any:
        if CTX.rank == rank and when(*args, **kwargs):
            raise error
        return original(*args, **kwargs)

    return mock.patch.object(target, name, patched)


def job_two(config_dir: Path, out: Path) -> dict[str, Any]:
    t = make_trainer(config_dir, out / "two", 2, LAYOUT_2, f"steps={STEPS + MORE_STEPS}", f"checkpoint.every_steps={STEPS}")
    t.train()
    root = out / "two" / "checkpoints"
    result: dict[str, Any] = {"placements": placements(t)}
    injections = {
        "shard_file": fail_on(1, FileSystemWriter, "write_data", OSError(28, "No space left on device")),
        "rank_file": fail_on(1, pathlib.Path, "open", PermissionError(13, "Permission denied"),
                             lambda path, mode="r", *a, **k: path.name == "rank_1.json" and "w" in mode),
        "swap": fail_on(0, checkpoint, "swap_in", OSError(28, "No space left on device")),
    }
    for i, (case, patch) in enumerate(injections.items()):
        with patch:
            result[f"save_{case}"] = outcome(lambda: str(checkpoint.save(root, 100 + i, t.parts, t.ctx, {}, {}, 3)))
        result[f"load_after_{case}"] = outcome(lambda: checkpoint.load(root, t.parts, t.ctx).step)
    last = root / f"step_{STEPS + MORE_STEPS:06d}"
    for name, keep_checksums in (("legacy", False), ("checksummed", True)):
        bad = out / f"bad_{name}" / last.name
        if CTX.is_main:
            shutil.copytree(last, bad)
            (bad / "rank_1.json").write_text("\n")
            if not keep_checksums:
                state = json.loads((bad / "train_state.json").read_text())
                state.pop("files")
                (bad / "train_state.json").write_text(json.dumps(state))
        distributed.barrier(CTX)
        if keep_checksums:  # the load alone
            result[f"resume_{name}"] = {**outcome(lambda: checkpoint.load(bad, t.parts, t.ctx).step), "printed": ""}
            continue
        printed = io.StringIO()  # the trainer: rank 0 must not claim a resume
        console = Console(file=printed, width=200) if CTX.is_main else None
        result[f"resume_{name}"] = outcome(lambda: make_trainer(config_dir, out / f"resumed_{name}", 2, LAYOUT_2,
                                                                f"checkpoint.resume_from={bad}", console=console).step)
        result[f"resume_{name}"]["printed"] = printed.getvalue()
    return result


def job_three(config_dir: Path, out: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    resume = f"checkpoint.resume_from={out / 'two' / 'checkpoints' / f'step_{STEPS:06d}'}"
    for name, layout in LAYOUT_3.items():
        t = make_trainer(config_dir, out / f"three_{name}", 3, layout, f"steps={STEPS + MORE_STEPS}", resume)
        t.train()
        result[name] = {"placements": placements(t), "resumed_at": t.start_step}
        if name == "exact":  # the same layout with hot rows (HOT_TABLES' fifth replicated): a plan file
            hot_plan = out / "three_hot_plan.json"
            if CTX.is_main:
                np.savez(out / "hot_ids.npz", **{s.name: np.random.default_rng(5).permutation(s.num_embeddings)
                                                 for s in t.plan.specs})
                tables = tuple(replace(p, hot_rows=t.plan.spec(p.name).num_embeddings // 5 if p.name in HOT_TABLES else 0)
                               for p in t.plan.tables)
                replace(t.plan, tables=tables, hot_ids_file=str(out / "hot_ids.npz")).save(hot_plan)
            distributed.barrier(CTX)
            hot = make_trainer(config_dir, out / "three_hot", 3, layout, f"steps={STEPS + MORE_STEPS}", resume,
                               f"plan_file={hot_plan}")
            hot.train()
            result["hot"] = {"hot_rows": {p.name: p.hot_rows for p in hot.plan.tables}, "resumed_at": hot.start_step}
    return result


def main() -> None:
    global CTX
    job, config_dir, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    topology = settings(config_dir, out, f"topology.batch_size_per_rank={BATCH[2]}").topology
    CTX = distributed.start(topology, COLLECTIVE_TIMEOUT_S)
    result = outcome(lambda: (job_two if job == "two" else job_three)(config_dir, out))
    (out / f"{job}_rank{CTX.rank}.json").write_text(json.dumps(result))
    distributed.stop(CTX)


CTX: distributed.RankContext


if __name__ == "__main__":
    main()
    # skip the interpreter's teardown: a gloo worker thread still holding a finished work's tensors can abort
    # it ("terminate called without an active exception", SIGABRT) after the rank has done and said all
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
