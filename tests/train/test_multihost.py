"""embshard-train across 2 emulated hosts x 2 ranks (network namespaces, shaped veth links).

One fixed plan (a table on each sharding type; the row_wise one spans both hosts) is
trained three ways at once: M = 2 hosts x 2 ranks under torchrun, S = 1 host x 4 local ranks
(the reference), and K = 2 hosts x 2 ranks whose host 1 is killed after its first step. M
must give S's losses step by step; K's host 0 must exit within the collective timeout naming
host 1 and its ranks. Needs root (network namespaces): elsewhere the tests skip and say why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from embshard import planner
from embshard.emulated_hosts import EmulatedHosts, EmulationUnavailable
from embshard.train import config
from train_tables import CONFIGS, FAST_PLANNER, MODEL

STEPS = 4
TIMEOUT_S = 240  # a whole stage; every run below ends long before unless something hangs
KILL_TIMEOUT_S = 15  # K's collective timeout
LAYOUT = {"cat_0": "row_wise", "cat_1": "table_row_wise", "cat_2": "column_wise", "cat_3": "data_parallel",
          "cat_4": "table_wise"}


def args(config_dir: Path, out: Path, *extra: str) -> list[str]:
    return [f"--config-dir={config_dir}", "tables=criteo26", *MODEL, *FAST_PLANNER, "topology.batch_size_per_rank=16",
            "log_every_steps=1", "eval.every_steps=0", "eval.num_samples=64", f"out_dir={out}", *extra]


def fixed_plan(config_dir: Path, path: Path) -> Path:
    """A plan for 4 ranks on 2 hosts with one table on each sharding type (the rest where the planner puts them)."""
    overrides = [f"+constraints.tables.{t}.sharding_types=[{k}]" for t, k in LAYOUT.items()]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"hydra.searchpath=[file://{config_dir}]", *args(config_dir, path.parent)[1:],
                                          "topology.world_size=4", "topology.local_world_size=2", *overrides])
    s = config.settings_from_config(cfg)
    plan = planner.plan(s.specs, s.topology, s.constraints, time_budget_s=0.5)
    kinds = {t.name: t.sharding_type.value for t in plan.tables}
    assert all(kinds[t] == k for t, k in LAYOUT.items()), kinds
    plan.save(path)
    return path


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]


@pytest.fixture(scope="module")
def runs(config_dir, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("multihost")
    plan = fixed_plan(config_dir, tmp / "plan.json")
    common = [f"plan_file={plan}", f"steps={STEPS}", "launcher.collective_timeout_s=60"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    train = ["-m", "embshard.train"]
    try:
        with EmulatedHosts(2) as m, EmulatedHosts(2) as k, (tmp / "S.log").open("w") as log:
            single = subprocess.Popen([str(Path(sys.executable).parent / "embshard-train"),
                                       *args(config_dir, tmp / "S", *common, "launcher.nproc=4")],
                                      stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                (tmp / "M").mkdir(), (tmp / "K").mkdir()
                m_procs = m.torchrun(2, [*train, *args(config_dir, tmp / "M" / "out", *common)], env, tmp / "M")
                k_procs = k.torchrun(2, [*train, *args(config_dir, tmp / "K" / "out", f"plan_file={plan}", "steps=100000",
                                                       f"launcher.collective_timeout_s={KILL_TIMEOUT_S}")], env, tmp / "K")
                kill = kill_host_1_after_first_step(k, k_procs, tmp / "K" / "out" / "metrics.jsonl")
                m_exits = m.wait(m_procs, TIMEOUT_S)
                links = [m.link_bytes(h) for h in range(2)]
                single.wait(timeout=TIMEOUT_S)
            finally:
                if single.poll() is None:
                    os.killpg(single.pid, signal.SIGKILL)
                    single.wait()
    except EmulationUnavailable as e:
        pytest.skip(f"emulated hosts unavailable (needs root and iproute2's ip/tc): {e}")
    return {"tmp": tmp, "M": m_exits, "S": single.returncode, "K": kill, "links": links}


def kill_host_1_after_first_step(cluster: EmulatedHosts, procs, metrics: Path) -> tuple[float, int | None]:
    """SIGKILL every process of K's host 1 once rank 0 logged a step; seconds until host 0's torchrun exited."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (metrics.exists() and metrics.stat().st_size) and procs[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    cluster.kill_host(1)
    killed = time.monotonic()
    exits = cluster.wait(procs[:1], KILL_TIMEOUT_S + 30)
    return time.monotonic() - killed, exits[0].returncode


def test_two_hosts_train_like_one_host_step_by_step(runs) -> None:
    tmp = runs["tmp"]
    assert runs["S"] == 0, (tmp / "S.log").read_text()[-3000:]
    for e in runs["M"]:
        assert e.returncode == 0, e.log.read_text()[-3000:]
    got, want = losses(tmp / "M" / "out"), losses(tmp / "S")
    assert len(got) == STEPS and got == want, (got, want)
    host0, host1 = runs["links"]  # the ranks talked across the emulated link (GLOO_SOCKET_IFNAME)
    assert host0.sent_bytes > 100_000 and abs(host0.sent_bytes - host1.received_bytes) < 0.01 * host0.sent_bytes


def test_killed_host_stops_the_other_within_the_collective_timeout(runs) -> None:
    tmp = runs["tmp"]
    kill_s, code = runs["K"]
    text = (tmp / "K" / "host0.log").read_text()
    assert code not in (0, None) and kill_s < KILL_TIMEOUT_S + 10, (kill_s, code, text[-3000:])
    errors = [line for line in text.replace("\r", "\n").splitlines() if "embshard-train: error:" in line]
    assert errors and all("lost contact with the other ranks" in e and "; no answer from host 1 (10.213.0.2): "
                          "ranks 2, 3 (all of its ranks) (" in e for e in errors), errors
    assert any(f"embshard-train: error: rank {r}:" in e for e in errors for r in (0, 1)), errors
