"""Phase attribution of measured steps (stand-in nodes, and one real gloo rank in this process), and rounds in
alternating order."""

from __future__ import annotations

import datetime
import time
from dataclasses import replace

import torch

from embshard.calibrate import measure
from embshard.calibrate.measure import PhaseClock, instrument_backward, measure_rounds
from embshard.planner import evaluate, manual_plan
from embshard.ports import free_port
from embshard.specs import TableSpec
from embshard.topology import Topology


def _stand_in(name: str, backward_work) -> type:
    """An autograd Function named like the runtime's node it stands in for (the phase clock goes by the class
    name): identity forward; backward runs backward_work(grad) and returns its result."""
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(lambda ctx, x: x * 1.0),
                                                   "backward": staticmethod(lambda ctx, grad: backward_work(grad))})


def _sleep_and_double(grad):
    time.sleep(0.01)
    return grad * 2.0


_LocalPart = _stand_in("_LocalPart", _sleep_and_double)  # embshard.runtime.comm._LocalPart, no process group


def test_replicas_gradient_exchange_counts_as_output_dist_backward():
    x = torch.ones(4, requires_grad=True)
    y = _LocalPart.apply(x)
    clock = PhaseClock()
    assert instrument_backward([y], clock) == 1
    y.backward(torch.ones(4))
    assert clock.wall["output_dist_bwd_ms"] >= 0.01 and "lookup_bwd_ms" not in clock.wall


def _update_and_all_reduce(grad):
    """embshard.runtime.dense_replicas._LocalLookup's backward: updates the replicas (10 ms) and all-reduces
    their gradients hierarchically (as embshard.runtime.wire does, through the module's name)."""
    from embshard.runtime import wire

    time.sleep(0.01)
    wire.hierarchical_all_reduce(grad, None)
    return grad


_LocalLookup = _stand_in("_LocalLookup", _update_and_all_reduce)


def test_replicas_update_is_lookup_backward_and_their_all_reduce_dp_allreduce_hierarchy_whole(monkeypatch):
    """The allreduce mode's backward node is lookup backward (as allreduce_perf prices it), not output dist; the
    hierarchical all-reduce inside it counts whole (its own copies, 10 ms, and its collectives, 30 ms, once) as dp_allreduce."""
    import torch.distributed as dist

    from embshard.runtime import wire

    def hierarchy(x, hosts):
        time.sleep(0.01)
        dist.all_reduce(x)

    monkeypatch.setattr(dist, "all_reduce", lambda x, group=None: time.sleep(0.03))
    monkeypatch.setattr(wire, "hierarchical_all_reduce", hierarchy)
    x = torch.ones(4, requires_grad=True)
    y = _LocalLookup.apply(x)
    clock = PhaseClock()
    assert instrument_backward([y], clock) == 1
    with measure.timed_replica_sync(clock):
        y.backward(torch.ones(4))
    assert wire.hierarchical_all_reduce is hierarchy  # unwrapped again
    dp, lookup = clock.wall["dp_allreduce_ms"], clock.wall["lookup_bwd_ms"]
    assert 0.04 <= dp < 0.065 and lookup >= dp + 0.01 and "output_dist_bwd_ms" not in clock.wall


def test_rounds_alternate_the_order_and_come_back_per_plan(monkeypatch):
    topo = Topology(world_size=2, local_world_size=2, hbm_gib=1, device="cpu")
    plans = [manual_plan([TableSpec("t", 100 * (i + 1), 8, 1.0)], topo, {"t": ("table_wise", [0])}) for i in range(3)]
    calls = []

    def fake(batch, **_):
        calls.append([p.specs[0].num_embeddings for p in batch])
        return [f"{p.specs[0].num_embeddings}@{len(calls)}" for p in batch]

    monkeypatch.setattr(measure, "measure_plans", fake)
    out = measure_rounds(plans, 3, log=lambda _: None)
    assert calls == [[100, 200, 300], [300, 200, 100], [100, 200, 300]]
    assert out == [["100@1", "100@2", "100@3"], ["200@1", "200@2", "200@3"], ["300@1", "300@2", "300@3"]]
    assert measure_rounds([], 2) == []


def test_the_allreduce_modes_exchange_is_dp_allreduce_and_its_update_lookup_backward_though_training_overlaps_them():
    """In training the allreduce mode's all-reduce is in flight while the rest of backward runs and its update runs in
    an engine callback when backward ends (embshard.runtime.dense_replicas); measured, the exchange is dp_allreduce
    and the update of every row lookup backward, as allreduce_perf prices them. Here the update of a 100,000-row
    table is most of the step: measured as output dist (outside every timed node), it made the calibration's
    dp_allreduce_factor 0.15 and its output_dist_factor 2.2 (AMD EPYC profile of 2026-12-02)."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        specs = [TableSpec("big", 100_000, 64, 2.0, optimizer="adagrad")]
        topo = Topology(world_size=1, local_world_size=1, hbm_gib=4, batch_size_per_rank=256, device="cpu")
        tables = [replace(t, data_parallel_mode="allreduce")
                  for t in manual_plan(specs, topo, {"big": ("data_parallel", [0])}).tables]
        raw = measure.run_plan_in_rank(evaluate(specs, topo, tables), dist.group.WORLD, steps=3, warmup=1)
    finally:
        dist.destroy_process_group()
    cpu = measure.summarize_rank(raw).cpu_ms
    assert cpu["dp_allreduce_ms"] > 0
    assert cpu["lookup_bwd_ms"] > 4 * cpu["output_dist_bwd_ms"], cpu
