"""Serving load on loopback: embshard-serve on 1 and 2 ranks (fp32, int8) vs one unsharded TorchRec process.

    .venv/bin/python benchmarks/serve_load.py                     # trains a small Criteo-like run first (~1 min)
    .venv/bin/python benchmarks/serve_load.py --run outputs/train/RUN --duration-s 6 --out benchmarks/results/serve.md

For each server it runs closed loops at concurrency 1, 8 and 64: C clients, each sending its
next /predict (``--samples-per-request`` samples of the data's eval split) as soon as the last
answer came, for ``--duration-s`` after a warm-up, at most ``--max-requests``. It reports
requests/s, p50/p99 latency, the mean batch the ranks ran (from /metrics), the server's CPU
time per request (all its processes; robust to other load on a shared machine) and memory
per rank. The reference is the same HTTP server and batcher over TorchRec's unsharded
`EmbeddingBagCollection`/`EmbeddingCollection` DLRM with the checkpoint's weights, in one
process (how TorchRec serves); the ratio column divides by its requests/s at the same
concurrency. All servers are up at once and the measurements alternate between them
(``--repeats`` rounds, medians). The load generator runs on the same cores as the servers. The servers (the reference
and embshard's ranks alike) run glibc's malloc keeping freed memory, as the other benchmarks' ranks do
(`local_ranks.MALLOC_TUNABLES`); ``--malloc default``: glibc's defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
import torch
import torch.distributed as dist
from torch import Tensor
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from local_ranks import add_malloc_argument, malloc_env, malloc_sentence
from sections import commit_label, load_average
from embshard.data.batch import NUM_DENSE, FeatureLayout
from embshard.data.config import SyntheticConfig
from embshard.data.synthetic import SyntheticSource
from embshard.machine import cpu_model
from embshard.models.dlrm import DLRM
from embshard.serving.artifact import ModelInfo
from embshard.serving.client import BIN, ServeProcess, get_json, post_json, predict_body
from embshard.serving.export import find_run, read_dense, read_table
from embshard.serving.metrics import percentile
from embshard.serving.predictor import ServingSchema

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 8, 64)
SERVERS = (("reference", None, None), ("embshard 1 fp32", 1, "fp32"), ("embshard 1 int8", 1, "int8"),
           ("embshard 2 fp32", 2, "fp32"), ("embshard 2 int8", 2, "int8"))  # name, ranks, dtype
TRAIN_ARGS = ["launcher.nproc=2", "steps=60", "eval.every_steps=0", "eval.num_samples=2048", "planner.time_budget_s=1"]


class UnshardedPredictor:
    """TorchRec's unsharded DLRM with a checkpoint's weights, behind `Predictor`'s interface (one process)."""

    def __init__(self, run_dir: Path):
        run = find_run(run_dir)
        self.model = DLRM(run.model, run.specs, NUM_DENSE).eval()
        self.schema = ServingSchema.of(ModelInfo(run.model, run.specs, NUM_DENSE, {}), 1)
        self.tables: dict[str, Tensor] = {}
        with torch.no_grad():
            for name, param in read_dense(run.step_dir).items():
                self.model.get_parameter(name).copy_(param)
            modules = dict(self.model.sparse.embedding_bags.items())
            if self.model.sequence is not None:
                modules.update(self.model.sequence.embeddings.items())
            for spec in run.specs:
                weight = modules[spec.name].weight
                weight.copy_(read_table(run.step_dir, spec.name, tuple(weight.shape), spec.dtype))
                self.tables.update({f: weight for f in spec.feature_names})
        self.num_pooled = len(self.schema.sparse_features) - len(self.schema.sequence_features)

    @torch.inference_mode()
    def predict(self, dense_BF: Tensor, kjt: KeyedJaggedTensor) -> Tensor:
        sequence = None
        if self.schema.sequence_features:
            kjt, sequence = kjt.split([self.num_pooled, len(self.schema.sequence_features)])
        return torch.sigmoid(self.model(dense_BF, kjt, sequence)).float()

    @torch.inference_mode()
    def lookup(self, feature: str, ids: Tensor) -> Tensor:
        return self.tables[feature][ids].float()

    def memory_bytes(self) -> dict[str, int]:
        embedding = sum(t.numel() * t.element_size() for t in {id(t): t for t in self.tables.values()}.values())
        total = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return {"embedding_weights": embedding, "dense_weights": total - embedding}


def reference_server(run_dir: Path, port_file: Path) -> None:
    """One process: the unsharded model behind embshard-serve's own HTTP server and batcher."""
    from embshard.serving.config import ExportOptions, ServeSettings, BatchingConfig, ServerConfig
    from embshard.serving.rank import serve_rank0
    from embshard.serving.workers import RankWorker
    from embshard.launch.launcher import LauncherConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    worker = RankWorker(UnshardedPredictor(run_dir), dist.group.WORLD)
    settings = ServeSettings(artifact=None, checkpoint=None, export=ExportOptions(), launcher=LauncherConfig(),
                             server=ServerConfig(port=0, port_file=str(port_file)), batching=BatchingConfig())
    asyncio.run(serve_rank0(worker, worker.gather_memory(), settings))
    sys.stdout.flush()
    os._exit(0)


