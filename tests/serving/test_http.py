"""embshard-serve over HTTP: one 2-rank server (the shared fp32 artifact) answers real requests.

Scores equal the unsharded trained model's (conftest's `reference`, 1e-5), lookups the
checkpoint's rows; concurrent requests are batched and each gets its own scores; bad input
gets a 4xx naming the field while the server keeps serving; a rank slower than the request
timeout gives 503, then the server serves again; two SIGTERMs stop every rank with status 0 (the last test).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import aiohttp
import pytest
import torch

from embshard.serving.client import ServeProcess, get_json, post_json, predict_body

REQUEST_TIMEOUT_MS = 3000
MAX_REQUEST_SAMPLES = 64


def run(coroutine_fn, *args):
    """``coroutine_fn(session, *args)`` with a fresh aiohttp session, run to completion."""
    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            return await coroutine_fn(session, *args)
    return asyncio.run(main())


@pytest.fixture(scope="module")
def server(artifact, tmp_path_factory):
    process = ServeProcess.start([f"artifact={artifact('fp32', 2)}", "launcher.nproc=2", "launcher.collective_timeout_s=30",
                                  f"server.request_timeout_ms={REQUEST_TIMEOUT_MS}", "server.debug_delay=true",
                                  f"server.max_request_samples={MAX_REQUEST_SAMPLES}", "batching.max_wait_ms=20"],
                                 tmp_path_factory.mktemp("http_server"))
    yield process
    if process.proc.poll() is None:
        process.kill()


def body_of(reference, start: int, stop: int) -> dict:
    return predict_body(reference["samples"].slice(start, stop), reference["layout"])


def assert_scores(answer: dict, reference, start: int, stop: int) -> None:
    got, want = torch.tensor(answer["scores"]), reference["scores"][start:stop]
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=0), f"max |diff| {float((got - want).abs().max()):.2e}"


def test_predict_equals_the_trained_model(server, reference):
    async def go(session):
        return [await post_json(session, f"{server.url}/predict", body_of(reference, a, b))
                for a, b in ((0, 1), (1, 8), (8, 8 + MAX_REQUEST_SAMPLES))]
    answers = run(go)
    for (status, answer), (a, b) in zip(answers, ((0, 1), (1, 8), (8, 8 + MAX_REQUEST_SAMPLES))):
        assert status == 200, answer
        assert_scores(answer, reference, a, b)


def test_concurrent_requests_are_batched_and_answered_separately(server, reference):
    num_requests = 24

    async def go(session):
        return await asyncio.gather(*(post_json(session, f"{server.url}/predict", body_of(reference, 100 + i, 101 + i))
                                      for i in range(num_requests)))
    for i, (status, answer) in enumerate(run(go)):
        assert status == 200, answer
        assert_scores(answer, reference, 100 + i, 101 + i)
    status, metrics = run(get_json, f"{server.url}/metrics")
    sizes = metrics["batches"]["predict"]["size"]
    assert status == 200 and sizes["p99"] > 1, f"one-sample requests sent together were not batched: {metrics['batches']}"


def test_lookup_returns_the_checkpoint_rows(server, reference):
    specs = reference["run"].specs
    sequence = [s for s in specs if not s.pooled]
    assert sequence, "the shared run has a user-history table"
    for spec in (specs[1], sequence[0]):  # a pooled table and the sequence table
        feature, ids = spec.feature_names[0], [0, 5, spec.num_embeddings - 1, 5]
        status, answer = run(post_json, f"{server.url}/lookup", {"feature": feature, "ids": ids})
        assert status == 200, answer
        assert torch.equal(torch.tensor(answer["embeddings"]), reference["tables"][spec.name][ids]), feature


def test_bad_requests_get_4xx_naming_the_field(server, reference):
    good = body_of(reference, 0, 2)
    sample = good["samples"][0]
    pooled = reference["layout"].pooled[0]
    bad = [
        ("/predict", b"{not json", 400, "body: not valid JSON"),
        ("/predict", [1, 2], 400, "body: expected a JSON object"),
        ("/predict", {"samples": []}, 400, "samples: empty"),
        ("/predict", {"samples": "x"}, 400, "samples: expected a list"),
        ("/predict", {"samples": [sample] * (MAX_REQUEST_SAMPLES + 1)}, 413, "max_request_samples"),
        ("/predict", {"samples": [{**sample, "dense": sample["dense"][:-1]}]}, 400, "samples[0].dense: 12 values"),
        ("/predict", {"samples": [{**sample, "dense": ["a"] + sample["dense"][1:]}]}, 400, "samples[0].dense[0]"),
        ("/predict", {"samples": [{**sample, "sparse": {**sample["sparse"], "nope": [1]}}]}, 400,
         "samples[0].sparse.nope: unknown feature"),
        ("/predict", {"samples": [sample, {**sample, "sparse": {k: v for k, v in sample["sparse"].items()
                                                                if k != pooled.name}}]}, 400,
         f"samples[1].sparse.{pooled.name}: missing"),
        ("/predict", {"samples": [{**sample, "sparse": {**sample["sparse"], pooled.name: [1, -1]}}]}, 400,
         f"samples[0].sparse.{pooled.name}[1]: id -1 out of range"),
        ("/predict", {"samples": [{**sample, "sparse": {**sample["sparse"], pooled.name: [pooled.num_embeddings]}}]},
         400, f"samples[0].sparse.{pooled.name}[0]: id {pooled.num_embeddings} out of range"),
        ("/predict", {"samples": [{**sample, "sparse": {**sample["sparse"], pooled.name: [1.5]}}]}, 400,
         f"samples[0].sparse.{pooled.name}[0]: expected an integer id"),
        ("/predict", {"samples": [{**sample, "sparse": {**sample["sparse"], "target": []}}]}, 400,
         "samples[0].sparse.target: 0 ids"),
        ("/lookup", {"feature": "nope", "ids": [1]}, 400, "feature: unknown feature 'nope'"),
        ("/lookup", {"feature": pooled.name, "ids": []}, 400, "ids: empty"),
        ("/lookup", {"feature": pooled.name, "ids": "1"}, 400, "ids: expected a list"),
        ("/lookup", {"feature": pooled.name, "ids": [pooled.num_embeddings]}, 400, "ids[0]: id"),
        ("/lookup", {"ids": [1]}, 400, "feature: missing"),
    ]

    async def go(session):
        answers = [await post_json(session, f"{server.url}{path}", body) for path, body, _, _ in bad]
        return answers, await post_json(session, f"{server.url}/predict", good)
    answers, after = run(go)
    for (path, _, status, field), (got_status, answer) in zip(bad, answers):
        assert (got_status, field in answer.get("error", "")) == (status, True), (path, field, got_status, answer)
    assert after[0] == 200, after
    assert_scores(after[1], reference, 0, 2)


def test_healthz_and_metrics(server):
    status, health = run(get_json, f"{server.url}/healthz")
    assert (status, health) == (200, {"status": "ok", "world_size": 2})
    status, metrics = run(get_json, f"{server.url}/metrics")
    assert status == 200
    assert metrics["requests"]["/predict"]["200"] >= 4 and metrics["requests"]["/predict"]["400"] >= 10
    assert metrics["latency_ms"]["/predict"]["p50"] > 0
    assert metrics["latency_ms"]["/predict"]["p99"] >= metrics["latency_ms"]["/predict"]["p50"]
    assert metrics["queue_depth"] == {"requests": 0, "samples": 0}
    memory = metrics["memory_bytes_per_rank"]
    assert len(memory) == 2 and all(m["embedding_weights_bytes"] > 0 and m["rss_bytes"] > 0 for m in memory), memory


def test_a_slow_rank_gives_503_then_the_server_serves_again(server, reference):
    delay_ms = REQUEST_TIMEOUT_MS + 1500

    async def go(session):
        start = time.monotonic()
        slow = await post_json(session, f"{server.url}/predict", body_of(reference, 0, 3),
                               headers={"X-Embshard-Debug-Delay-Ms": str(delay_ms)})
        waited_s = time.monotonic() - start
        await asyncio.sleep((delay_ms - REQUEST_TIMEOUT_MS) / 1000 + 0.5)  # the slow batch finishes
        return slow, waited_s, await get_json(session, f"{server.url}/healthz"), \
            await post_json(session, f"{server.url}/predict", body_of(reference, 0, 3))
    (status, answer), waited_s, health, after = run(go)
    assert status == 503 and "request_timeout_ms" in answer["error"], answer
    assert waited_s < delay_ms / 1000, f"the 503 came after {waited_s:.1f} s, not at the request timeout"
    assert health == (200, {"status": "ok", "world_size": 2})
    assert after[0] == 200, after
    assert_scores(after[1], reference, 0, 3)


def test_two_sigterms_stop_every_rank_cleanly_and_free_the_port(server):
    """As ``timeout`` sends them: the second one, 50 ms later, lands while the ranks are stopping."""
    ranks = server.rank_pids()
    assert len(ranks) == 2, ranks
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    assert server.stop(signal.SIGTERM) == 0, server.log()[-3000:]
    log = server.log()
    assert "Traceback" not in log and "Error executing job" not in log, log[-3000:]
    for pid in ranks:
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read(), pid
    assert not (server.log_path.parent / "port").exists(), "the port file outlived the server"
    with socket.socket() as s:
        s.bind(("127.0.0.1", server.port))  # free again
