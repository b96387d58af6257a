"""benchmarks/planner_scale.py: sizes in ascending order, TorchRec not started above a size where it missed its cap."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("planner_scale")


def test_sizes_run_smallest_first(bench):
    assert bench.case_sizes("1000x256,150x8,500x64", huge=False) == [(150, 8), (500, 64), (1000, 256)]
    assert bench.case_sizes(None, huge=True)[-1] == (10000, 2048)


def test_torchrec_is_not_started_above_a_size_where_it_missed_the_cap(bench, monkeypatch):
    calls = []

    def fake(config_dir, name, world_size, limit_s):
        calls.append(name)
        return {"process_wall_s": limit_s, "status": "did not finish in 10 min", "timed_out": True} if name == "scale_1000" else \
            {"process_wall_s": 1.0, "status": "ok", "planning_s": 1.0, "objective_ms": 1.0, "bound_ms": 1.0, "gap": 0.0}

    monkeypatch.setattr(bench, "run_torchrec_case", fake)
    rows = []
    for n, w in bench.case_sizes("5000x1024,150x8,1000x256,2000x512", huge=False):
        rows.append({"tables": n, "ranks": w, "before": {"rc": 1}, "after": {"rc": 1},
                     "torchrec": bench.torchrec_case(Path("."), f"scale_{n}", w, 600.0, rows)})
    assert calls == ["scale_150", "scale_1000"]  # 2,000 and 5,000 tables: never started
    assert [r["torchrec"]["status"] for r in rows][2:] == [bench.NOT_RUN] * 2
    meta = {"command": "c", "machine": "m", "date": "d", "base": "b", "head": "h", "load_before": "0", "load_after": "0",
            "budget_s": 10.0, "torchrec_limit_s": 600.0}
    text = bench.markdown(rows, meta, {}, Path("x.png"))
    assert text.count(f"| TorchRec planner | n/a | | n/a | | | n/a | n/a |  | {bench.NOT_RUN} |") == 2
    assert "killed after 10 min; once it misses that cap, larger sizes are not started" in text


def test_peak_rss_is_the_measured_process_not_the_benchmark_forking_it(bench, tmp_path):
    import json
    import subprocess
    import sys

    ballast = bytearray(400 * 2**20)  # this process holds 400 MiB, touched
    ballast[::4096] = b"x" * len(ballast[::4096])
    usage = tmp_path / "usage.json"
    child = [sys.executable, "-I", "-S", "-c", "import sys; sys.exit(3)"]
    rc = subprocess.run([sys.executable, "-I", "-S", "-c", bench.LAUNCHER, str(usage), *child]).returncode
    got = json.loads(usage.read_text())
    assert rc == 3  # the measured process's exit status is the launcher's
    assert got["maxrss_kib"] < 100 * 1024, got  # a bare interpreter, not the 400 MiB it was launched from
    assert got["cpu_s"] < 5
    del ballast
