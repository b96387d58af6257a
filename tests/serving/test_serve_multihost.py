"""embshard-serve across 2 emulated hosts (1 rank each, torchrun in network namespaces) answers like the
1-host server: /healthz names 2 ranks and /predict gives the reference scores.

Needs root (network namespaces): elsewhere the test skips and says why. The HTTP server listens on rank 0's
host, so the client runs in that namespace too.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
import torch

from embshard.emulated_hosts import EmulatedHosts, EmulationUnavailable
from embshard.serving.client import predict_body

CLIENT = """
import json, sys, urllib.request
url, body = sys.argv[1], open(sys.argv[2]).read().encode()
health = json.load(urllib.request.urlopen(url + "/healthz", timeout=60))
answer = json.load(urllib.request.urlopen(urllib.request.Request(url + "/predict", data=body), timeout=60))
print(json.dumps({"health": health, "answer": answer}))
"""


def test_two_hosts_serve_the_one_host_scores(artifact, reference, tmp_path) -> None:
    port_file, body = tmp_path / "port", tmp_path / "body.json"
    body.write_text(json.dumps(predict_body(reference["samples"].slice(0, 7), reference["layout"])))
    args = ["-m", "embshard.serving.serve_cli", f"artifact={artifact('fp32', 2)}", "launcher.collective_timeout_s=30",
            "server.port=0", f"server.port_file={port_file}"]
    try:
        with EmulatedHosts(2, delay_ms=0) as cluster:
            procs = cluster.torchrun(1, args, {**os.environ, "OMP_NUM_THREADS": "1"}, tmp_path)
            deadline = time.monotonic() + 180
            while not port_file.exists():
                assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, \
                    [(tmp_path / f"host{h}.log").read_text()[-3000:] for h in range(2)]
                time.sleep(0.2)
            client = cluster.spawn(0, [sys.executable, "-c", CLIENT, f"http://127.0.0.1:{port_file.read_text().strip()}", str(body)],
                                   log=tmp_path / "client.log")
            assert [e.returncode for e in cluster.wait([client], 90)] == [0], (tmp_path / "client.log").read_text()
    except EmulationUnavailable as e:
        pytest.skip(f"emulated hosts unavailable (needs root and iproute2's ip/tc): {e}")
    got = json.loads((tmp_path / "client.log").read_text().strip().splitlines()[-1])
    assert got["health"] == {"status": "ok", "world_size": 2}, got
    scores = torch.tensor(got["answer"]["scores"])
    assert torch.allclose(scores, reference["scores"][:7], atol=1e-5, rtol=0), scores  # as test_serve_cli's 1-host check
