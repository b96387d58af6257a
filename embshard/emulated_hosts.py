"""Emulated hosts: H network namespaces on one machine, joined by shaped links, for multi-host rehearsals.

    python -m embshard.emulated_hosts --hosts 2 --ranks-per-host 2 -- -m embshard.train steps=20
    python -m embshard.emulated_hosts --hosts 3 --rate-gbit 1 --delay-ms 0.5 -- -m embshard.train ...

Each host is a namespace ``embshard-PID-N-hH`` with loopback and one veth link ``veth0``
(address 10.213.0.H+1/24); the links meet at a bridge in a namespace of its own (``...-sw``),
so nothing is created in the machine's own namespace and nothing outside is contacted.
Each link is shaped both ways with ``tc``: tbf at ``rate_gbit``, plus netem ``delay_ms``
where the kernel has netem (else the delay is skipped with a warning; see ``shaping``).
``torchrun`` starts once per host (``--nnodes H --node-rank H``; the rendezvous store on
host 0's address, ``GLOO_SOCKET_IFNAME=veth0``), rank r on host r // ranks_per_host like
torchrun on real hosts. With ``cpu_per_rank`` each rank runs in a cgroup capped at that share of a
core (embshard/emulated_cpu.py: a rank of a real cluster cannot lend its device to the others). Everything
created is removed on exit, also on an error, Ctrl-C or SIGTERM; namespaces and cgroups left by a killed
run (its pid gone) are removed by the next one.
Needs root (CAP_SYS_ADMIN): elsewhere ``EmulatedHosts`` raises ``EmulationUnavailable``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from embshard import emulated_cpu
from embshard.emulated_cpu import CpuCapsUnavailable, RankCpuCaps

PREFIX = "embshard-"
IFNAME = "veth0"
MASTER_PORT = 29500  # free by construction: nothing else listens inside a fresh namespace
_runs = itertools.count()


class EmulationUnavailable(RuntimeError):
    """The machine refused to create namespaces or links (not root, no ``ip``, no tbf), or CPU caps."""


@dataclass(frozen=True)
class Host:
    index: int
    namespace: str
    address: str  # on IFNAME, inside the namespace


@dataclass(frozen=True)
class LinkBytes:
    """A host link's counters since it was created (what crossed between this host and the others)."""
    sent_bytes: int
    received_bytes: int


@dataclass(frozen=True)
class HostExit:
    host: int
    returncode: int | None  # None: still running at the timeout (then killed)
    log: Path | None

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def _ip(*args: str, check: bool = True) -> str:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as e:
        raise EmulationUnavailable("the `ip` command (iproute2) is not installed") from e
    if check and done.returncode:
        raise EmulationUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _kill_namespace_processes(namespace: str, sig: int = signal.SIGKILL) -> list[int]:
    pids = [int(p) for p in _ip("netns", "pids", namespace, check=False).split()]
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def _delete_namespace(namespace: str) -> None:
    _kill_namespace_processes(namespace)
    _ip("netns", "del", namespace, check=False)


def remove_stale() -> list[str]:
    """Delete namespaces this module created in runs whose process is gone; their names."""
    stale = []
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.fullmatch(re.escape(PREFIX) + r"(\d+)-\d+-(?:h\d+|sw)", name)
        if m and not emulated_cpu.pid_alive(int(m.group(1))):
            _delete_namespace(name)
            stale.append(name)
    return stale


