"""embshard-export: what an artifact holds (replicas, or with split=true none), file modes, and bad input
refused with one line and nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import BIN, HOT_ROWS
from embshard.serving.artifact import MANIFEST, ArtifactError, read_hot_ids, read_manifest, sha256_file, verified_bytes
from embshard.serving.export import ExportSettings, export
from embshard.train import checkpoint


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def flip_16_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
    path.write_bytes(bytes(data))


def test_artifact_lists_every_file_with_its_checksum(artifact):
    folder = artifact("int8", 2)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["world_size"] == 2
    assert sorted(manifest["files"]) == ["dense.safetensors", "hot_ids.npz", "model.json", "plan.json", "rank_0.safetensors",
                                         "rank_1.safetensors"]
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == sha256_file(folder / name), name
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["search"]["inference"] is True
    model = json.loads((folder / "model.json").read_text())
    assert {t["dtype"] for t in model["tables"]} == {"int8"}
    with pytest.raises(ArtifactError, match="planned for 2 rank"):
        read_manifest(folder, 3)


def test_hot_rows_of_the_run_are_replicas_on_every_rank(artifact, reference, trained_run, tmp_path):
    """The run trained with hot rows (conftest.HOT_ROWS): where the serving plan shards those tables, every rank
    file holds NAME@hot, the checkpoint's rows at the run's sorted hot ids, and hot_ids.npz those ids; split=true
    (every row on one rank only) and whole-table replicas keep none."""
    folder = artifact("fp32", 2)
    ranking = np.load(trained_run.parent / "hot_ids.npz")  # what the run trained with (conftest.hot_row_plan)
    with np.load(folder / "hot_ids.npz", allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(HOT_ROWS)
        for name, h in HOT_ROWS.items():
            ids = np.sort(ranking[name][:h])
            assert np.array_equal(npz[name], ids), name
            for r in range(2):
                rows = load_file(folder / f"rank_{r}.safetensors")[f"{name}@hot.weight"]
                assert torch.equal(rows, reference["tables"][name][torch.from_numpy(ids)]), (name, r)
    split = export(ExportSettings(checkpoint=trained_run, out=tmp_path / "split", split=True, time_budget_s=0.5))
    assert not (split / "hot_ids.npz").exists()
    assert not any("@hot" in k for r in range(2) for k in load_file(split / f"rank_{r}.safetensors"))


def test_missing_hot_ids_are_refused_naming_the_file(trained_run, artifact, tmp_path):
    """The run's plan names a hot-ids file that is gone: export refuses, writing nothing; an artifact whose plan has
    hot rows but whose manifest lists no hot_ids.npz does not load."""
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    plan = json.loads((copy / "plan.json").read_text())
    plan["hot_ids_file"] = str(tmp_path / "gone.npz")
    (copy / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(ValueError, match="gone.npz"):
        export(ExportSettings(checkpoint=copy, out=tmp_path / "out", time_budget_s=0.2))
    assert leftovers(tmp_path) == ["run"]
    folder = artifact("fp32", 2)
    manifest = read_manifest(folder, 2)
    del manifest["files"]["hot_ids.npz"]
    with pytest.raises(ArtifactError, match="hot_ids.npz"):
        read_hot_ids(folder, manifest)


def test_a_changed_file_is_refused_by_name(artifact, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(artifact("fp32", 2), copy)
    manifest = read_manifest(copy, 2)
    (copy / "model.json").write_text((copy / "model.json").read_text().replace('"dot"', '"dcn"'))
    with pytest.raises(ArtifactError, match=r"model.json: checksum mismatch"):
        verified_bytes(copy, manifest, "model.json")
    (copy / "plan.json").unlink()
    with pytest.raises(ArtifactError, match=r"plan.json: cannot read it"):
        verified_bytes(copy, manifest, "plan.json")


@pytest.mark.parametrize("change, message", [
    ({"table_dtypes": {"nope": "int8"}}, r"table_dtypes.nope: no such table; the run's tables are \['t0'"),
    ({"table_dtypes": {"t0": "int4"}}, r"table_dtypes.t0: must be one of \['fp16', 'fp32', 'int8'\], got 'int4'"),
    ({"dtype": "bf16"}, r"dtype: must be one of"),
    ({"hbm_gib": 1e-6}, r"infeasible: .*Fix: raise topology.hbm_gib"),
    ({"checkpoint": Path("/nonexistent/run")}, r"checkpoint=/nonexistent/run: no such folder"),
    ({"split": True, "constraints": {"tables": {"t3": {"sharding_types": ["data_parallel"]}}}},
     r"split: constraints.tables.t3 allows only data_parallel"),
])
def test_bad_settings_are_refused_before_anything_is_written(trained_run, tmp_path, change, message):
    out = tmp_path / "artifact"
    with pytest.raises(ValueError, match=message):
        export(ExportSettings(**{"checkpoint": trained_run, "out": out, "time_budget_s": 0.2, **change}))
    assert leftovers(tmp_path) == []


def test_a_damaged_or_missing_checkpoint_is_refused_naming_the_file(trained_run, tmp_path):
    """Checksums recorded while training wrote the checkpoint are checked before export reads or writes anything;
    a checkpoint without them (older embshard) still exports, and a truncated file is then caught on reading."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=rf"^checkpoint={empty}: no checkpoint there"):
        export(ExportSettings(checkpoint=empty, out=tmp_path / "artifact"))
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    step_dir = next((copy / "checkpoints").glob("step_*"))
    data = (step_dir / "__0_0.distcp").read_bytes()
    flip_16_bytes(step_dir / "__0_0.distcp")
    with pytest.raises(ValueError, match=rf"checkpoint {step_dir}/__0_0\.distcp: damaged"):
        export(ExportSettings(checkpoint=copy, out=tmp_path / "artifact", time_budget_s=0.2))
    state = json.loads((step_dir / "train_state.json").read_text())
    del state["files"]
    (step_dir / "train_state.json").write_text(json.dumps(state))
    (step_dir / "__0_0.distcp").write_bytes(bytes(data[:100]))
    with pytest.warns(checkpoint.CheckpointWarning, match="without checksums"), \
            pytest.raises(ValueError, match="the files are corrupt or truncated"):
        export(ExportSettings(checkpoint=copy, out=tmp_path / "artifact", time_budget_s=0.2))
    assert leftovers(tmp_path) == ["empty", "run"]


