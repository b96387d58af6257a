"""Serving parity: 2 gloo ranks loading exported artifacts answer as the trained model does.

One group of 2 rank processes (predict_worker.py) loads the fp32, int8 and fp16 artifacts of
the shared trained run, and a tampered copy of the fp32 one; each rank predicts its slice of
N held-out synthetic samples (the data's eval split, never trained on) and looks up every row
of every table. The reference is the unsharded DLRM with the checkpoint's weights (what
embshard-train's eval computes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torchmetrics.functional.classification import binary_auroc

from conftest import HOT_ROWS
from embshard.ports import free_port
from predict_worker import SMALL_BATCH, rank_cuts

WORKER = Path(__file__).resolve().parent / "predict_worker.py"
REPO = Path(__file__).resolve().parents[2]
WORLD_SIZE = 2
DTYPES = ("fp32", "int8", "fp16")
TIMEOUT_S = 180


def run_ranks(world_size: int, inputs: Path, out: Path, artifacts: list[Path]) -> None:
    """Start the worker on every rank and wait (killed at the timeout); a failed rank fails the test."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, str(WORKER), "--rank", str(r), "--world-size", str(world_size),
                               "--port", str(port), "--inputs", str(inputs), "--out", str(out), *map(str, artifacts)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world_size)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            logs.append(p.communicate()[0])
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{logs[r][-4000:]}"


@pytest.fixture(scope="module")
def served(reference, artifact, tmp_path_factory) -> dict:
    """What the 2 serving ranks answered, per artifact (fp32, int8, fp16, tampered)."""
    tmp = tmp_path_factory.mktemp("served")
    samples, layout = reference["samples"], reference["layout"]
    tensors = {"dense": torch.from_numpy(samples.dense)}
    for f, lengths, values in zip(layout.features, samples.lengths, samples.values):
        tensors[f"lengths.{f.name}"] = torch.from_numpy(np.ascontiguousarray(lengths))
        tensors[f"values.{f.name}"] = torch.from_numpy(values)
    save_file(tensors, tmp / "inputs.safetensors")
    artifacts = [artifact(d, WORLD_SIZE) for d in DTYPES]
    tampered = tmp / "tampered"
    shutil.copytree(artifacts[0], tampered)
    data = bytearray((tampered / "rank_1.safetensors").read_bytes())
    data[-1] ^= 0xFF  # one bit pattern in the last stored float
    (tampered / "rank_1.safetensors").write_bytes(bytes(data))
    run_ranks(WORLD_SIZE, tmp / "inputs.safetensors", tmp, [*artifacts, tampered])
    out = {}
    for i, name in enumerate([*DTYPES, "tampered"]):
        per_rank = []
        for r in range(WORLD_SIZE):
            info = json.loads((tmp / f"rank{r}_{i}.json").read_text())
            tensors = load_file(tmp / f"rank{r}_{i}.safetensors") if "error" not in info else {}
            per_rank.append({**info, **tensors})
        out[name] = per_rank
    return out


def scores(served: dict, dtype: str, key: str = "scores") -> torch.Tensor:
    return torch.cat([rank[key] for rank in served[dtype]])


def table_rows(served: dict, dtype: str, feature: str) -> torch.Tensor:
    """Every row of a feature's table, reassembled from the ranks' strided lookups."""
    parts = [rank[f"rows.{feature}"] for rank in served[dtype]]
    rows = torch.empty(sum(p.shape[0] for p in parts), parts[0].shape[1])
    for r, part in enumerate(parts):
        rows[r::WORLD_SIZE] = part
    return rows


