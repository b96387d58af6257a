"""embshard-train end to end, as users run it: real processes, real gloo ranks.

Stage 1 (concurrently): A = 2 local ranks for 60 steps on a planted-signal set, with each
table on another sharding type and a user-history feature (sequence table, row-wise); a strict run on Criteo TSV with a malformed line; a Hydra
--multirun sweep; two 2-rank TSV runs that fail at their first batch, on every rank or on rank 1 only;
K = 2 ranks of which one is killed after its first step. Meanwhile, in
this process: U = the unsharded reference on A's global batches for 10 steps, and a Criteo
TSV run that skips malformed lines (with TensorBoard); Q = A with quantized communication (fp16 embeddings,
bf16 gradients and data-parallel all-reduce on the wire), no checkpoints; Z = A's first 10 steps with the
dense optimizer sharded across the ranks (optim.sharded_update). Stage 2, from A's checkpoints: B = torchrun resuming A
at step 30, and A's last checkpoint on 3 ranks (another plan) and in one process
(unsharded). Starting a rank costs seconds (imports), so checks share runs. Collectives
time out after 60 s (K: 20 s), so no case can hang the suite.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hydra import compose, initialize_config_dir
from rich.console import Console
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from embshard.cli import CONFIG_DIR
from embshard.ports import free_port
from embshard.launch import distributed
from embshard.train import config
from embshard.train.checkpoint import SafeReader, read_metadata, read_tables
from embshard.train.trainer import Trainer
from train_tables import FAST_PLANNER, MODEL

BIN = Path(sys.executable).parent
CONFIGS = Path(CONFIG_DIR)
STAGE_TIMEOUT_S = 420
# One sharding type per table on 2 ranks (appended to A's and B's command lines).
LAYOUT = {"t0": "[row_wise]", "t1": "[table_wise]", "t2": "[column_wise]", "t3": "[data_parallel]",
          "t4": "[table_row_wise]", "t5": "[table_wise]"}
SHARDING = [f"+constraints.tables.{t}.sharding_types={types}" for t, types in LAYOUT.items()] + \
    ["+constraints.tables.t1.ranks=[1]", "+constraints.tables.t5.ranks=[0]", "+constraints.tables.item.sharding_types=[row_wise]"]
# A user-history feature: a sequence table "item", looked up by the sharded EmbeddingCollection.
SEQUENCE = ["model.sequence.enabled=true", "model.sequence.num_items=100", "model.sequence.max_history_length=6"]
QCOMMS = ["planner.comms.forward=fp16", "planner.comms.backward=bf16", "planner.comms.dp_allreduce=bf16"]
BATCH = 64  # per rank of A; the unsharded reference takes 2 x 64
KILL_TIMEOUT_S = 20  # K's collective timeout
EVAL_SAMPLES = 500  # not a multiple of 2 x 64 or 3 x 64: the last eval batch is short on 2 ranks, empty on rank 2 of 3
config.register()


@dataclass
class Run:
    proc: subprocess.Popen
    out: Path
    log: Path
    started: float

    def wait(self, timeout_s: float = STAGE_TIMEOUT_S) -> "Run":
        try:
            self.proc.wait(timeout=max(1.0, self.started + timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return self

    @property
    def text(self) -> str:
        return self.log.read_text()

    @property
    def errors(self) -> list[str]:
        return [line for line in self.text.replace("\r", "\n").splitlines() if "embshard-train: error:" in line]


def start(tmp: Path, name: str, args: list[str], command: list[str] | None = None, out_dir: bool = True) -> Run:
    """Start one command line (embshard-train unless ``command``) writing to ``tmp/name``."""
    out, log = tmp / name, tmp / f"{name}.log"
    with log.open("w") as f:
        proc = subprocess.Popen([*(command or [str(BIN / "embshard-train")]), *args, *([f"out_dir={out}"] * out_dir)],
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    return Run(proc, out, log, time.monotonic())


def metrics(out: Path, split: str = "train") -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


def base(config_dir: Path, tables: str = "tiny") -> list[str]:
    synthetic = ["data.signal=3", *SEQUENCE] if tables == "tiny" else []
    return [f"--config-dir={config_dir}", f"tables={tables}", *MODEL, *FAST_PLANNER, *synthetic,
            "launcher.collective_timeout_s=60", "log_every_steps=1", f"eval.num_samples={EVAL_SAMPLES}"]


def in_process(args: list[str], out: Path) -> str:
    """Train one unsharded run inside this process (no new imports); what it printed."""
    user_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--config-dir="))
    overrides = [a for a in args if not a.startswith("--")]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"hydra.searchpath=[file://{user_dir}]", *overrides, "unsharded=true",
                                          f"out_dir={out}"])
    s = config.settings_from_config(cfg)
    s.out_dir.mkdir(parents=True)
    printed = io.StringIO()
    Trainer(s, distributed.start(s.topology, 60, with_group=False), Console(file=printed, width=200)).train()
    return printed.getvalue()


def tsv_line(i: int) -> str:
    return "\t".join([str(i % 2), *[str(i % 7)] * 13, *[format(i * 31 + j, "x") for j in range(26)]])


@pytest.fixture(scope="module")
def stage1(config_dir, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("stage1")
    lines = [tsv_line(i) for i in range(200)]
    lines[3], lines[50] = "1\t2\t3", tsv_line(50).replace("\t", "\tx", 1)
    (tmp / "day_0.tsv").write_text("\n".join(lines) + "\n")
    tsv = [*base(config_dir, "criteo26"), "data=criteo_tsv", f"data.train_files=[{tmp}/day_0.tsv]",
           f"data.eval_files=[{tmp}/day_0.tsv]", "steps=4", "topology.batch_size_per_rank=32"]
    runs = {
        "A": start(tmp, "A", [*base(config_dir), *SHARDING, "launcher.nproc=2", "steps=60",
                              f"topology.batch_size_per_rank={BATCH}", "eval.every_steps=30", "checkpoint.every_steps=10",
                              "checkpoint.keep_last=6"]),
        "Q": start(tmp, "Q", [*base(config_dir), *SHARDING, *QCOMMS, "launcher.nproc=2", "steps=60",
                              f"topology.batch_size_per_rank={BATCH}", "eval.every_steps=0"]),
        "Z": start(tmp, "Z", [*base(config_dir), *SHARDING, "optim.sharded_update=true", "launcher.nproc=2", "steps=10",
                              f"topology.batch_size_per_rank={BATCH}", "eval.every_steps=0"]),
        "strict": start(tmp, "strict", [*tsv, "unsharded=true", "data.strict=true"]),
        # one sharded process, then 2 local ranks: the launcher under --multirun
        "sweep": start(tmp, "sweep", ["--multirun", *base(config_dir), "launcher.nproc=1,2", "steps=2",
                                      "topology.batch_size_per_rank=16", "eval.num_samples=32", f"hydra.sweep.dir={tmp}/sweep"],
                       out_dir=False),
    }
    # 2 ranks fail at their first batch: every rank (all lines malformed), or rank 1 only (strict; a bad line in its half)
    (tmp / "junk.tsv").write_text("garbage\tline\n" * 100)
    late = [tsv_line(i) for i in range(200)]
    late[150] = "1\t2\t3"
    (tmp / "late_bad.tsv").write_text("\n".join(late) + "\n")
    two_ranks = [*tsv, "launcher.nproc=2"]
    runs["bad_all"] = start(tmp, "bad_all", [*two_ranks, f"data.train_files=[{tmp}/junk.tsv]"])
    runs["bad_one"] = start(tmp, "bad_one", [*two_ranks, f"data.train_files=[{tmp}/late_bad.tsv]", "data.strict=true"])
    runs["K"] = start(tmp, "K", [*base(config_dir), "launcher.nproc=2", f"launcher.collective_timeout_s={KILL_TIMEOUT_S}",
                                 "steps=100000", "topology.batch_size_per_rank=32", "eval.every_steps=0"])
    local = {"U": in_process([*base(config_dir), "steps=10", f"topology.batch_size_per_rank={2 * BATCH}",
                              "eval.every_steps=0"], tmp / "U"),
             "tsv": in_process([*tsv, "tensorboard=true"], tmp / "tsv")}
    kill_s = kill_rank_1_after_first_step(runs["K"])
    return {**{k: r.wait() for k, r in runs.items()}, "local": local, "tmp": tmp, "K_exit_after_kill_s": kill_s}


def kill_rank_1_after_first_step(run: Run) -> float:
    """SIGKILL rank 1 of ``run`` once rank 0 has logged a step; seconds until the run exited."""
    log = run.out / "metrics.jsonl"
    while not (log.exists() and log.stat().st_size) and run.proc.poll() is None:
        time.sleep(0.2)
    if run.proc.poll() is not None:
        return float("nan")  # it ended by itself: the test shows its output
    ranks = subprocess.run(["pgrep", "-P", str(run.proc.pid)], capture_output=True, text=True).stdout.split()
    rank1 = next(p for p in ranks if "RANK=1\0" in Path(f"/proc/{p}/environ").read_text())
    os.kill(int(rank1), signal.SIGKILL)
    killed = time.monotonic()
    run.wait(timeout_s=killed - run.started + KILL_TIMEOUT_S + 15)
    return time.monotonic() - killed


def test_two_ranks_match_the_unsharded_reference_step_by_step(stage1) -> None:
    a, tmp = stage1["A"], stage1["tmp"]
    assert a.proc.returncode == 0, a.text[-3000:]
    assert "sharding: data_parallel 1, table_wise 2, row_wise 2, column_wise 1, table_row_wise 1" in a.text
    sharded = [r["loss"] for r in metrics(a.out)[:10]]
    reference = [r["loss"] for r in metrics(tmp / "U")]
    assert len(reference) == 10 and max(abs(x - y) for x, y in zip(sharded, reference)) < 1e-5, (sharded, reference)
    want = read_tables(tmp / "U" / "checkpoints")
    got = read_tables(a.out / "checkpoints" / "step_000010")
    assert max(float((got[k] - want[k]).abs().max()) for k in want) < 1e-5


def test_planted_signal_reaches_auc_074(stage1) -> None:
    a = stage1["A"]
    evals = metrics(a.out, "eval")
    assert [e["step"] for e in evals] == [30, 60] and evals[-1]["auc"] >= 0.74, evals
    assert "eval AUC" in a.text and (a.out / "curves.png").stat().st_size > 10_000 and (a.out / "plan.json").exists()
    assert "samples_s=" in a.text  # rank 0's progress bar
    assert sorted(p.name for p in (a.out / "checkpoints").iterdir()) == [f"step_{10 * i:06d}" for i in range(1, 7)]
    # every rank wrote its own shards (no gather to rank 0)
    assert sorted(p.name for p in (a.out / "checkpoints" / "step_000060").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def test_quantized_communication_reaches_the_fp32_runs_auc(stage1) -> None:
    a, q = stage1["A"], stage1["Q"]
    assert q.proc.returncode == 0, q.text[-3000:]
    comms = json.loads((q.out / "plan.json").read_text())["topology"]["comms"]
    assert comms == {"forward": "fp16", "backward": "bf16", "dp_allreduce": "bf16"}
    fp32, quantized = metrics(a.out, "eval")[-1], metrics(q.out, "eval")[-1]
    assert fp32["step"] == quantized["step"] == 60 and abs(quantized["auc"] - fp32["auc"]) <= 0.002, (fp32, quantized)
    losses = [(x["loss"], y["loss"]) for x, y in zip(metrics(a.out), metrics(q.out))]
    assert len(losses) == 60 and any(x != y for x, y in losses[1:])  # the wire really rounds


def read_dense(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every dense parameter and dense optimizer state tensor of a checkpoint, in this process."""
    metadata = read_metadata(checkpoint)
    dest = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in metadata.state_dict_metadata.items()
            if k.startswith("dense") and isinstance(m, TensorStorageMetadata)}
    dcp.load(dest, storage_reader=SafeReader(checkpoint), no_dist=True)
    return dest