def test_split_holds_every_row_once_and_files_have_normal_modes(trained_run, tmp_path):
    """By default the planner replicates these small tables (both rank files alike); split=true keeps every
    row on one rank only. Every file of an artifact has the mode of a normal file (0666 less the umask)."""
    def rank_elements(folder: Path) -> list[dict[str, int]]:
        return [{k: t.numel() for k, t in load_file(folder / f"rank_{r}.safetensors").items()} for r in range(2)]
    default = export(ExportSettings(checkpoint=trained_run, out=tmp_path / "default", time_budget_s=0.5))
    specs = {t["name"]: t["num_embeddings"] * t["embedding_dim"]
             for t in json.loads((default / "model.json").read_text())["tables"]}
    replicated = rank_elements(default)
    assert replicated[0] == replicated[1] == {f"{t}.weight": n for t, n in specs.items()}
    split = export(ExportSettings(checkpoint=trained_run, out=tmp_path / "split", split=True, time_budget_s=0.5))
    held = rank_elements(split)
    assert held[0] != held[1] and all(sum(h.values()) < sum(specs.values()) for h in held), held
    assert {t: sum(h.get(f"{t}.weight", 0) for h in held) for t in specs} == specs  # every row once
    types = {t["name"]: t["sharding_type"] for t in json.loads((split / "plan.json").read_text())["tables"]}
    assert set(types) == set(specs) and "data_parallel" not in types.values(), types
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in split.iterdir()}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes


def test_existing_out_needs_overwrite(trained_run, artifact, tmp_path):
    existing = artifact("fp32", 2)
    with pytest.raises(ValueError, match="already exists; choose another folder or pass overwrite=true"):
        export(ExportSettings(checkpoint=trained_run, out=existing))
    with pytest.raises(ValueError, match="world_size: must be a positive integer"):
        ExportSettings(checkpoint=trained_run, out=tmp_path / "a", world_size=0)


def test_cli_bad_input_ends_in_one_line_and_no_artifact(trained_run, tmp_path):
    """Three command lines at once (each start imports torch): a corrupt checkpoint, a typo, and one good
    export (exit 0, a complete artifact). A missing checkpoint is refused in-process above."""
    corrupt = tmp_path / "corrupt_run"
    shutil.copytree(trained_run, corrupt)
    shard = next((corrupt / "checkpoints").glob("step_*/__1_0.distcp"))
    flip_16_bytes(shard)  # inside the tensors: only the checksum tells
    cases = {
        "corrupt": ([f"checkpoint={corrupt}"], f"{shard}: damaged"),
        "typo": ([f"checkpoint={trained_run}", "dtpye=int8"], "dtpye"),
    }
    command = [str(BIN / "embshard-export"), "time_budget_s=0.2"]
    good = subprocess.Popen([*command, f"checkpoint={trained_run}", f"out={tmp_path / 'good'}", "world_size=1",
                             "dtype=fp16", "+table_dtypes={t0: int8}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    procs = {name: subprocess.Popen([*command, *args, f"out={tmp_path / name / 'artifact'}"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, (args, _) in cases.items()}
    stdout, stderr = good.communicate(timeout=180)
    assert good.returncode == 0, stderr[-2000:]
    assert f"wrote {tmp_path / 'good'} (1 serving rank)" in stdout
    tables = json.loads((tmp_path / "good" / "model.json").read_text())["tables"]
    assert {t["name"]: t["dtype"] for t in tables} == {"t0": "int8", "t1": "fp16", "t2": "fp16", "t3": "fp16", "item": "fp16"}
    read_manifest(tmp_path / "good", 1)
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        lines = stderr.strip().splitlines()
        assert proc.returncode == 2, f"{name}: exit {proc.returncode}\n{stderr[-2000:]}"
        assert len(lines) == 1 and lines[0].startswith("embshard-export: error: "), f"{name}: {stderr[-2000:]}"
        assert cases[name][1] in lines[0], f"{name}: {lines[0]}"
        assert leftovers(tmp_path / name) == [], f"{name} left {leftovers(tmp_path / name)}"