def test_fp32_predictions_equal_the_trained_model(served, reference, artifact):
    plan = json.loads((artifact("fp32", WORLD_SIZE) / "plan.json").read_text())
    assert {t["sharding_type"] for t in plan["tables"]} == {"row_wise", "table_wise", "column_wise", "data_parallel"}
    # the run trained with hot rows (conftest.HOT_ROWS); the artifact keeps them on the tables it shards row-wise
    assert {t["name"]: t.get("hot_rows", 0) for t in plan["tables"] if t.get("hot_rows")} == HOT_ROWS, plan["tables"]
    got, want = scores(served, "fp32"), reference["scores"]
    n = len(reference["samples"].labels)
    assert n == 4096 and got.shape == (n,)
    assert rank_cuts(n, WORLD_SIZE) == [0, int(n * 0.6), n]
    assert torch.allclose(got, want, atol=1e-5, rtol=0), f"max |diff| {float((got - want).abs().max()):.2e}"
    small = scores(served, "fp32", "scores_small")  # rank 0 five samples, rank 1 none
    assert served["fp32"][1]["scores_small"].numel() == 0
    assert torch.allclose(small, want[:SMALL_BATCH], atol=1e-5, rtol=0)


def test_int8_auc_within_0002_of_fp32_and_fp16_close(served, reference):
    labels = torch.from_numpy(reference["samples"].labels).int()
    auc = {d: float(binary_auroc(scores(served, d), labels)) for d in DTYPES}
    assert auc["fp32"] > 0.75, f"the trained model should have learned the planted signal: AUCs {auc}"
    assert abs(auc["int8"] - auc["fp32"]) <= 0.002, f"int8 AUC {auc['int8']:.5f} vs fp32 AUC {auc['fp32']:.5f}"
    assert abs(auc["fp16"] - auc["fp32"]) <= 0.0005, f"fp16 AUC {auc['fp16']:.5f} vs fp32 AUC {auc['fp32']:.5f}"
    fp16_diff = float((scores(served, "fp16") - scores(served, "fp32")).abs().max())
    assert fp16_diff < 2e-3, f"fp16 scores differ from fp32 by up to {fp16_diff:.2e}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_lookup_returns_the_checkpoint_rows(served, reference, dtype):
    run = reference["run"]
    for spec in run.specs:
        want = reference["tables"][spec.name]
        for feature in spec.feature_names:
            got = table_rows(served, dtype, feature)
            assert got.shape == want.shape, feature
            err = float((got - want).abs().max())
            if dtype == "fp32":
                assert torch.equal(got, want), f"{feature}: fp32 rows differ by up to {err:.2e}"
            elif dtype == "fp16":
                assert torch.equal(got, want.half().float()), f"{feature}: not the fp16-rounded rows ({err:.2e})"
            else:  # half a quantization step (range / 255 / 2) per row, plus fp16 rounding of scale and bias
                step = (want.max(1).values - want.min(1).values) / 255
                bound = step / 2 + 1e-3 * want.abs().max(1).values + 1e-6
                assert bool(((got - want).abs() <= bound[:, None]).all()), f"{feature}: int8 rows off by up to {err:.2e}"
    # rank 0 looked up rows 0..2 of the first feature while rank 1 asked for none
    assert torch.equal(served[dtype][0]["empty_lookup"], table_rows(served, dtype, reference["layout"].pooled[0].name)[:3])
    assert served[dtype][1]["empty_lookup"].shape[0] == 0


def test_int8_artifact_needs_less_embedding_memory(served):
    fp32 = [r["memory_bytes"]["embedding_weights"] for r in served["fp32"]]
    int8 = [r["memory_bytes"]["embedding_weights"] for r in served["int8"]]
    assert sum(int8) < 0.5 * sum(fp32), f"per-rank embedding bytes fp32 {fp32}, int8 {int8}"
    assert all(r["memory_bytes"]["dense_weights"] > 0 for r in served["fp32"])


def test_tampered_artifact_is_refused_on_every_rank(served):
    for r, rank in enumerate(served["tampered"]):
        assert "error" in rank, f"rank {r} loaded a tampered artifact"
        assert "rank_1.safetensors" in rank["error"] and "checksum" in rank["error"], rank["error"]
