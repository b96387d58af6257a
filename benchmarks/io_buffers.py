"""I/O buffers: what the runtime allocates per rank in a training step vs embshard's and TorchRec's memory models.

    .venv/bin/python benchmarks/io_buffers.py      # 2 gloo ranks on CPU, about 20 s

Six pooled table-wise tables (20,000 rows, 64 wide, pooling factor 8) on 2 ranks, batch 512 per rank, one step
(forward, a dense layer on the embeddings, backward) after two warm-up steps. Measured: the step's peak of the
tensors the step allocates (torch.distributed._tools.mem_tracker's peak, less the weights and optimizer state
the collection holds). embshard's model: `holder_storage` I/O of the rank's shards (received ids and lengths, the
pooled output and its gradient) plus `requester_storage` of every table (the rank's own samples' outputs and their
gradients). TorchRec's: its storage estimator's (`calculate_pipeline_io_cost` without a pipeline) input + output of
each shard, and no buffers for the rank's own samples. Two cases: every table with one optimizer (the rank runs one
pooled kernel), and two optimizers (two kernels, whose outputs output dist concatenates).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed._tools.mem_tracker import MemTracker
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.planner import manual_plan
from embshard.planner.cost.storage import holder_storage, requester_storage
from embshard.planner.types import ShardingType
from embshard.runtime import OptimizerConfig, ShardedEmbeddingBagCollection
from embshard.specs import TableSpec
from embshard.topology import Topology

WORLD, BATCH, POOLING, ROWS, DIM, TABLES = 2, 512, 8, 20_000, 64, 6
ID_BYTES, OUTPUT_BYTES = 8, 4  # TorchRec's input (int64 ids) and output (fp32) element sizes
MIB = 2**20


def specs(optimizers: tuple[str, ...]) -> list[TableSpec]:
    return [TableSpec(f"t{i}", ROWS, DIM, pooling_factor=float(POOLING), optimizer=optimizers[i // WORLD % len(optimizers)])
            for i in range(TABLES)]


def _rank(rank: int, port: int, optimizers: tuple[str, ...], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    tables = specs(optimizers)
    topo = Topology(world_size=WORLD, local_world_size=WORLD, hbm_gib=16, batch_size_per_rank=BATCH)
    plan = manual_plan(tables, topo, {s.name: (ShardingType.TABLE_WISE, [i % WORLD]) for i, s in enumerate(tables)})
    collection = ShardedEmbeddingBagCollection(tables, plan, dist.group.WORLD, optimizer=OptimizerConfig(learning_rate=0.01))
    features = [f for s in tables for f in s.feature_names]
    gen = torch.Generator().manual_seed(rank)
    kjt = KeyedJaggedTensor(keys=features, lengths=torch.full((len(features) * BATCH,), POOLING, dtype=torch.int64),
                            values=torch.cat([torch.randint(0, ROWS, (BATCH * POOLING,), generator=gen) for _ in tables]))
    top = torch.randn(DIM * TABLES, 1, requires_grad=True)
    for step in range(3):
        tracker = MemTracker()
        if step == 2:
            tracker.track_external(collection, top)
            tracker.__enter__()
        (collection(kjt).values() @ top).sum().backward()
        if step == 2:
            tracker.__exit__(None, None, None)
    peak = {str(k): v for k, v in next(v for d, v in tracker.get_tracker_snapshot("peak").items() if str(d) == "cpu").items()}
    held = [t for t in plan.tables if t.shards[0].rank == rank]
    G = WORLD * BATCH
    Path(out).write_text(json.dumps({
        "kernels": len(collection.kernels),
        "measured": peak["Total"] - peak["_MemRefType.PARAM"] - peak["_MemRefType.BUFFER"] - peak["_MemRefType.OPT"],
        "holder": sum(holder_storage(s, topo, t.sharding_type, ROWS, DIM).io_bytes for t in held for s in tables if s.name == t.name),
        "requester": sum(requester_storage(s, topo).io_bytes for s in tables),
        "torchrec": len(held) * (G * POOLING * ID_BYTES + G * DIM * OUTPUT_BYTES)}))
    dist.destroy_process_group()


def measure(optimizers: tuple[str, ...]) -> list[dict]:
    """Each rank's measured peak and the models' bytes for it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(port, optimizers, tmp), nprocs=WORLD)
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _worker(rank: int, port: int, optimizers: tuple[str, ...], tmp: str) -> None:
    _rank(rank, port, optimizers, str(Path(tmp) / f"rank{rank}.json"))


def main() -> None:
    torch.set_num_threads(1)
    print("| optimizers | rank | kernels | measured MiB | embshard MiB (holder + requester) | embshard / measured | "
          "TorchRec MiB | TorchRec / measured |")
    print("|---|---|---|---|---|---|---|---|")
    for optimizers in (("rowwise_adagrad",), ("sgd", "adagrad")):
        for r, m in enumerate(measure(optimizers)):
            es = m["holder"] + m["requester"]
            print(f"| {'+'.join(optimizers)} | {r} | {m['kernels']} | {m['measured'] / MIB:.2f} | {es / MIB:.2f} "
                  f"({m['holder'] / MIB:.2f} + {m['requester'] / MIB:.2f}) | {es / m['measured']:.2f} | "
                  f"{m['torchrec'] / MIB:.2f} | {m['torchrec'] / m['measured']:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