class _Terminated(Exception):
    """SIGTERM reached the process holding the emulated hosts."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated("SIGTERM")


class EmulatedHosts:
    """``with EmulatedHosts(2) as hosts: ...``: H namespaces with shaped links, removed on exit.
    cpu_per_rank: cap each rank `torchrun` starts at this share of a core (None: ranks share the cores)."""

    def __init__(self, num_hosts: int, rate_gbit: float = 2.0, delay_ms: float = 0.1, subnet: str = "10.213.0",
                 cpu_per_rank: float | None = None):
        if not 1 <= num_hosts <= 250:
            raise ValueError(f"num_hosts: {num_hosts}; use 1 to 250 hosts")
        if rate_gbit <= 0 or delay_ms < 0:
            raise ValueError(f"rate_gbit={rate_gbit}, delay_ms={delay_ms}: the rate must be > 0 and the delay >= 0")
        if cpu_per_rank is not None:
            emulated_cpu.check_share(cpu_per_rank)
        self.rate_gbit, self.delay_ms, self.cpu_per_rank = rate_gbit, delay_ms, cpu_per_rank
        self.base = base = f"{PREFIX}{os.getpid()}-{next(_runs)}"
        self.switch = f"{base}-sw"
        self.hosts = tuple(Host(h, f"{base}-h{h}", f"{subnet}.{h + 1}") for h in range(num_hosts))
        self.shaping = ""
        self._created: list[str] = []
        self.caps: RankCpuCaps | None = None  # made by `torchrun` with cpu_per_rank
        self._procs: list[subprocess.Popen] = []
        self._logs: dict[int, Path] = {}
        self._previous_sigterm = None

    # --- setup and teardown -------------------------------------------------------------------
    def __enter__(self) -> "EmulatedHosts":
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            remove_stale()
            emulated_cpu.remove_stale(PREFIX)
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        for ns in (self.switch, *(h.namespace for h in self.hosts)):
            _ip("netns", "add", ns)
            self._created.append(ns)
        _ip("-n", self.switch, "link", "add", "name", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        delayed = True
        for h in self.hosts:
            port = f"port{h.index}"
            _ip("-n", self.switch, "link", "add", "name", port, "type", "veth", "peer", "name", IFNAME,
                "netns", h.namespace)
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", h.namespace, "link", "set", "lo", "up")
            _ip("-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", IFNAME)
            _ip("-n", h.namespace, "link", "set", IFNAME, "up")
            for namespace, dev in ((h.namespace, IFNAME), (self.switch, port)):  # both directions
                delayed = self._shape(namespace, dev) and delayed
        self.shaping = f"tbf {self.rate_gbit:g} Gbit/s each way per host link"
        if self.delay_ms:
            self.shaping += f", netem delay {self.delay_ms:g} ms each way" if delayed else \
                f"; delay {self.delay_ms:g} ms NOT applied: this kernel has no netem qdisc"
            if not delayed:
                warnings.warn(f"emulated hosts: {self.shaping}", RuntimeWarning, stacklevel=3)

    def _shape(self, namespace: str, dev: str) -> bool:
        """tbf on ``dev``'s egress, with a netem child for the delay; whether the delay is applied."""
        rate_bytes_s = self.rate_gbit * 1e9 / 8
        burst = max(256 * 1024, int(rate_bytes_s / 1000))  # >= one 64 KiB GSO packet and 1 ms of traffic
        try:
            subprocess.run(["tc", "-n", namespace, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate",
                            f"{self.rate_gbit * 1000:g}mbit", "burst", str(burst), "latency", "10ms"],
                           check=True, capture_output=True, text=True, timeout=30)
        except FileNotFoundError as e:
            raise EmulationUnavailable("the `tc` command (iproute2) is not installed") from e
        except subprocess.CalledProcessError as e:
            raise EmulationUnavailable(f"tc refused the tbf qdisc on {dev}: {e.stderr.strip()}") from e
        if not self.delay_ms:
            return True
        netem = subprocess.run(["tc", "-n", namespace, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:",
                                "netem", "delay", f"{self.delay_ms * 1000:g}us"], capture_output=True, text=True,
                               timeout=30)
        return netem.returncode == 0

    def close(self) -> None:
        """Stop every process in the namespaces and delete them (idempotent)."""
        try:
            for p in self._procs:
                if p.poll() is None:
                    p.kill()
            for ns in reversed(self._created):
                _delete_namespace(ns)
            for p in self._procs:
                p.wait()
            self._created.clear()
            if self.caps is not None:
                self.caps.close()
                self.caps = None
        finally:
            if self._previous_sigterm is not None:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
                self._previous_sigterm = None

    # --- processes ----------------------------------------------------------------------------
    def spawn(self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
              log: Path | None = None) -> subprocess.Popen:
        """Start ``argv`` inside host ``host``'s namespace (output to ``log``, else inherited)."""
        out = log.open("w") if log is not None else None
        try:
            p = subprocess.Popen(["ip", "netns", "exec", self.hosts[host].namespace, *argv],
                                 env=dict(os.environ if env is None else env), stdout=out,
                                 stderr=subprocess.STDOUT if out else None, start_new_session=True)
        finally:
            if out is not None:
                out.close()
        self._procs.append(p)
        if log is not None:
            self._logs[p.pid] = log
        return p

    def torchrun(self, ranks_per_host: int, args: Sequence[str], env: Mapping[str, str] | None = None,
                 log_dir: Path | None = None) -> list[subprocess.Popen]:
        """``torchrun --nnodes H --nproc-per-node L --node-rank h ARGS`` on every host h (logs: log_dir/hostH.log);
        with cpu_per_rank, each rank capped at that share of a core (EmulationUnavailable where cgroups refuse)."""
        env = dict(os.environ if env is None else env)
        if self.cpu_per_rank is not None and self.caps is None:
            try:
                self.caps = RankCpuCaps(self.base, len(self.hosts) * ranks_per_host, self.cpu_per_rank)
            except CpuCapsUnavailable as e:
                raise EmulationUnavailable(str(e)) from e
            self.caps.watch()
            self.shaping += f"; {self.caps.description}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]),
                                                        env.get("PYTHONPATH", "")) if p)
        env["GLOO_SOCKET_IFNAME"] = IFNAME
        env[emulated_cpu.MARKER] = self.base  # what the CPU caps find the ranks by
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(self.hosts)),
                   "--nproc-per-node", str(ranks_per_host), "--master-addr", self.hosts[0].address,
                   "--master-port", str(MASTER_PORT)]
        return [self.spawn(h.index, [*command, "--node-rank", str(h.index), *args], env,
                           None if log_dir is None else Path(log_dir) / f"host{h.index}.log") for h in self.hosts]

    def wait(self, procs: Sequence[subprocess.Popen], timeout_s: float) -> list[HostExit]:
        """Wait for one process per host; those still running after ``timeout_s`` are killed (returncode None)."""
        deadline = time.monotonic() + timeout_s
        codes: list[int | None] = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        for p, code in zip(procs, codes):
            if code is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        return [HostExit(h, code, self._logs.get(p.pid)) for h, (p, code) in enumerate(zip(procs, codes))]

    def kill_host(self, host: int, sig: int = signal.SIGKILL) -> list[int]:
        """Send ``sig`` to every process of host ``host`` (a host going down); their pids."""
        return _kill_namespace_processes(self.hosts[host].namespace, sig)

    def link_bytes(self, host: int) -> LinkBytes:
        """Bytes host ``host`` sent and received on its link (IF/statistics/{tx,rx}_bytes in its namespace)."""
        info = json.loads(_ip("-n", self.hosts[host].namespace, "-j", "-s", "link", "show", "dev", IFNAME))[0]
        return LinkBytes(info["stats64"]["tx"]["bytes"], info["stats64"]["rx"]["bytes"])