def start_reference(run_dir: Path, folder: Path) -> ServeProcess:
    folder.mkdir(parents=True, exist_ok=True)
    port_file, log_path = folder / "port", folder / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, __file__, "--reference-server", str(run_dir), "--port-file", str(port_file)],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"reference server failed:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)
    return ServeProcess(proc, log_path, int(port_file.read_text()))


def split_hbm_gib(specs, dtype: str, fraction: float) -> float:
    """Memory per rank (GiB; the planner keeps 10% of it for dense) for ``fraction`` of the tables' bytes in ``dtype``."""
    table_bytes = sum(s.num_embeddings * replace(s, dtype=dtype).row_bytes(s.embedding_dim) for s in specs)
    return round(fraction * table_bytes / 0.9 / 2**30, 4)


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def closed_loop(url: str, bodies: list[bytes], concurrency: int, duration_s: float, max_requests: int) -> dict:
    latencies_ms: list[float] = []
    count = 0

    async def client(session: aiohttp.ClientSession, first: int, stop_at: float, record: bool) -> None:
        nonlocal count
        i = first
        while time.monotonic() < stop_at and (not record or count < max_requests):
            start = time.perf_counter()
            status, answer = await post_json(session, f"{url}/predict", bodies[i % len(bodies)])
            if status != 200:
                raise RuntimeError(f"/predict answered {status}: {answer}")
            if record:
                latencies_ms.append((time.perf_counter() - start) * 1000)
                count += 1
            i += concurrency

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        warm_until = time.monotonic() + 1.0
        await asyncio.gather(*(client(session, c, warm_until, False) for c in range(concurrency)))
        _, before = await get_json(session, f"{url}/metrics")
        start = time.monotonic()
        await asyncio.gather(*(client(session, c, start + duration_s, True) for c in range(concurrency)))
        elapsed_s = time.monotonic() - start
        _, after = await get_json(session, f"{url}/metrics")
    batches = [m["batches"]["predict"] for m in (before, after)]
    return {"requests": count, "qps": count / elapsed_s, "p50_ms": percentile(latencies_ms, 50),
            "p99_ms": percentile(latencies_ms, 99),
            "mean_batch": (batches[1]["samples"] - batches[0]["samples"]) / max(1, batches[1]["count"] - batches[0]["count"]),
            "memory": after["memory_bytes_per_rank"]}


def measure(name: str, server: ServeProcess, pids: list[int], bodies: list[bytes], concurrency: int, args) -> dict:
    cpu_before = cpu_s(pids)
    result = asyncio.run(closed_loop(server.url, bodies, concurrency, args.duration_s, args.max_requests))
    result.update(name=name, concurrency=concurrency, load=os.getloadavg()[0],
                  cpu_ms_per_request=(cpu_s(pids) - cpu_before) * 1000 / max(1, result["requests"]))
    print(f"{name:>16} C={concurrency:<3} {result['qps']:8.1f} req/s  p50 {result['p50_ms']:7.1f} ms  "
          f"p99 {result['p99_ms']:7.1f} ms  batch {result['mean_batch']:5.1f}  "
          f"cpu {result['cpu_ms_per_request']:6.2f} ms/req  load {result['load']:.1f}", flush=True)
    return result


def medians(runs: list[dict]) -> dict:
    """One row from the repeats of a (server, concurrency): medians of the numbers, the last memory reading."""
    keys = ("qps", "p50_ms", "p99_ms", "mean_batch", "cpu_ms_per_request", "load")
    return {**runs[-1], **{k: statistics.median(r[k] for r in runs) for k in keys}, "repeats": len(runs)}


def run_cli(args: list[str]) -> None:
    done = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise SystemExit(f"{args[0]} failed:\n{done.stderr[-3000:]}")


