"""embshard-serve's command line: bad settings name the key (composed in-process) and end with
one line and exit status 2 before any rank starts; an artifact for another world size is
refused; a rank lost while serving makes /healthz and /predict answer 503 naming the rank and how
it ended (so does the log), and SIGTERM still stops the server; ``checkpoint=`` exports the run,
then serves it (and two SIGTERMs stop it with status 0); under torchrun two ranks serve the
model's scores.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time

import aiohttp
import pytest
import torch
from hydra import compose, initialize_config_dir

from embshard.ports import free_port
from embshard.serving.client import BIN, ServeProcess, get_json, post_json, predict_body
from embshard.serving.config import register, settings_from_config
from embshard.cli import CONFIG_DIR

TIMEOUT_S = 120
register()


def serve_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "embshard-serve"), *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def assert_one_line_error(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.startswith("embshard-serve: error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert all(w in lines[0] for w in words), lines[0]


def settings(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return settings_from_config(compose("serve", overrides=list(overrides)))


@pytest.mark.parametrize("overrides, words", [
    ((), "artifact / checkpoint: give exactly one"),
    (("artifact=/nonexistent/art",), "artifact: /nonexistent/art is not a folder"),
    (("artifact=.", "checkpoint=."), "artifact / checkpoint: give exactly one"),
    (("checkpoint=.",), "export.out: checkpoint=. is not a run folder"),
    (("artifact=.", "server.port=70000"), "server.port: 70000"),
    (("artifact=.", "batching.max_batch_size=0"), "batching.max_batch_size: must be positive"),
    (("artifact=.", "server.max_bag_ids=0"), "server.max_bag_ids: must be positive"),
    (("artifact=.", "server.read_timeout_ms=0"), "server.read_timeout_ms: must be positive"),
    (("artifact=.", "server.heartbeat_ms=20000", "launcher.collective_timeout_s=30"), "server.heartbeat_ms"),
])
def test_bad_settings_name_the_key(overrides, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        settings(*overrides)


def test_defaults_compose():
    s = settings("artifact=.", "+export.table_dtypes={t0: int8}")
    assert (s.server.port, s.batching.max_batch_size, s.launcher.nproc) == (8080, 256, 1)
    assert s.export.table_dtypes == {"t0": "int8"}


def test_bad_input_is_one_line_exit_2():
    assert_one_line_error(serve_cli("artifact=/nonexistent/art"), "artifact: /nonexistent/art is not a folder")
    assert_one_line_error(serve_cli("artifact=.", "server.nope=1"), "nope")


def test_artifact_of_another_world_size_is_refused(artifact):
    done = serve_cli(f"artifact={artifact('fp32', 2)}", "launcher.nproc=1", "server.port=0")
    assert_one_line_error(done, "2")
    assert "world" in done.stderr.lower(), done.stderr[-2000:]


def test_an_error_found_by_every_rank_is_printed_once(artifact):
    # both ranks find the 1-rank artifact wrong for 2 ranks; one says so, once
    done = serve_cli(f"artifact={artifact('fp32', 1)}", "launcher.nproc=2", "server.port=0",
                     "launcher.collective_timeout_s=30")
    assert_one_line_error(done, "planned for 1 rank but 2")
    line = next(line for line in done.stderr.splitlines() if line.startswith("embshard-serve: error:"))
    assert line.count("planned for") == 1 and "rank 0" not in line and "rank 1" not in line, line


def test_lost_rank_is_named_in_healthz_and_the_log_and_sigterm_still_stops(artifact, reference, tmp_path):
    server = ServeProcess.start([f"artifact={artifact('fp32', 2)}", "launcher.nproc=2", "launcher.collective_timeout_s=20",
                                 "server.heartbeat_ms=200"], tmp_path)
    try:
        ranks = server.rank_pids()
        assert len(ranks) == 2
        body = predict_body(reference["samples"].slice(0, 2), reference["layout"])
        os.kill(ranks[1], signal.SIGKILL)

        async def poll(session):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                status, health = await get_json(session, f"{server.url}/healthz")
                if status != 200:
                    return (status, health), await post_json(session, f"{server.url}/predict", body)
                await asyncio.sleep(0.2)
            return (status, health), None

        async def main():
            async with aiohttp.ClientSession() as session:
                return await poll(session)
        (status, health), predict = asyncio.run(main())
        named = "rank 1 was killed by SIGKILL"
        assert status == 503 and health["status"] == "unhealthy" and health["reason"].startswith(named), health
        assert not any(w in health["reason"] for w in ("gloo", "Connection", "127.0.0.1")), health
        assert predict is not None and predict[0] == 503 and predict[1]["error"].startswith(named), predict
        lines = server.log().splitlines()
        errors = [i for i, line in enumerate(lines) if line.startswith("embshard-serve: error:")]
        assert errors and named in lines[errors[0]], lines[-20:]  # logged when it was found, before any SIGTERM
        assert server.stop(signal.SIGTERM, timeout_s=40) != 0
        assert not os.path.exists(f"/proc/{ranks[0]}") or "zombie" in open(f"/proc/{ranks[0]}/status").read()
        lines = server.log().strip().splitlines()
        assert lines[-1].startswith("embshard-serve: error: " + named), lines[-10:]  # the last word names rank 1
    finally:
        if server.proc.poll() is None:
            server.kill()


def test_checkpoint_is_exported_then_served_by_one_rank(trained_run, reference, tmp_path):
    out = tmp_path / "artifact"
    server = ServeProcess.start([f"checkpoint={trained_run}", f"export.out={out}", "export.split=true"],
                                tmp_path / "server")
    try:
        body = predict_body(reference["samples"].slice(0, 5), reference["layout"])

        async def main():
            async with aiohttp.ClientSession() as session:
                return await post_json(session, f"{server.url}/predict", body)
        status, answer = asyncio.run(main())
        assert status == 200, answer
        got = torch.tensor(answer["scores"])
        assert torch.allclose(got, reference["scores"][:5], atol=1e-5, rtol=0), got
        assert f"exported {trained_run} to {out} (1 rank)" in server.log()
        types = {t["sharding_type"] for t in json.loads((out / "plan.json").read_text())["tables"]}
        assert "data_parallel" not in types, types  # export.split reached the export
        server.proc.send_signal(signal.SIGTERM)  # twice, 50 ms apart, to the one rank itself
        time.sleep(0.05)
        assert server.stop(signal.SIGTERM) == 0, server.log()[-3000:]
        assert "Traceback" not in server.log() and not (tmp_path / "server" / "port").exists(), server.log()[-3000:]
    finally:
        if server.proc.poll() is None:
            server.kill()


def test_torchrun_ranks_serve_the_trained_model(artifact, reference, tmp_path):
    torchrun = (str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()),
                "-m", "embshard.serving.serve_cli")
    server = ServeProcess.start([f"artifact={artifact('fp32', 2)}", "launcher.collective_timeout_s=30"], tmp_path,
                                command=torchrun)
    try:
        body = predict_body(reference["samples"].slice(0, 7), reference["layout"])

        async def main():
            async with aiohttp.ClientSession() as session:
                return await get_json(session, f"{server.url}/healthz"), \
                    await post_json(session, f"{server.url}/predict", body)
        health, (status, answer) = asyncio.run(main())
        assert health == (200, {"status": "ok", "world_size": 2}), health
        assert status == 200, answer
        got = torch.tensor(answer["scores"])
        assert torch.allclose(got, reference["scores"][:7], atol=1e-5, rtol=0), got
        ranks = server.rank_pids()
        assert len(ranks) == 2, ranks
        server.stop(signal.SIGTERM, timeout_s=60)  # torchrun's own exit status and report are torchrun's
        assert all(not os.path.exists(f"/proc/{pid}") for pid in ranks), ranks
        assert "embshard-serve: stopping" in server.log(), server.log()[-3000:]
    finally:
        if server.proc.poll() is None:
            server.kill()
