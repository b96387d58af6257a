"""Emulated hosts: shaped links between namespaces, torchrun on each, and nothing left behind.

Needs root (network namespaces); elsewhere each test skips with the machine's refusal.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from embshard import emulated_cpu
from embshard.emulated_cpu import ROOTS
from embshard.emulated_hosts import PREFIX, EmulatedHosts, EmulationUnavailable

ROOT = Path(__file__).resolve().parents[1]
ALLREDUCE = Path(__file__).with_name("emulated_allreduce.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.fixture
def hosts3():
    try:
        with EmulatedHosts(3, rate_gbit=0.2, delay_ms=0) as cluster:
            yield cluster
    except EmulationUnavailable as e:
        pytest.skip(f"emulated hosts unavailable (needs root and iproute2's ip/tc): {e}")


def test_three_hosts_meet_at_a_bridge_through_shaped_links(hosts3, tmp_path) -> None:
    h2 = hosts3.hosts[2]
    assert [h.address for h in hosts3.hosts] == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]
    assert all(ns in namespaces() for ns in (hosts3.switch, *(h.namespace for h in hosts3.hosts)))
    size_bytes = 5 * 2**20  # 0.21 s at 0.2 Gbit/s
    server = hosts3.spawn(2, [sys.executable, "-c", f"""
import socket, time
s = socket.create_server(("{h2.address}", 5001)); conn, _ = s.accept(); n = 0; t0 = time.perf_counter()
while (b := conn.recv(1 << 20)):
    n += len(b)
print(n, time.perf_counter() - t0)"""], log=tmp_path / "server.log")
    client = hosts3.spawn(0, [sys.executable, "-c", f"""
import socket, time
for _ in range(100):
    try:
        s = socket.create_connection(("{h2.address}", 5001)); break
    except ConnectionRefusedError:
        time.sleep(0.05)
s.sendall(b"x" * {size_bytes}); s.close()"""])
    assert [e.returncode for e in hosts3.wait([client, server], 60)] == [0, 0], (tmp_path / "server.log").read_text()
    received, seconds = (tmp_path / "server.log").read_text().split()
    gbit_s = int(received) * 8 / float(seconds) / 1e9
    assert int(received) == size_bytes and 0.1 < gbit_s < 0.21, gbit_s  # the 0.2 Gbit/s tbf is the bottleneck
    sender, bystander, receiver = (hosts3.link_bytes(h) for h in range(3))
    assert sender.sent_bytes > size_bytes and receiver.received_bytes > size_bytes
    assert bystander.received_bytes < 50_000  # the bridge forwards host 0 -> host 2 past host 1


def test_cli_runs_torchrun_on_two_hosts_and_the_link_rate_holds(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "embshard.emulated_hosts", "--hosts", "2", "--ranks-per-host", "1",
                           "--rate-gbit", "0.5", "--log-dir", str(tmp_path), "--timeout-s", "120", "--", str(ALLREDUCE)],
                          env={**ENV, "MB": "16"}, capture_output=True, text=True, timeout=180)
    if done.returncode == 2 and "error:" in done.stderr:
        pytest.skip(f"emulated hosts unavailable (needs root and iproute2's ip/tc): {done.stderr.strip()}")
    logs = [(tmp_path / f"host{h}.log").read_text() for h in range(2)]
    assert done.returncode == 0, (done.stderr, logs)
    rates = [float(re.search(r"([\d.]+) Gbit/s sent", log).group(1)) for log in logs]
    assert all(0.3 < r < 0.51 for r in rates), rates  # 16 MiB each way through a 0.5 Gbit/s link
    sent = [int(m.replace(",", "")) for m in re.findall(r"host \d: exit 0; sent ([\d,]+) B", done.stderr)]
    assert len(sent) == 2 and all(b > 2 * 16 * 2**20 for b in sent), done.stderr  # both all-reduces crossed
    assert "links: tbf 0.5 Gbit/s each way per host link" in done.stderr


def test_everything_is_removed_on_error_sigterm_and_after_a_crash(tmp_path) -> None:
    try:
        with EmulatedHosts(2, delay_ms=0) as cluster:
            created = {cluster.switch, *(h.namespace for h in cluster.hosts)}
            sleeper = cluster.spawn(1, ["sleep", "300"])
            raise KeyError("a failing test")
    except KeyError:
        pass
    except EmulationUnavailable as e:
        pytest.skip(f"emulated hosts unavailable (needs root and iproute2's ip/tc): {e}")
    assert not created & namespaces() and sleeper.poll() is not None
    # SIGTERM to the process holding the hosts; a namespace left by a SIGKILLed holder goes with the next run.
    holder = """
