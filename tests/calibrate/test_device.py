"""Device selection, the rank clock, one-GPU fits and the cuda refusals (mocks; this machine has no GPU)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from embshard.calibrate import calibrate, device
from embshard.calibrate.calibrate import comm_note, fit_data, profile_topology, profile_yaml
from embshard.calibrate.device import clock_reader, resolve_device
from embshard.cli import CONFIG_DIR
from embshard.calibrate.fit import Fit
from embshard.planner import manual_plan
from embshard.specs import TableSpec
from embshard.topology import DEVICE_DEFAULTS, Topology

BIN = Path(sys.executable).parent


def test_auto_takes_cuda_only_where_torch_sees_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"^device=cuda: no CUDA device on this machine .*use device=cpu, or device=auto"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda") == "cuda" and resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"device: must be one of \['cpu', 'cuda', 'auto'\], got 'gpu'"):
        resolve_device("gpu")


def test_cpu_clock_is_process_time_and_cuda_clock_synchronizes(monkeypatch):
    read = clock_reader("cpu")
    c0, w0 = read()
    time.sleep(0.05)  # sleeping costs no CPU time
    c1, w1 = read()
    assert w1 - w0 >= 0.05 and c1 - c0 < 0.04
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(1))
    read = clock_reader("cuda")
    r0, w0 = read()
    time.sleep(0.05)
    r1, w1 = read()
    assert len(syncs) == 2 and r0 == w0 and r1 == w1 and r1 - r0 >= 0.05  # wall time after synchronizing, both readings


def test_cuda_world_sizes_are_limited_to_the_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    logged = []
    assert calibrate.runnable_world_sizes([2, 4], "cuda", "collectives", logged.append) == []
    assert "skipping world sizes [2, 4]: nccl runs one rank per GPU" in logged[0]
    assert calibrate.runnable_world_sizes([2, 4], "cpu", "collectives", logged.append) == [2, 4] and len(logged) == 1
    assert device.local_ranks_available("cuda", 1)


def _one_gpu_data() -> dict:
    """What a one-GPU run writes: kernel points only (values from the fbgemm/dp cost shape), no collectives or plans."""
    rows = []
    for kind, n, d, b, p in [("fbgemm", 1000, 16, 64, 2.0), ("fbgemm", 100000, 64, 512, 8.0), ("fbgemm", 1000, 64, 512, 8.0),
                             ("dp", 1000, 16, 64, 2.0), ("dp", 1000, 64, 512, 8.0), ("fbgemm", 100000, 16, 64, 2.0)]:
        ids = b * p
        rows.append({"kind": kind, "pooled": True, "rows": n, "dim": d, "batch": b, "pooling": p,
                     "cpu_input_dist_ms": 0.05 + 1e-5 * ids, "cpu_lookup_fwd_ms": 0.02 + 2e-6 * ids * d / 16,
                     "cpu_output_dist_fwd_ms": 0.03, "cpu_output_dist_bwd_ms": 0.03,
                     "cpu_lookup_bwd_ms": 0.04 + 4e-6 * ids * d / 16, "cpu_dp_allreduce_ms": 0.0})
    return {"device": "cuda", "kernels": rows, "collectives": [], "plans": [],
            "machine_start": {"cpu": "host", "cores": 16, "gpu": "NVIDIA H200", "num_gpus": 1, "load_avg": [0.1]},
            "machine_end": {"date": "2026-11-30T07:00:00", "load_avg": [0.1]}}


def test_one_gpu_keeps_the_datasheet_communication_and_says_so():
    data = _one_gpu_data()
    result = fit_data(data)
    base = Topology(world_size=8, local_world_size=8, hbm_gib=139, device="cuda")
    topo = profile_topology(base, data, result)
    assert topo.intra_host_gb_per_s == pytest.approx(DEVICE_DEFAULTS["cuda"]["intra_host_gb_per_s"])
    assert topo.collective_ms == 0 and topo.full_duplex is True and topo.device == "cuda"
    assert topo.hbm_gb_per_s > 0 and topo.lookup_fwd_call_ms > 0
    # no allreduce-mode kernel points (an older calibration's data): the dense rate keeps the device's default
    assert topo.dp_dense_gb_per_s == pytest.approx(DEVICE_DEFAULTS["cuda"]["dp_dense_gb_per_s"])
    note = comm_note(data)
    assert note.startswith("communication not measured") and "cuda datasheet 150 GB/s" in note
    text = profile_yaml(topo, data, result, "embshard-calibrate device=cuda")
    assert "NVIDIA H200" in text and "torch.cuda.synchronize" in text and note in text and "factors are 1" in text
    back = Topology.from_dict(yaml.safe_load(text))
    assert back.device == "cuda" and back.intra_host_gb_per_s == pytest.approx(150.0) and back.full_duplex is True
    # measured collectives are fitted, not replaced by the datasheet
    assert comm_note({"device": "cpu", "collectives": [{}]}) is None
    assert profile_topology(base, {"collectives": [{}]}, Fit({}, {}, {})).full_duplex is False


def test_calibrate_device_cuda_without_a_gpu_is_one_line():
    run = subprocess.run([str(BIN / "embshard-calibrate"), "profile=x_test", "device=cuda"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("embshard-calibrate: error: device=cuda: no CUDA device on this machine")
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    cfg = yaml.safe_load((Path(CONFIG_DIR) / "calibrate.yaml").read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("defaults", "hydra")}
    calibrate.validate(cfg)  # the shipped config, device: cpu
    with pytest.raises(ValueError, match=r"device: must be one of \['cpu', 'cuda', 'auto'\] \(auto: cuda where torch sees a GPU\), got 'tpu'"):
        calibrate.validate({**cfg, "device": "tpu"})


def test_plan_measure_follows_the_topology_device(tmp_path, monkeypatch):
    from embshard.calibrate.report import check_runnable

    plan = manual_plan([TableSpec("t", 100, 8, 1.0)], Topology(world_size=2, local_world_size=2, hbm_gib=1, device="cuda"),
                       {"t": ("table_wise", [0])})
    with pytest.raises(ValueError, match=r"measure: topology.device=cuda: no CUDA device on this machine .*topology=cpu"):
        check_runnable(plan)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="the plan has 2 cuda ranks but this machine has fewer GPUs"):
        check_runnable(plan)
    run = subprocess.run([str(BIN / "embshard-plan"), "topology=gpu", "topology.world_size=2", "topology.local_world_size=2",
                          "planner.time_budget_s=0.2", f"out={tmp_path / 'p.json'}", "measure=true"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 2 and run.stderr.startswith("embshard-plan: error: measure: topology.device=cuda: no CUDA device")