def markdown(rows: list[dict], args, run_dir: Path, commit: str, loads: tuple[str, str]) -> str:
    reference = {r["concurrency"]: r for r in rows if r["name"] == "reference"}
    lines = [
        "# embshard-serve under load (loopback)", "",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {cpu_model()}, {os.cpu_count()} cores shared "
        f"with other work (load: the 1-minute load average, median over the repeats), no GPU, torch {torch.__version__}, "
        f"gloo; every server's processes: {malloc_sentence(args.malloc)}. "
        f"Command: `{' '.join(['.venv/bin/python benchmarks/serve_load.py', *sys.argv[1:]])}`. Commit: {commit}. "
        f"Load average (1, 5, 15 min) before / after the run: {loads[0]} / {loads[1]}.", "",
        f"Model: DLRM trained by `embshard-train {' '.join(TRAIN_ARGS)}` (tables=criteo_small: 26 tables up to "
        f"100,000 x 16, 51.3 MiB in fp32). Artifacts by `embshard-export`; "
        + (f"the 2-rank ones planned for {args.split_fraction:g} of the tables' bytes per rank (`hbm_gib`), so the "
           "tables must be split between the ranks." if args.split_fraction > 0 else
           "defaults (16 GiB per rank): the planner places the tables (embedding MiB per rank shows what it chose).") +
        f" Each request: {args.samples_per_request} samples of the synthetic eval split. Closed loops of C clients, "
        f"{args.duration_s:g} s each after 1 s of warm-up, {args.repeats} rounds alternating over all five servers "
        "(all up at once); medians. Server defaults (batching.max_batch_size=256, max_wait_ms=2). The load generator "
        "shares the 2 cores with the servers.", "",
        "Columns: vs ref = req/s over the reference's at the same C; CPU ms/req = CPU time of all the server's "
        "processes per request, and CPU vs ref = the reference's CPU ms/req over this one (>1: embshard spends less "
        "CPU per request; less disturbed by other load than req/s). The reference is TorchRec's unsharded "
        "`EmbeddingBagCollection`/`EmbeddingCollection` DLRM with the same weights, in one process (how TorchRec "
        "serves), behind the same HTTP server and batcher.", "",
        "| server | ranks | dtype | C | req/s | vs ref | p50 ms | p99 ms | mean batch | CPU ms/req | CPU vs ref | "
        "load | embedding MiB per rank | RSS MiB per rank |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        ref = reference[r["concurrency"]]
        emb = " / ".join(f"{m['embedding_weights_bytes'] / 2**20:.1f}" for m in r["memory"])
        rss = " / ".join(f"{m['rss_bytes'] / 2**20:.0f}" for m in r["memory"])
        ranks, dtype = ("1", "fp32 (TorchRec, unsharded)") if r["name"] == "reference" else r["name"].split()[1:3]
        lines.append(f"| {r['name'].split()[0]} | {ranks} | {dtype} | {r['concurrency']} | {r['qps']:.1f} | "
                     f"{r['qps'] / ref['qps']:.2f}x | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['mean_batch']:.1f} | "
                     f"{r['cpu_ms_per_request']:.2f} | {ref['cpu_ms_per_request'] / r['cpu_ms_per_request']:.2f}x | "
                     f"{r['load']:.1f} | {emb} | {rss} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="an embshard-train out_dir (default: train one)")
    parser.add_argument("--duration-s", type=float, default=4.0, help="per measurement, after 1 s of warm-up")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds over the servers (medians)")
    parser.add_argument("--split-fraction", type=float, default=0.75,
                        help="2-rank artifacts are planned for this fraction of the tables' bytes per rank (< 1: split); "
                             "0: export defaults (16 GiB per rank, the planner may replicate)")
    parser.add_argument("--max-requests", type=int, default=20_000)
    parser.add_argument("--samples-per-request", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve.md")
    parser.add_argument("--reference-server", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    add_malloc_argument(parser)
    args = parser.parse_args()
    if args.reference_server:
        reference_server(args.reference_server, args.port_file)
        return
    commit, load_before = commit_label(), load_average()
    os.environ.update(malloc_env(args.malloc))  # every process started from here on: the servers (and training, export)
    tmp = Path(tempfile.mkdtemp(prefix="serve_load_"))
    run_dir = args.run
    if run_dir is None:
        run_dir = tmp / "run"
        print(f"training {run_dir} ...", flush=True)
        run_cli(["embshard-train", *TRAIN_ARGS, f"out_dir={run_dir}"])
    run = find_run(run_dir)
    layout = FeatureLayout.from_specs(run.specs, NUM_DENSE, run.model.sequence.max_history_length)
    samples = SyntheticSource(SyntheticConfig(), layout, "eval").read(0, 256 * args.samples_per_request)
    bodies = [json.dumps(predict_body(samples.slice(i, i + args.samples_per_request), layout)).encode()
              for i in range(0, len(samples), args.samples_per_request)]
    servers = {}  # name -> (process, pids): all up at once, so that their measurements alternate
    try:
        for name, world, dtype in SERVERS:
            if world is None:
                server = start_reference(run_dir, tmp / "reference")
                servers[name] = (server, [server.proc.pid])
                continue
            artifact = tmp / f"artifact_{dtype}_w{world}"
            memory = [f"hbm_gib={split_hbm_gib(run.specs, dtype, args.split_fraction)}"] \
                if world > 1 and args.split_fraction > 0 else []
            run_cli(["embshard-export", f"checkpoint={run_dir}", f"out={artifact}", f"world_size={world}", f"dtype={dtype}",
                     *memory])
            server = ServeProcess.start([f"artifact={artifact}", f"launcher.nproc={world}"], tmp / name.replace(" ", "_"))
            servers[name] = (server, [server.proc.pid, *server.rank_pids()])
        runs: dict[tuple[str, int], list[dict]] = {}
        for concurrency in CONCURRENCY:
            for _ in range(args.repeats):
                for name, (server, pids) in servers.items():
                    runs.setdefault((name, concurrency), []).append(measure(name, server, pids, bodies, concurrency, args))
    finally:
        for server, _ in servers.values():
            server.stop()
    rows = [medians(runs[name, c]) for name in servers for c in CONCURRENCY]
    args.out.write_text(markdown(rows, args, run_dir, commit, (load_before, load_average())))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