def test_sharded_weight_updates_match_the_unsharded_reference(stage1) -> None:
    z, tmp = stage1["Z"], stage1["tmp"]
    assert z.proc.returncode == 0, z.text[-3000:]
    sharded, reference = [r["loss"] for r in metrics(z.out)], [r["loss"] for r in metrics(tmp / "U")]
    assert len(sharded) == len(reference) == 10 and max(abs(x - y) for x, y in zip(sharded, reference)) < 1e-5, (sharded, reference)
    got, want = read_dense(z.out / "checkpoints" / "step_000010"), read_dense(tmp / "U" / "checkpoints" / "step_000010")
    # every parameter's optimizer state was saved (each by the rank that owns it) and equals the reference's
    assert set(got) == set(want) and any(k.startswith("dense_optim.") for k in want)
    assert max(float((got[k].double() - want[k].double()).abs().max()) for k in want) < 1e-5
    tables_got, tables_want = read_tables(z.out / "checkpoints"), read_tables(tmp / "U" / "checkpoints")
    assert max(float((tables_got[k] - tables_want[k]).abs().max()) for k in tables_want) < 1e-5


def test_eval_reads_a_tsv_file_once_and_counts_its_valid_lines(stage1) -> None:
    # 200 lines of which 2 are malformed; 4 x 32 samples trained: eval neither stops there nor wraps around
    assert "(198 eval samples)" in stage1["local"]["tsv"]
    assert [r["samples"] for r in metrics(stage1["tmp"] / "tsv", "eval")] == [198]


