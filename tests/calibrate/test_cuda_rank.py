"""One nccl rank on the GPU against one gloo rank on the CPU (world size 1): the same plan's
collections give the same outputs, and the same tables after fused optimizer updates.
Skipped without CUDA; benchmarks/gpu_check.sh runs it on a GPU machine.

    .venv/bin/python -m pytest tests/calibrate/test_cuda_rank.py
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from embshard.ports import free_port
from embshard.calibrate.synthetic import synthetic_batch
from embshard.planner import manual_plan
from embshard.runtime import ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.specs import TableSpec
from embshard.topology import Topology

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

POOLED = [TableSpec("fbgemm", 1000, 16, 3.0), TableSpec("adam", 500, 8, 2.0, optimizer="adam"),  # torch kernel on CPU, FBGEMM's on GPU
          TableSpec("rows", 800, 32, 4.0), TableSpec("replica", 200, 8, 2.0), TableSpec("sgd", 300, 8, 2.0, optimizer="sgd")]
SEQUENCE = [TableSpec("seq", 300, 8, 2.0, pooled=False)]
LAYOUT = {"fbgemm": ("table_wise", [0]), "adam": ("table_wise", [0]), "rows": ("row_wise", [0]),
          "replica": ("data_parallel", [0]), "sgd": ("table_wise", [0]), "seq": ("table_wise", [0])}
STEPS = 3


@pytest.fixture(scope="module")
def groups():
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    yield dist.group.WORLD, dist.new_group([0], backend="gloo")
    dist.destroy_process_group()


def _values(out) -> torch.Tensor:
    return out.values() if hasattr(out, "length_per_key") else torch.cat([jt.values() for jt in out.values()])


def test_one_gpu_rank_matches_one_cpu_rank(groups):
    nccl_pg, gloo_pg = groups
    cuda = torch.device("cuda", 0)
    plan = manual_plan([*POOLED, *SEQUENCE], Topology(world_size=1, local_world_size=1, hbm_gib=8, batch_size_per_rank=64,
                                                      device="cuda"), LAYOUT)
    on = {"cpu": [ShardedEmbeddingBagCollection(POOLED, plan, gloo_pg), ShardedEmbeddingCollection(SEQUENCE, plan, gloo_pg)],
          "cuda": [ShardedEmbeddingBagCollection(POOLED, plan, nccl_pg, device=cuda),
                   ShardedEmbeddingCollection(SEQUENCE, plan, nccl_pg, device=cuda)]}
    gen = torch.Generator().manual_seed(7)
    for step in range(STEPS):
        batches = [synthetic_batch(specs, 64, gen) for specs in (POOLED, SEQUENCE)]
        outs = {}
        for where, device in (("cpu", torch.device("cpu")), ("cuda", cuda)):
            outs[where] = [_values(m(b.to(device))) for m, b in zip(on[where], batches)]
        for cpu_out, gpu_out in zip(outs["cpu"], outs["cuda"]):
            assert gpu_out.is_cuda and cpu_out.shape == gpu_out.shape
            torch.testing.assert_close(gpu_out.cpu(), cpu_out, rtol=1e-4, atol=1e-5, msg=f"step {step}: outputs differ")
        seeds = [torch.randn(o.shape, generator=gen) for o in outs["cpu"]]
        torch.autograd.backward(outs["cpu"], seeds)
        torch.autograd.backward(outs["cuda"], [s.to(cuda) for s in seeds])
        with torch.no_grad():  # eval forwards: FBGEMM's adam counts forwards, the runtime counts updates
            for where, device in (("cpu", torch.device("cpu")), ("cuda", cuda)):
                for m, b in zip(on[where], batches):
                    m(b.to(device))
    fresh = [ShardedEmbeddingBagCollection(POOLED, plan, gloo_pg), ShardedEmbeddingCollection(SEQUENCE, plan, gloo_pg)]
    for cpu_module, gpu_module, initial in zip(on["cpu"], on["cuda"], fresh):
        cpu_state, gpu_state, initial_state = cpu_module.state_dict(), gpu_module.state_dict(), initial.state_dict()
        assert sorted(cpu_state) == sorted(gpu_state)
        for name, shard in cpu_state.items():
            assert not torch.equal(shard.weight, initial_state[name].weight), f"table {name} was not updated"
            torch.testing.assert_close(gpu_state[name].weight.cpu(), shard.weight, rtol=1e-4, atol=1e-5,
                                       msg=f"table {name}: weights differ after {STEPS} updates")
            if "step" in shard.optimizer_state:
                assert int(gpu_state[name].optimizer_state["step"]) == int(shard.optimizer_state["step"]) == STEPS
