"""A torchrun job that cannot start ends every rank within the timeout with one line naming the cause
(python -m embshard.launch.torchrun, on localhost: a host that never joins, a master address nobody
answers on, a topology whose local_world_size disagrees with the ranks torchrun starts per host).

The three jobs start at once (each waits on a timeout or on torch's imports) and share the wall time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embshard.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
RDZV_TIMEOUT_S = 4
WRAPPER = [sys.executable, "-m", "embshard.launch.torchrun"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict:
    script = tmp_path_factory.mktemp("torchrun") / "never_started.py"
    script.write_text("raise SystemExit('a rank started')\n")
    rdzv = ["--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--rdzv-conf", f"timeout={RDZV_TIMEOUT_S}"]
    commands = {
        "no_join": [*WRAPPER, "--nnodes", "2", "--node-rank", "0", "--master-port", str(free_port()), *rdzv, str(script)],
        "no_master": [*WRAPPER, "--nnodes", "2", "--node-rank", "1", "--master-port", str(free_port()), *rdzv, str(script)],
        "local_world": [*WRAPPER, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "embshard.train",
                        "topology.world_size=2", "topology.local_world_size=1", f"out_dir={script.parent / 'out'}"],
    }
    t0 = time.monotonic()
    procs = {k: subprocess.Popen(c, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k, c in commands.items()}
    done = {}
    for k, p in procs.items():
        out, err = p.communicate(timeout=120)
        done[k] = (p.returncode, out + err, time.monotonic() - t0)
    return done


def errors(output: str, prog: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"{prog}: error:")]


def test_a_host_that_never_joins(jobs) -> None:
    code, output, seconds = jobs["no_join"]
    assert code == 2 and "Traceback" not in output and "a rank started" not in output, output
    assert errors(output, "embshard-torchrun") == [
        "embshard-torchrun: error: only 1 of 2 hosts joined the rendezvous at 127.0.0.1:%s within the timeout; start this "
        "command on every host (--node-rank 0..1, the same --master-addr and --master-port) or raise --rdzv-conf "
        "timeout=SECONDS" % output.split("rendezvous at 127.0.0.1:")[1].split()[0]], output
    assert seconds < 60


def test_an_unreachable_master_address(jobs) -> None:
    code, output, seconds = jobs["no_master"]
    assert code == 2 and "Traceback" not in output and "TCPStore" not in output, output
    lines = errors(output, "embshard-torchrun")
    assert len(lines) == 1 and lines[0].startswith("embshard-torchrun: error: the master address 127.0.0.1:") and \
        "did not answer within the timeout (node rank 1): check --master-addr/--master-port" in lines[0], output
    assert seconds < 60


def test_local_world_size_that_disagrees_with_torchrun(jobs) -> None:
    code, output, _ = jobs["local_world"]
    assert code == 2 and "Traceback" not in output, output
    assert errors(output, "embshard-train") == [
        "embshard-train: error: topology: world_size=2, local_world_size=1 but 2 rank(s) run, 2 per host; drop the "
        "topology.world_size/local_world_size overrides (the world size follows launcher.nproc or torchrun) or start as "
        "many ranks"], output  # once per host, not once per rank
    assert errors(output, "embshard-torchrun") == [
        "embshard-torchrun: error: rank 0 exited with status 2 (its output above says why); the other ranks of this host "
        "were stopped"], output