def test_malformed_lines_are_reported_or_stop_a_strict_run(stage1) -> None:
    # lines 3 and 50 while training, and again in the eval pass over the whole file
    assert "data: skipped 4 malformed record(s), e.g." in stage1["local"]["tsv"]
    assert list((stage1["tmp"] / "tsv" / "tensorboard").glob("events.out.tfevents.*"))
    strict = stage1["strict"]
    assert strict.proc.returncode == 2 and len(strict.errors) == 1, strict.text[-3000:]
    assert "day_0.tsv byte " in strict.errors[0] and "expected 40 tab-separated fields, got 3" in strict.errors[0]
    assert "Traceback" not in strict.text


def test_an_error_of_every_rank_or_of_one_is_printed_once(stage1) -> None:
    every, one = stage1["bad_all"], stage1["bad_one"]
    assert every.proc.returncode == 2 and len(every.errors) == 1, every.text[-3000:]
    assert "'s share of [" in every.errors[0] and "junk.tsv'] is malformed" in every.errors[0]
    # rank 0, left waiting for rank 1, does not add "lost contact"; the run exits with the reported error's status
    assert one.proc.returncode == 2 and len(one.errors) == 1, one.text[-3000:]
    assert "error: rank 1: " in one.errors[0] and "late_bad.tsv byte " in one.errors[0] and "got 3" in one.errors[0]
    assert "Traceback" not in every.text + one.text and "Error executing job" not in every.text + one.text