import sys, time
from embshard.emulated_hosts import EmulatedHosts
with EmulatedHosts(2, delay_ms=0) as c:
    c.spawn(0, ["sleep", "300"])
    print(c.switch, *(h.namespace for h in c.hosts), flush=True)
    time.sleep(300)"""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        p = subprocess.Popen([sys.executable, "-c", holder], env=ENV, stdout=subprocess.PIPE, text=True)
        names = set(p.stdout.readline().split())
        assert len(names) == 3 and names <= namespaces()
        p.send_signal(sig)
        p.wait(timeout=30)
        if sig == signal.SIGKILL:
            assert names <= namespaces()  # nothing could clean up; the next run does
            with EmulatedHosts(1, delay_ms=0):
                pass
        assert not names & namespaces(), (sig, names)
    assert not any(n.startswith(PREFIX) and n.split("-")[1] == str(os.getpid()) for n in namespaces())


def test_cli_says_why_it_cannot_run(tmp_path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ip").write_text("#!/bin/sh\necho 'mkdir /run/netns failed: Permission denied' >&2\nexit 1\n")
    (fake_bin / "ip").chmod(0o755)
    cli = [sys.executable, "-m", "embshard.emulated_hosts"]
    refused = subprocess.run([*cli, "--", "-m", "embshard.train"], env={**ENV, "PATH": f"{fake_bin}:{ENV['PATH']}"},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "python -m embshard.emulated_hosts: error: `ip netns add embshard-%s-0-sw` failed: mkdir /run/netns failed: "
        "Permission denied" % re.search(r"embshard-(\d+)-", refused.stderr).group(1)], refused.stderr
    nothing = subprocess.run(cli, env=ENV, capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 2 and nothing.stderr.splitlines() == [
        "python -m embshard.emulated_hosts: error: nothing to run: add -- -m MODULE ARGS (e.g. -- -m embshard.train "
        "steps=20)"]


def cpu_groups() -> set[str]:
    return {p.name for root in ROOTS if root.is_dir() for p in root.glob(f"{PREFIX}*")}


def test_capped_ranks_run_at_their_share_of_a_core_and_the_groups_go_with_the_run(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "embshard.emulated_hosts", "--hosts", "2", "--ranks-per-host", "1",
                           "--cpu-per-rank", "0.25", "--log-dir", str(tmp_path), "--timeout-s", "120", "--",
                           str(Path(__file__).with_name("emulated_burn.py"))],
                          env=ENV, capture_output=True, text=True, timeout=180)
    if done.returncode == 2 and "error:" in done.stderr:
        pytest.skip(f"emulated hosts or CPU caps unavailable (needs root, iproute2 and a cgroup CPU controller): "
                    f"{done.stderr.strip()}")
    logs = [(tmp_path / f"host{h}.log").read_text() for h in range(2)]
    assert done.returncode == 0, (done.stderr, logs)
    found = [re.search(r"rank (\d): wall/cpu ([\d.]+) cgroup /(embshard-\d+-\d+)/rank(\d)", log) for log in logs]
    assert all(found), logs
    assert [int(m.group(1)) for m in found] == [int(m.group(4)) for m in found] == [0, 1]  # each rank in its own group
    ratios = [float(m.group(2)) for m in found]
    assert all(3.0 < r < 5.5 for r in ratios), ratios  # a quarter of a core: about 4 s of wall clock per CPU second
    assert "each rank capped at 0.25 of a core" in done.stderr
    assert found[0].group(3) not in cpu_groups()


def test_cpu_caps_of_a_killed_run_go_with_the_next_run_and_bad_shares_are_refused() -> None:
    with pytest.raises(ValueError, match="cpu_per_rank=0: give a share of a core above 0"):
        EmulatedHosts(2, cpu_per_rank=0)
    try:
        root, _ = emulated_cpu._controller_root()
        dead = subprocess.Popen(["true"])
        dead.wait()
        (root / f"{PREFIX}{dead.pid}-0" / "rank0").mkdir(parents=True)  # as a SIGKILLed run leaves it
    except (emulated_cpu.CpuCapsUnavailable, OSError) as e:
        pytest.skip(f"no cgroup CPU controller to write to: {e}")
    assert f"{PREFIX}{dead.pid}-0" in cpu_groups()
    assert emulated_cpu.remove_stale(PREFIX) == [f"{PREFIX}{dead.pid}-0"]
    assert f"{PREFIX}{dead.pid}-0" not in cpu_groups()