def run_torchrun(num_hosts: int, ranks_per_host: int, args: Sequence[str], timeout_s: float, rate_gbit: float = 2.0,
                 delay_ms: float = 0.1, log_dir: Path | None = None, env: Mapping[str, str] | None = None,
                 cpu_per_rank: float | None = None) -> tuple[list[HostExit], list[LinkBytes], str]:
    """One torchrun job on ``num_hosts`` emulated hosts (environment ``env``, default this process's; each rank capped
    at ``cpu_per_rank`` of a core, if given): each host's exit, link bytes, and the shaping (and caps) applied."""
    with EmulatedHosts(num_hosts, rate_gbit, delay_ms, cpu_per_rank=cpu_per_rank) as cluster:
        exits = cluster.wait(cluster.torchrun(ranks_per_host, args, env, log_dir), timeout_s)
        return exits, [cluster.link_bytes(h) for h in range(num_hosts)], cluster.shaping


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embshard.emulated_hosts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--rate-gbit", type=float, default=2.0, help="each host link's rate, each way (default 2)")
    parser.add_argument("--delay-ms", type=float, default=0.1, help="each host link's one-way delay (needs netem)")
    parser.add_argument("--cpu-per-rank", type=float, help="cap each rank at this share of a core (a cgroup CPU quota): "
                        "ranks cannot lend their cores to each other, as on real hosts (default: no cap)")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="stop every host after this long")
    parser.add_argument("--log-dir", type=Path, help="one log per host here (default: this terminal)")
    parser.add_argument("torchrun_args", nargs=argparse.REMAINDER, help="-- then torchrun's script or -m MODULE and args")
    ns = parser.parse_args(argv)
    args = ns.torchrun_args[1:] if ns.torchrun_args[:1] == ["--"] else ns.torchrun_args
    if not args:
        parser.exit(2, f"{parser.prog}: error: nothing to run: add -- -m MODULE ARGS (e.g. -- -m embshard.train steps=20)\n")
    try:
        if ns.log_dir is not None:
            ns.log_dir.mkdir(parents=True, exist_ok=True)
        warnings.simplefilter("ignore", RuntimeWarning)  # the shaping applied is printed below
        exits, links, shaping = run_torchrun(ns.hosts, ns.ranks_per_host, args, ns.timeout_s, ns.rate_gbit,
                                             ns.delay_ms, ns.log_dir, cpu_per_rank=ns.cpu_per_rank)
    except (ValueError, EmulationUnavailable, OSError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except (KeyboardInterrupt, _Terminated):
        print(f"{parser.prog}: interrupted; stopped every host and removed the namespaces", file=sys.stderr)
        return 130
    print(f"links: {shaping}", file=sys.stderr)
    for e, link in zip(exits, links):
        status = "timed out (killed)" if e.timed_out else f"exit {e.returncode}"
        print(f"host {e.host}: {status}; sent {link.sent_bytes:,} B, received {link.received_bytes:,} B", file=sys.stderr)
    return next((1 if e.timed_out else e.returncode for e in exits if e.returncode != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
