"""Checkpoints in one process (the unsharded reference, DCP without a process group):
exact resume, refusal of mismatched or corrupt checkpoints with nothing touched, and a
write that fails midway leaving the previous checkpoint loadable."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from embshard.train import checkpoint
from embshard.train.trainer import Trainer
from train_tables import trainer


def tables(t: Trainer) -> dict[str, torch.Tensor]:
    return {name: shard.weight.clone() for name, shard in t.parts.table_shards().items()}


def digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def trained(config_dir, tmp_path_factory) -> Path:
    """6 steps with a checkpoint after step 3 and after step 6: the folder of checkpoints."""
    out = tmp_path_factory.mktemp("ckpt_run")
    t = trainer(config_dir, out, "steps=6", "checkpoint.every_steps=3", "optim=adam")
    t.train()
    return out / "checkpoints"


def test_resume_continues_exactly(config_dir, trained, tmp_path) -> None:
    t = trainer(config_dir, tmp_path / "resumed", "steps=6", "optim=adam", f"checkpoint.resume_from={trained / 'step_000003'}")
    assert t.step == 3
    t.train()
    final = checkpoint.read_tables(trained)
    assert all(torch.equal(final[k], v) for k, v in checkpoint.read_tables(tmp_path / "resumed" / "checkpoints").items())
    assert (tmp_path / "resumed" / "metrics.jsonl").read_text().count('"train"') == 3


@pytest.mark.parametrize("overrides,needle", [
    (["tables=larger"], "table 't2' is 100x8 in the checkpoint but 120x8 here"),
    (["tables=fewer"], "tables only in the checkpoint ['t5']"),
    (["model.top_mlp=[32,1]"], "dense parameter 'top.0.weight' has shape"),
    (["model=dcnv2"], "only in this run ['interaction.crossnet.V_kernels.0'"),
    (["optim.table_optimizer=sgd"], "optimizer adam, fp32 in the checkpoint but sgd, fp32 here"),
    (["optim.dense.name=sgd"], "dense optimizer adam in the checkpoint, sgd here"),
])
def test_mismatched_checkpoint_is_refused_by_name(config_dir, trained, tmp_path, overrides, needle) -> None:
    before = digest(trained / "step_000006")
    with pytest.raises(ValueError) as e:
        trainer(config_dir, tmp_path, "optim=adam", f"checkpoint.resume_from={trained}", *overrides)
    assert needle in str(e.value) and "does not match this run" in str(e.value)
    assert digest(trained / "step_000006") == before and not (tmp_path / "checkpoints").exists()


class Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/embshard-pwned",))


def corrupt(src: Path, dst: Path, how: str) -> None:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    if how == "pickle":
        (dst / ".metadata").write_bytes(pickle.dumps(Payload()))
    elif how == "truncated":
        shard = dst / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])
    elif how == "state":
        (dst / "train_state.json").write_text("{not json")
    elif how == "metadata":
        (dst / ".metadata").unlink()


@pytest.mark.parametrize("how,needle", [
    ("pickle", "posix.system is not part of DCP's metadata"),
    ("truncated", "cannot read its tensors, the files are corrupt or truncated"),
    ("state", "train_state.json is unreadable or corrupt"),
    ("metadata", ".metadata) is missing, corrupt or not DCP's"),
])
def test_corrupt_checkpoint_is_refused(config_dir, trained, tmp_path, how, needle) -> None:
    bad = tmp_path / "step_000006"
    corrupt(trained / "step_000006", bad, how)
    t = trainer(config_dir, tmp_path / "run", "optim=adam")
    before = tables(t)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        checkpoint.load(bad, t.parts, t.ctx)
    assert not Path("/tmp/embshard-pwned").exists()
    assert all(torch.equal(before[k], v) for k, v in tables(t).items())  # nothing was loaded
    with pytest.raises(ValueError, match="no checkpoint there"):
        checkpoint.load(tmp_path / "nowhere", t.parts, t.ctx)


def test_failed_write_leaves_the_previous_checkpoint(config_dir, tmp_path, monkeypatch) -> None:
    t = trainer(config_dir, tmp_path, "steps=2")
    root = tmp_path / "checkpoints"
    first = checkpoint.save(root, 1, t.parts, t.ctx, {"samples_consumed": 32}, {}, keep_last=2)
    written = FileSystemWriter.write_data

    def fail_midway(self, plan, planner):
        written(self, plan, planner).wait()  # the shard files are written, then the disk "fills up"
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(FileSystemWriter, "write_data", fail_midway)
    with pytest.raises(checkpoint.CheckpointError, match="No space left on device.*previous checkpoints .* are intact"):
        checkpoint.save(root, 2, t.parts, t.ctx, {"samples_consumed": 64}, {}, keep_last=2)
    monkeypatch.undo()
    assert not (root / "step_000002").exists() and (root / ".tmp-step_000002").exists()
    assert checkpoint.resolve(root) == first
    restored = checkpoint.load(root, t.parts, t.ctx)
    assert restored.step == 1
    checkpoint.save(root, 2, t.parts, t.ctx, {"samples_consumed": 64}, {}, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_000001", "step_000002"]
