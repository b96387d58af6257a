"""Checkpoints in one process (the unsharded reference, DCP without a process group):
exact resume, refusal of mismatched, damaged or corrupt checkpoints with nothing touched
(checksums first; the allow-listed unpickler and DCP's reader on checkpoints without them),
and a write that fails midway leaving the previous checkpoint loadable."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from embshard.fsutil import sha256_file
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


def test_every_file_is_recorded_with_its_checksum(trained) -> None:
    step_dir = trained / "step_000006"
    files = json.loads((step_dir / "train_state.json").read_text())["files"]
    assert sorted(files) == sorted(p.name for p in step_dir.iterdir() if p.name != "train_state.json")
    assert {".metadata", "__0_0.distcp", "rank_0.json"} <= set(files)
    for name, entry in files.items():
        assert entry == {"sha256": sha256_file(step_dir / name), "bytes": (step_dir / name).stat().st_size}, name


def test_damaged_checkpoint_stops_resume_and_one_without_checksums_loads_with_a_warning(config_dir, trained,
                                                                                       tmp_path) -> None:
    flipped = tmp_path / "flipped" / "step_000003"
    corrupt(trained / "step_000003", flipped, "flipped")
    with pytest.raises(ValueError, match=r"checkpoint .*/flipped/step_000003/__0_0\.distcp: damaged"):
        trainer(config_dir, tmp_path / "refused", "optim=adam", f"checkpoint.resume_from={flipped.parent}")
    assert not (tmp_path / "refused" / "checkpoints").exists()
    old = tmp_path / "old" / "step_000003"
    corrupt(trained / "step_000003", old, "none", legacy=True)
    with pytest.warns(checkpoint.CheckpointWarning, match="written without checksums"):
        t = trainer(config_dir, tmp_path / "resumed", "steps=6", "optim=adam", f"checkpoint.resume_from={old}")
    t.train()
    final, resumed = checkpoint.read_tables(trained), checkpoint.read_tables(tmp_path / "resumed" / "checkpoints")
    assert all(torch.equal(final[k], v) for k, v in resumed.items())


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


def without_checksums(step_dir: Path) -> None:
    """Make ``step_dir`` look like a checkpoint written before checksums."""
    state = json.loads((step_dir / "train_state.json").read_text())
    del state["files"]
    (step_dir / "train_state.json").write_text(json.dumps(state))


def flip_16_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
    path.write_bytes(bytes(data))


def corrupt(src: Path, dst: Path, how: str, legacy: bool = False) -> None:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    if legacy:
        without_checksums(dst)
    if how == "flipped":
        flip_16_bytes(dst / "__0_0.distcp")
    elif how == "rank_file":
        (dst / "rank_0.json").write_text("\n")
    elif how == "pickle":
        (dst / ".metadata").write_bytes(pickle.dumps(Payload()))
    elif how == "truncated":
        shard = dst / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])
    elif how == "state":
        (dst / "train_state.json").write_text("{not json")
    elif how == "state_keys":
        (dst / "train_state.json").write_text('{"format": "embshard-train-checkpoint", "version": 1}')
    elif how == "metadata":
        (dst / ".metadata").unlink()


@pytest.mark.parametrize("how,legacy,needle", [
    # checksums recorded while writing: the damaged file is named before anything is read
    ("flipped", False, "step_000006/__0_0.distcp: damaged (its SHA-256 or size differs"),
    ("rank_file", False, "step_000006/rank_0.json: damaged"),
    ("pickle", False, "step_000006/.metadata: damaged"),
    ("metadata", False, "step_000006/.metadata: cannot read it (No such file or directory)"),
    ("state", False, "train_state.json is unreadable or corrupt"),
    ("state_keys", False, "train_state.json lacks ['step', 'world_size', 'tables', 'dense', 'dense_optimizer']"),
    # checkpoints written before checksums: the readers' own defenses
    ("pickle", True, "posix.system is not part of DCP's metadata"),
    ("truncated", True, "cannot read its tensors, the files are corrupt or truncated"),
    ("metadata", True, ".metadata) is missing, corrupt or not DCP's"),
    ("rank_file", True, "step_000006/rank_0.json: unreadable or not JSON (Expecting value: line 2 column 1 (char 1))"),
])
def test_corrupt_checkpoint_is_refused(config_dir, trained, tmp_path, how, legacy, needle) -> None:
    bad = tmp_path / "step_000006"
    corrupt(trained / "step_000006", bad, how, legacy)
    t = trainer(config_dir, tmp_path / "run", "optim=adam")
    before = tables(t)
    with pytest.raises(ValueError, match=re.escape(needle)), \
            pytest.warns(checkpoint.CheckpointWarning) if legacy else contextlib.nullcontext():
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
    assert checkpoint.resolve(root, "checkpoint") == first
    restored = checkpoint.load(root, t.parts, t.ctx)
    assert restored.step == 1
    checkpoint.save(root, 2, t.parts, t.ctx, {"samples_consumed": 64}, {}, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_000001", "step_000002"]
