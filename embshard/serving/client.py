"""Client side of embshard-serve: start a server process, build request bodies, POST JSON.

    server = ServeProcess.start(["artifact=ART", "launcher.nproc=2"], folder)   # on a free port
    body = predict_body(samples, layout)          # {"samples": [{"dense": [...], "sparse": {...}}, ...]}
    status, answer = await post_json(session, f"{server.url}/predict", body)
    server.stop()                                 # SIGTERM; the exit status

Used by the tests and benchmarks/serve_load.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import aiohttp
import numpy as np

from embshard.data.batch import FeatureLayout, Samples

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 180


def predict_body(samples: Samples, layout: FeatureLayout) -> dict:
    """The /predict body of ``samples`` (dense floats as stored, every feature's ids)."""
    offsets = np.concatenate([np.zeros((len(samples.values), 1), np.int64), np.cumsum(samples.lengths, axis=1)], axis=1)
    dense = samples.dense.tolist()
    return {"samples": [
        {"dense": dense[i],
         "sparse": {f.name: samples.values[k][offsets[k, i]:offsets[k, i + 1]].tolist()
                    for k, f in enumerate(layout.features)}}
        for i in range(len(samples))]}


async def post_json(session: aiohttp.ClientSession, url: str, body: Any,
                    headers: Mapping[str, str] | None = None) -> tuple[int, dict]:
    """POST ``body`` as JSON (or raw bytes/str as given); the status and the JSON answer."""
    kwargs = {"data": body} if isinstance(body, (bytes, str)) else {"json": body}
    async with session.post(url, headers=headers, **kwargs) as response:
        return response.status, await response.json()


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with session.get(url) as response:
        return response.status, await response.json()


@dataclass
class ServeProcess:
    """An ``embshard-serve`` subprocess (the launcher or torchrun, whose children are the ranks); Linux (/proc)."""

    proc: subprocess.Popen
    log_path: Path
    port: int

    @classmethod
    def start(cls, args: list[str], folder: Path, timeout_s: float = START_TIMEOUT_S,
              command: tuple[str, ...] = (str(BIN / "embshard-serve"),)) -> "ServeProcess":
        """Start ``COMMAND ARGS server.port=0`` (``embshard-serve``, or ``torchrun ... -m embshard.serving.serve_cli``)
        and wait until it listens (RuntimeError with its log if not)."""
        folder.mkdir(parents=True, exist_ok=True)
        port_file, log_path = folder / "port", folder / "serve.log"
        port_file.unlink(missing_ok=True)
        with open(log_path, "w") as log:
            proc = subprocess.Popen([*command, *args, "server.port=0", f"server.port_file={port_file}"],
                                    stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + timeout_s
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"embshard-serve did not start (exit {proc.returncode}):\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)
        return cls(proc, log_path, int(port_file.read_text()))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text()

    def rank_pids(self) -> list[int]:
        """The processes the launcher started (its children), by pid."""
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
            raise RuntimeError(f"embshard-serve still ran {timeout_s} s after {signal.Signals(signum).name}:\n"
                               f"{self.log()[-4000:]}") from None

    def kill(self) -> None:
        """Kill the launcher and whatever ranks it left."""
        for pid in [*self.rank_pids(), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