def test_multirun_sweep_runs_every_job(stage1) -> None:
    sweep = stage1["sweep"]
    assert sweep.proc.returncode == 0, sweep.text[-3000:]
    root = sweep.log.parent / "sweep"
    assert [metrics(root / job)[-1]["step"] for job in ("0", "1")] == [2, 2]
    assert [json.loads((root / job / "plan.json").read_text())["topology"]["world_size"] for job in ("0", "1")] == [1, 2]
    assert "trained 2 steps" in sweep.text and "on 2 rank(s)" in sweep.text


@pytest.fixture(scope="module")
def stage2(stage1, config_dir, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("stage2")
    a = stage1["A"].out / "checkpoints"
    common = [*base(config_dir), f"topology.batch_size_per_rank={BATCH}", "eval.every_steps=30", "steps=60"]
    torchrun = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "embshard.train"]
    runs = {
        "B": start(tmp, "B", [*common, f"plan_file={stage1['A'].out / 'plan.json'}",
                              f"checkpoint.resume_from={a / 'step_000030'}"], torchrun),
        "R3": start(tmp, "R3", [*common, "launcher.nproc=3", f"checkpoint.resume_from={a}"]),
    }
    local = in_process([*common, f"checkpoint.resume_from={a}"], tmp / "R1")
    return {**{k: r.wait() for k, r in runs.items()}, "R1": local, "tmp": tmp}


def test_resume_under_torchrun_continues_exactly(stage1, stage2) -> None:
    a, b = stage1["A"], stage2["B"]
    assert b.proc.returncode == 0, b.text[-3000:]
    assert "resumed from" in b.text and "at step 30" in b.text
    assert (b.out / "plan.json").read_text() == (a.out / "plan.json").read_text()
    assert [r["loss"] for r in metrics(b.out)] == [r["loss"] for r in metrics(a.out)[30:]]
    assert metrics(b.out, "eval")[-1]["auc"] == metrics(a.out, "eval")[-1]["auc"]
    want, got = read_tables(a.out / "checkpoints"), read_tables(b.out / "checkpoints")
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("name", ["R3", "R1"])
def test_checkpoint_loads_into_another_world_size_and_plan(stage1, stage2, name: str) -> None:
    if name == "R3":
        run = stage2["R3"]
        assert run.proc.returncode == 0, run.text[-3000:]
        text, out = run.text, run.out
        assert "on 3 ranks" in text
    else:
        text, out = stage2["R1"], stage2["tmp"] / "R1"
    assert "(saved by 2 ranks; resharded)" in text
    want, got = read_tables(stage1["A"].out / "checkpoints"), read_tables(out / "checkpoints")
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    # A's last weights evaluated on 3 ranks and on 1: the same eval set, each sample once
    evaluated, reference = metrics(out, "eval")[-1], metrics(stage1["A"].out, "eval")[-1]
    assert evaluated["step"] == reference["step"] == 60
    assert evaluated["samples"] == reference["samples"] == EVAL_SAMPLES and f"({EVAL_SAMPLES} eval samples)" in text
    assert abs(evaluated["auc"] - reference["auc"]) < 1e-6 and abs(evaluated["logloss"] - reference["logloss"]) < 1e-6


def test_killed_rank_stops_the_others_within_the_collective_timeout(stage1) -> None:
    run = stage1["K"]
    assert run.proc.returncode == 1, run.text[-3000:]
    assert stage1["K_exit_after_kill_s"] < KILL_TIMEOUT_S + 15
    assert any("rank 0: lost contact with the other ranks" in e for e in run.errors), run.errors
    assert any("rank 1 was killed by SIGKILL" in e for e in run.errors), run.errors
    assert "Traceback" not in run.text
