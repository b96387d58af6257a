"""An `embshard-serve` subprocess for the tests: started on a free port, stopped by signal, its ranks found.

    server = ServeProcess.start(["artifact=ART", "launcher.nproc=2"], tmp_path)
    server.url            # http://127.0.0.1:PORT, once rank 0 listens
    server.rank_pids()    # the launcher's children (the ranks)
    server.stop()         # SIGTERM, then the exit status
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 180


@dataclass
class ServeProcess:
    proc: subprocess.Popen
    log_path: Path
    port: int

    @classmethod
    def start(cls, args: list[str], folder: Path, timeout_s: float = START_TIMEOUT_S) -> "ServeProcess":
        """Start ``embshard-serve ARGS server.port=0`` and wait until it listens (AssertionError with its log if not)."""
        folder.mkdir(parents=True, exist_ok=True)
        port_file, log_path = folder / "port", folder / "serve.log"
        port_file.unlink(missing_ok=True)
        with open(log_path, "w") as log:
            proc = subprocess.Popen([str(BIN / "embshard-serve"), *args, "server.port=0", f"server.port_file={port_file}"],
                                    stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + timeout_s
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise AssertionError(f"embshard-serve did not start (exit {proc.returncode}):\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)
        return cls(proc, log_path, int(port_file.read_text()))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text()

    def rank_pids(self) -> list[int]:
        """The processes the launcher started (its children), in start order."""
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid:
                children.append(int(stat.parent.name))
        return sorted(children)

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        """Send ``signum`` to the launcher; its exit status (killed after ``timeout_s``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"embshard-serve still ran {timeout_s} s after {signal.Signals(signum).name}:\n"
                                 f"{self.log()[-4000:]}") from None

    def kill(self) -> None:
        """Kill the launcher and whatever ranks it left."""
        for pid in [*self.rank_pids(), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def run(coroutine_fn, *args):
    """``coroutine_fn(session, *args)`` with a fresh aiohttp session, run to completion."""
    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            return await coroutine_fn(session, *args)
    return asyncio.run(main())
