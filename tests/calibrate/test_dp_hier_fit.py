"""The hierarchical all-reduce's own CPU work (dp_hier_*): measured hierarchical and flat by embshard-calibrate,
fitted back (embshard.calibrate.fit.dp_hier_fit), and written to the profile."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import yaml

from embshard.calibrate import calibrate
from embshard.calibrate.calibrate import profile_yaml
from embshard.calibrate.fit import dp_allreduce_bytes, dp_hier_fit, fit
from embshard.calibrate.measure import PHASES
from embshard.planner.cost.allreduce import flat_total_ms, hierarchical_total_ms, runtime_allreduce_ms
from embshard.planner.cost.perf import rank_perfs
from embshard.topology import Topology

CPU = Topology(world_size=2, local_world_size=2, hbm_gib=4, batch_size_per_rank=64, device="cpu")
TRUTH = replace(CPU, full_duplex=False, hbm_gb_per_s=50.0, intra_host_gb_per_s=2.5, collective_ms=0.2, dist_ns_per_byte=0.6,
                dp_allreduce_factor=1.3, dp_hier_ns_per_byte=1.7, dp_hier_call_ms=0.5)
PCFG = {"num_tables": 5, "seed": 3, "max_rows": 20_000, "max_pooling": 40.0, "steps": 1, "warmup": 0, "dp_hier_plans": 3}


def _measured(p):
    """Ranks 'measured' by the model of TRUTH on one host (the other host's ranks local): the hierarchy where the plan
    reduces in host, else the ring, in dp_allreduce (under its factor); the other phases as the model says."""
    one_host = replace(TRUTH, world_size=4, local_world_size=2, batch_size_per_rank=p.topology.batch_size_per_rank,
                       inter_host_gb_per_s=TRUTH.intra_host_gb_per_s, reduce_in_host=p.topology.reduce_in_host)
    total = hierarchical_total_ms if p.topology.reduce_in_host else flat_total_ms
    dp_ms = TRUTH.dp_allreduce_factor * sum(total(b, one_host) for b in dp_allreduce_bytes(p))
    return SimpleNamespace(ranks=[SimpleNamespace(cpu_ms={**{ph: getattr(x, ph) for ph in PHASES}, "dp_allreduce_ms": dp_ms})
                                  for x in rank_perfs(p.specs, replace(one_host, reduce_in_host=False), p.tables)])


def test_calibrate_runs_each_layout_hierarchical_and_flat_and_the_fit_recovers_the_terms(monkeypatch):
    ran = []

    def fake(plans, **_):
        ran.append([p.topology.reduce_in_host for p in plans])
        return [_measured(p) for p in plans]

    monkeypatch.setattr(calibrate, "measure_plans", fake)
    entries = calibrate.measure_dp_hier(PCFG, 256, "cpu", 60, log=lambda _: None)
    assert ran == [[True] * 3 + [False] * 3] and len(entries) == 3
    sizes = [sum(dp_allreduce_bytes(calibrate.ShardingPlan.from_dict(e["plan"]))) for e in entries]
    assert len(set(sizes)) == 3 and max(sizes) <= 16e6  # buffers of several sizes: per byte and per call apart
    assert calibrate.measure_dp_hier({**PCFG, "dp_hier_plans": 0}, 256, "cpu", 60, log=lambda _: None) == []
    pairs = calibrate.host_reduce_pairs(json.loads(json.dumps({"dp_hier": entries})), "dp_hier")  # as read back from data_out
    # the terms the other steps fit (held here), and the factor of the plans' dp_allreduce phase
    theta = {"intra_host_gb_per_s": 1 / (TRUTH.intra_host_gb_per_s * 1e6), "collective_ms": TRUTH.collective_ms,
             "dist_ns_per_byte": TRUTH.dist_ns_per_byte, "hbm_gb_per_s": 1 / (TRUTH.hbm_gb_per_s * 1e6)}
    got = dp_hier_fit(pairs, theta, {"dp_allreduce_factor": TRUTH.dp_allreduce_factor})
    assert got["dp_hier_ns_per_byte"] == pytest.approx(1.7, rel=1e-6) and got["dp_hier_call_ms"] == pytest.approx(0.5, rel=1e-6)
    # fit() runs that step where such layouts were measured; without them the terms stay 0 (the older model)
    assert fit([], [], theta, dp_hier=pairs).theta["dp_hier_ns_per_byte"] > 0
    without = fit([], [], theta).theta
    assert (without["dp_hier_ns_per_byte"], without["dp_hier_call_ms"]) == (0.0, 0.0)
    fitted = replace(TRUTH, **{k: got[k] for k in ("dp_hier_ns_per_byte", "dp_hier_call_ms")})
    text = profile_yaml(fitted, {"dp_hier": entries, "machine_start": {}}, fit([], [], theta, dp_hier=pairs), "test")
    assert "# dp_hier_* (the hierarchical all-reduce's CPU work) fitted on 3 data-parallel layouts on 4 local ranks" in text
    assert yaml.safe_load(text)["dp_hier_ns_per_byte"] == pytest.approx(1.7, rel=1e-5)
    two_hosts = replace(TRUTH, world_size=4, inter_host_gb_per_s=0.5)
    assert runtime_allreduce_ms(10e6, replace(two_hosts, **{k: got[k] for k in ("dp_hier_ns_per_byte", "dp_hier_call_ms")})) == \
        pytest.approx(runtime_allreduce_ms(10e6, two_hosts))
