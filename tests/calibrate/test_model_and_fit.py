"""Calibrated cost terms: off by default, where they apply, and that the fit recovers them."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import yaml

from embshard.calibrate.calibrate import fit_data, profile_yaml
from embshard.calibrate.fit import TERMS, Sample, fit, unit_topology
from embshard.calibrate.kernels import KernelPoint
from embshard.calibrate.measure import PHASES
from embshard.calibrate.synthetic import bench_tables, random_plan
from embshard.planner import evaluate, plan
from embshard.planner.cost.lookup import expected_distinct_rows
from embshard.planner.cost.perf import (allreduce_ms, collective_fixed_ms, fixed_perf, holder_perf, rank_perf, rank_perfs,
                                        spread_comm_ms)
from embshard.planner.types import Perf, ShardingType
from embshard.specs import TableSpec
from embshard.topology import CALIBRATED_TERMS, PHASE_FACTORS, SHARED_TABLE_TERMS, Topology
from embshard.workloads import generate_tables

CPU = Topology(world_size=2, local_world_size=2, hbm_gib=4, batch_size_per_rank=64, device="cpu")
TRUE_TERMS = dict(hbm_gb_per_s=50.0, intra_host_gb_per_s=2.5, inter_host_gb_per_s=0.2, collective_ms=0.2, inter_host_collective_ms=0.8,
                  input_dist_call_ms=0.9, output_dist_call_ms=0.3,
                  lookup_fwd_call_ms=0.7, lookup_bwd_call_ms=0.2, lookup_fwd_ns_per_id=5.0, lookup_bwd_ns_per_id=20.0,
                  lookup_bwd_ns_per_row=400.0, lookup_bwd_shared_ns_per_row=60.0, lookup_bwd_shared_ns_per_row_byte=0.3,
                  lookup_ns_per_row_byte=0.25, lookup_ns_per_out_byte=0.2, sequence_bwd_ns_per_row=2000.0,
                  dist_ns_per_id=10.0, dist_ns_per_bag=80.0, dist_ns_per_byte=0.6, sequence_dist_ns_per_id=25.0,
                  dp_fwd_ns_per_id=3.0, dp_bwd_ns_per_id_byte=0.4, dp_bwd_ns_per_row=30.0,  # allreduce mode's local lookup
                  dp_dense_gb_per_s=1.5)  # and its dense full-table work: far below hbm_gb_per_s


def test_defaults_are_the_datasheet_model():
    topo = Topology(world_size=8, local_world_size=4, hbm_gib=32)
    assert topo.full_duplex and all(getattr(topo, t) == 0.0 for t in CALIBRATED_TERMS)
    assert all(getattr(topo, f) == 1.0 for f in PHASE_FACTORS)
    assert fixed_perf(topo, 2, 10) == Perf()  # no fixed cost per collection or kernel call
    specs = generate_tables(30, seed=2, sequence_fraction=0.3)
    p = plan(specs, topo, time_budget_s=1)
    assert {t.sharding_type for t in p.tables} >= {ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL}

    # The datasheet model is bytes over bandwidths: twice every bandwidth halves every phase of every rank.
    def faster(t: Topology, k: float) -> Topology:
        return replace(t, hbm_gb_per_s=k * t.hbm_gb_per_s, intra_host_gb_per_s=k * t.intra_host_gb_per_s,
                       inter_host_gb_per_s=k * t.inter_host_gb_per_s, dp_dense_gb_per_s=k * t.dp_dense_gb_per_s)

    halved = evaluate(specs, faster(topo, 2), p.tables)
    for slow, fast in zip(p.ranks, halved.ranks):
        assert fast.perf.to_dict() == pytest.approx({k: v / 2 for k, v in slow.perf.to_dict().items()}, rel=1e-12)
        assert slow.perf.input_dist_ms > 0 and slow.perf.lookup_bwd_ms > 0 and slow.perf.dp_allreduce_ms > 0
    # ... which a calibrated term (work that is not bytes) breaks
    latency = replace(topo, collective_ms=0.01)
    assert evaluate(specs, faster(latency, 2), p.tables).max_rank_ms > 0.51 * evaluate(specs, latency, p.tables).max_rank_ms


def test_terms_apply_where_documented():
    spec = TableSpec("t", 1000, 16, 4.0)
    base = holder_perf(spec, CPU, ShardingType.TABLE_WISE, 1000, 16, 1)
    with_id = holder_perf(spec, replace(CPU, lookup_fwd_ns_per_id=10.0), ShardingType.TABLE_WISE, 1000, 16, 1)
    ids = CPU.global_batch_size * 4.0
    assert with_id.lookup_fwd_ms - base.lookup_fwd_ms == pytest.approx(ids * 10.0 * 1e-6)
    assert with_id.lookup_bwd_ms == base.lookup_bwd_ms
    doubled = holder_perf(spec, replace(CPU, lookup_bwd_factor=2.0), ShardingType.TABLE_WISE, 1000, 16, 1)
    assert doubled.lookup_bwd_ms == pytest.approx(2 * base.lookup_bwd_ms) and doubled.lookup_fwd_ms == base.lookup_fwd_ms
    assert expected_distinct_rows(1.0, 10**6) == pytest.approx(1.0, rel=1e-5)
    assert expected_distinct_rows(1e6, 100) == pytest.approx(100.0)
    assert expected_distinct_rows(100, 100) == pytest.approx(100 * (1 - math.exp(-1)))


def test_a_table_several_features_look_up_is_updated_at_its_own_terms():
    """FBGEMM's CPU backward takes its fast path only for a pooled table of one feature; a table shared by features
    runs a generic loop over the row's columns: its distinct rows cost lookup_bwd_shared_* instead of lookup_bwd_ns_per_row
    (measured on this machine: a 250k x 128 table 4 features look up updates its rows in half the time)."""
    terms = replace(CPU, lookup_bwd_ns_per_row=600.0, lookup_bwd_shared_ns_per_row=50.0, lookup_bwd_shared_ns_per_row_byte=0.5)
    one = TableSpec("one", 250_000, 128, 16.0)
    four = TableSpec("four", 250_000, 128, 4.0, feature_names=("a", "b", "c", "d"))  # the same ids per sample
    sequence = TableSpec("seq", 250_000, 128, 4.0, pooled=False, feature_names=("a", "b", "c", "d"))
    perf = {s.name: holder_perf(s, terms, ShardingType.TABLE_WISE, 250_000, 128, 1) for s in (one, four, sequence)}
    rows = expected_distinct_rows(CPU.global_batch_size * 16.0, 250_000)
    row_bytes = 512 + one.optimizer_state_bytes_per_row(128)
    off = replace(terms, lookup_bwd_ns_per_row=0.0, lookup_bwd_shared_ns_per_row=0.0, lookup_bwd_shared_ns_per_row_byte=0.0)
    update = {s.name: perf[s.name].lookup_bwd_ms - holder_perf(s, off, ShardingType.TABLE_WISE, 250_000, 128, 1).lookup_bwd_ms
              for s in (one, four, sequence)}
    assert update["one"] == pytest.approx(rows * 600.0 * 1e-6) and update["seq"] == pytest.approx(rows * 600.0 * 1e-6)  # nobag: its own path
    assert update["four"] == pytest.approx(rows * (50.0 + 0.5 * row_bytes) * 1e-6) and update["four"] < update["one"]
    # a profile (or plan) without the terms prices such a table as one of one feature, as before them
    old = Topology.from_dict({"world_size": 2, "local_world_size": 2, "hbm_gib": 4, "batch_size_per_rank": 64, "device": "cpu",
                              "lookup_bwd_ns_per_row": 600.0})
    assert (old.lookup_bwd_shared_ns_per_row, old.lookup_bwd_shared_ns_per_row_byte) == (600.0, 0.0)
    old_update = (holder_perf(four, old, ShardingType.TABLE_WISE, 250_000, 128, 1).lookup_bwd_ms
                  - holder_perf(four, replace(old, **{t: 0.0 for t in ("lookup_bwd_ns_per_row", *SHARED_TABLE_TERMS)}),
                                ShardingType.TABLE_WISE, 250_000, 128, 1).lookup_bwd_ms)
    assert old_update == pytest.approx(update["one"])
    assert "lookup_bwd_shared_ns_per_row" not in old.to_dict() and Topology.from_dict(old.to_dict()) == old
    assert Topology.from_dict(terms.to_dict()) == terms


def test_half_duplex_adds_the_two_sides_and_fixed_costs():
    held, req = Perf(input_dist_ms=2.0, output_dist_fwd_ms=1.0), Perf(input_dist_ms=3.0, output_dist_fwd_ms=0.5)
    fixed = fixed_perf(replace(CPU, collective_ms=0.1, input_dist_call_ms=1.0, lookup_fwd_call_ms=0.5), 2, 3)
    assert fixed.input_dist_ms == pytest.approx(2 * (1.0 + 3 * 0.1)) and fixed.lookup_fwd_ms == pytest.approx(1.5)
    assert rank_perf(held, req, Perf(), Perf(), CPU).input_dist_ms == 3.0  # full duplex: max
    half = rank_perf(held, req, Perf(), fixed, replace(CPU, full_duplex=False))
    assert half.input_dist_ms == pytest.approx(5.0 + 2.6) and half.output_dist_fwd_ms == pytest.approx(1.5 + fixed.output_dist_fwd_ms)


@pytest.mark.parametrize("key,value,needle", [
    ("lookup_bwd_ns_per_row", -1.0, "lookup_bwd_ns_per_row: must be a number >= 0"),
    ("lookup_bwd_factor", 0, "lookup_bwd_factor: must be a positive factor"),
    ("full_duplex", "no", "full_duplex: must be true or false"),
])
def test_topology_rejects_bad_terms(key, value, needle):
    with pytest.raises(ValueError, match=needle):
        Topology.from_dict({"world_size": 2, "device": "cpu", key: value})


def synthetic_samples(truth: Topology) -> tuple[list[Sample], list[dict]]:
    """Measurements that the model explains exactly: kernel points, random plans, collectives."""
    samples = []
    for kind, pooled, rows, dim, batch, pf, nf in [("fbgemm", True, n, d, b, p, 1) for n in (100, 10_000, 200_000) for d in (16, 64, 128)
                                                   for b, p in ((64, 1.0), (512, 8.0), (2048, 30.0))] + \
            [("fbgemm", True, n, d, 512, p, 4) for n in (10_000, 200_000) for d in (16, 128) for p in (1.0, 8.0)] + \
            [("fbgemm", False, n, 32, b, p, 1) for n in (100, 50_000) for b, p in ((64, 2.0), (1024, 10.0))] + \
            [(k, True, n, d, b, p, 1) for k in ("dp", "allreduce") for n in (100, 5_000, 50_000) for d in (16, 64)
             for b, p in ((64, 3.0), (1024, 20.0))]:
        # the allreduce mode's points on 2 ranks, as embshard-calibrate runs them (kernels.allreduce_ranks)
        ranks = 2 if kind == "allreduce" else 1
        p_ = KernelPoint(kind, pooled, rows, dim, batch, pf, nf, ranks).plan()
        pred = rank_perfs(p_.specs, replace(truth, world_size=ranks, local_world_size=ranks, batch_size_per_rank=batch,
                                               **{f: 1.0 for f in PHASE_FACTORS}), p_.tables)
        samples.append(Sample(p_, tuple({ph: getattr(x, ph) for ph in PHASES} for x in pred), "kernels"))
    for i in range(4):
        topo = replace(CPU, world_size=2 + 2 * (i % 2), local_world_size=2 + 2 * (i % 2), batch_size_per_rank=256)
        p_ = random_plan(bench_tables(6, seed=i, max_rows=20_000), topo, seed=i)
        pred = rank_perfs(p_.specs, replace(truth, world_size=topo.world_size, local_world_size=topo.world_size,
                                               batch_size_per_rank=256), p_.tables)
        samples.append(Sample(p_, tuple({ph: getattr(x, ph) for ph in PHASES} for x in pred), "plans"))
    collectives = []
    # local ranks (one host: CPU time) and one rank on each of 2 or 3 hosts (embshard.calibrate.hosts: wall time)
    for W, L, clock in ((2, 2, "cpu_ms"), (4, 4, "cpu_ms"), (2, 1, "wall_ms"), (3, 1, "wall_ms")):
        for nbytes in (1000, 10**6, 10**7):
            t = replace(truth, world_size=W, local_world_size=L)
            other = {"wall_ms" if clock == "cpu_ms" else "cpu_ms": 0.01}  # the clock the fit must not read
            collectives.append({"op": "all_to_all", "world_size": W, "local_world_size": L, "bytes": nbytes, "rank": 0,
                                clock: collective_fixed_ms(t) + 2 * spread_comm_ms(nbytes, t), **other})
            collectives.append({"op": "all_reduce", "world_size": W, "local_world_size": L, "bytes": nbytes, "rank": 0,
                                clock: collective_fixed_ms(t, 2) + allreduce_ms(nbytes, t), **other})
    return samples, collectives


def test_fit_recovers_the_terms_and_factors():
    truth = replace(CPU, full_duplex=False, replicated_dp_lookup=True, lookup_bwd_factor=1.5, output_dist_factor=0.8, **TRUE_TERMS)
    samples, collectives = synthetic_samples(truth)
    result = fit(samples, collectives)
    got = result.topology(CPU)
    for term in TERMS:
        assert getattr(got, term) == pytest.approx(getattr(truth, term), rel=1e-3), term
    assert result.factors["lookup_bwd_factor"] == pytest.approx(1.5, rel=1e-3)
    assert result.factors["output_dist_factor"] == pytest.approx(0.8, rel=1e-3)
    assert result.factors["lookup_fwd_factor"] == pytest.approx(1.0, rel=1e-3)
    assert all(e["median"] < 1e-3 for e in result.errors.values())
    # the profile file reads back as the same topology (6 significant digits)
    data = {"machine_start": {"cpu": "test", "cores": 2}, "measure_s": 0}
    raw = yaml.safe_load(profile_yaml(got, data, result, "test"))
    loaded = Topology.from_dict(raw)
    assert not loaded.full_duplex and loaded.replicated_dp_lookup
    for term in (*TERMS, *PHASE_FACTORS):
        assert getattr(loaded, term) == pytest.approx(getattr(got, term), rel=1e-5), term


def test_fit_separates_intra_and_inter_host_links_and_the_model_prices_each():
    truth = replace(CPU, full_duplex=False, replicated_dp_lookup=True, **TRUE_TERMS)
    samples, collectives = synthetic_samples(truth)
    got = fit(samples, collectives).topology(CPU)
    assert (got.intra_host_gb_per_s, got.inter_host_gb_per_s) == pytest.approx((2.5, 0.2), rel=1e-3)
    assert (got.collective_ms, got.inter_host_collective_ms) == pytest.approx((0.2, 0.8), rel=1e-3)
    # on 2 hosts x 2 ranks: of a rank's spread bytes 1/4 stays in its host, 2/4 cross (at the inter-host rate);
    # a collective pays 3 peers' latency, the 2 on the other host the inter-host extra too
    two_hosts = replace(got, world_size=4, local_world_size=2)
    assert spread_comm_ms(4e6, two_hosts) == pytest.approx(1e6 / 2.5e6 + 2e6 / 0.2e6, rel=1e-3)
    assert collective_fixed_ms(two_hosts) == pytest.approx(3 * 0.2 + 2 * 0.8, rel=1e-3)
    # without collectives between hosts (a one-host calibration) the inter-host terms keep the datasheet
    one_host = fit_data({"device": "cpu", "collectives": [c for c in collectives if c["local_world_size"] == c["world_size"]]})
    assert one_host.topology(CPU).inter_host_gb_per_s == 1.0 and one_host.theta["inter_host_collective_ms"] == 0.0
    assert one_host.topology(CPU).intra_host_gb_per_s == pytest.approx(2.5, rel=1e-3)


def test_unit_topology_isolates_one_term():
    spec = TableSpec("t", 1000, 16, 4.0)
    topo = unit_topology(CPU, "lookup_bwd_ns_per_row")
    perf = holder_perf(spec, topo, ShardingType.TABLE_WISE, 1000, 16, 1)
    distinct = expected_distinct_rows(CPU.global_batch_size * 4.0, 1000)
    assert perf.lookup_bwd_ms == pytest.approx(distinct * 1e-6) and perf.total_ms == pytest.approx(distinct * 1e-6)


HOST_REDUCE_TRUTH = dict(host_reduce_fwd_ns_per_byte=0.9, host_reduce_bwd_ns_per_byte=1.5, host_reduce_call_ms=0.4)


def host_reduce_pairs(truth: Topology) -> list[tuple[Sample, Sample]]:
    """Layouts on 4 local ranks as 2 hosts x 2, 'measured' by the model with and without the in-host reduction:
    on one host, the other host's ranks are local (their bytes cost what intra-host ones do, under the output-dist
    factor: the model leaves inter-host link time unfactored; host_reduce_fit fits output dist only)."""
    from embshard.calibrate.calibrate import flat
    from embshard.calibrate.synthetic import host_reduce_plan

    topo = replace(CPU, world_size=4, local_world_size=2, batch_size_per_rank=256)
    one_host = replace(truth, world_size=4, local_world_size=2, batch_size_per_rank=256, inter_host_gb_per_s=truth.intra_host_gb_per_s / truth.output_dist_factor, inter_host_collective_ms=0.0)
    pairs = []
    for seed in range(3):
        p = host_reduce_plan(bench_tables(6, seed=seed, max_rows=20_000), topo, seed)
        assert any(t.sharding_type.splits_rows for t in p.tables)
        measured = [tuple({ph: getattr(x, ph) for ph in PHASES} for x in rank_perfs(p.specs, t, p.tables))
                    for t in (one_host, replace(one_host, reduce_in_host=False))]
        pairs.append((Sample(p, measured[0], "host_reduce"), Sample(flat(p), measured[1], "host_reduce")))
    return pairs


def test_fit_recovers_the_in_host_reduction_terms():
    """The in-host reduction's CPU work (per byte of partial sums each way, per sub-group all-to-all) is fitted on
    layouts run with and without it, under the output-dist factor the other terms' plans give, the rest unchanged."""
    truth = replace(CPU, full_duplex=False, replicated_dp_lookup=True, output_dist_factor=0.8, **TRUE_TERMS, **HOST_REDUCE_TRUTH)
    samples, collectives = synthetic_samples(truth)
    pairs = host_reduce_pairs(truth)
    got = fit(samples, collectives, host_reduce=pairs).topology(CPU)
    for term in TERMS:
        assert getattr(got, term) == pytest.approx(getattr(truth, term), rel=1e-3), term
    without = fit(samples, collectives).topology(CPU)  # no such layouts measured: the terms stay 0 (the older model)
    assert (without.host_reduce_fwd_ns_per_byte, without.host_reduce_bwd_ns_per_byte, without.host_reduce_call_ms) == (0, 0, 0)
    # measurement files carry them as "host_reduce" entries; fit_data refits them from there
    data = {"device": "cpu", "collectives": collectives,
            "host_reduce": [{"plan": on.plan.to_dict(), "cpu_ms": list(on.measured), "cpu_ms_flat": list(off.measured)} for on, off in pairs]}
    refit = fit_data(data).topology(CPU)
    assert refit.host_reduce_bwd_ns_per_byte > 0 and refit.host_reduce_fwd_ns_per_byte > 0


def test_phase_factors_leave_inter_host_link_time_unscaled():
    """The factors scale a rank's work (fitted on one host); the time its bytes spend on inter-host links is wall time
    between hosts as calibrated (hosts.py), added as is: holder and requester sides alike."""
    spec = TableSpec("t", 10_000, 64, 4.0)
    topo = Topology(world_size=4, local_world_size=2, batch_size_per_rank=256, device="cpu", inter_host_gb_per_s=0.3, dist_ns_per_byte=0.5)
    factored = replace(topo, input_dist_factor=3.0, output_dist_factor=2.0)
    out_bytes = topo.global_batch_size * 64 * 4
    link_ms = out_bytes * 2 / 4 / (0.3 * 1e6)  # (W - L) / W of the outputs cross, at the inter-host rate
    plain, scaled = (holder_perf(spec, t, ShardingType.TABLE_WISE, 10_000, 64, 1) for t in (topo, factored))
    assert scaled.output_dist_fwd_ms == pytest.approx(2.0 * (plain.output_dist_fwd_ms - link_ms) + link_ms, rel=1e-9)
    assert scaled.output_dist_fwd_ms < 1.5 * plain.output_dist_fwd_ms  # the link is most of it: not doubled
    from embshard.planner.cost.perf import requester_perf
    req, req_scaled = (requester_perf(spec, t, ShardingType.TABLE_WISE, 1) for t in (topo, factored))
    req_link_ms = 256 * 64 * 4 * 2 / 4 / (0.3 * 1e6)
    assert req_scaled.output_dist_bwd_ms == pytest.approx(2.0 * (req.output_dist_bwd_ms - req_link_ms) + req_link_ms, rel=1e-9)


def test_calibrate_measures_each_layout_with_and_without_the_reduction_and_fits_them(monkeypatch):
    """embshard-calibrate's in-host reduction step (ranks mocked by the model, the truth above): every layout on 4 ranks
    as 2 hosts x 2 runs twice, with the reduction and flat, and the fit recovers the terms from the data file's entries."""
    from types import SimpleNamespace

    from embshard.calibrate import calibrate

    truth = replace(CPU, full_duplex=False, replicated_dp_lookup=True, **TRUE_TERMS, **HOST_REDUCE_TRUTH)
    ran = []

    def fake(plans, **_):
        ran.append([p.topology.reduce_in_host for p in plans])
        one_host = lambda p: replace(truth, world_size=4, local_world_size=2, batch_size_per_rank=p.topology.batch_size_per_rank,  # noqa: E731
                                     inter_host_gb_per_s=truth.intra_host_gb_per_s, inter_host_collective_ms=0.0,
                                     reduce_in_host=p.topology.reduce_in_host)
        return [SimpleNamespace(ranks=[SimpleNamespace(cpu_ms={ph: getattr(x, ph) for ph in PHASES})
                                       for x in rank_perfs(p.specs, one_host(p), p.tables)]) for p in plans]

    monkeypatch.setattr(calibrate, "measure_plans", fake)
    pcfg = {"num_tables": 6, "seed": 3, "max_rows": 20_000, "max_pooling": 40.0, "steps": 1, "warmup": 0, "host_reduce_plans": 3}
    entries = calibrate.measure_host_reduce(pcfg, 256, "cpu", 60, log=lambda _: None)
    assert ran == [[True] * 3 + [False] * 3] and len(entries) == 3
    assert calibrate.measure_host_reduce({**pcfg, "host_reduce_plans": 0}, 256, "cpu", 60, log=lambda _: None) == []
    samples, collectives = synthetic_samples(truth)
    pairs = calibrate.host_reduce_pairs(json.loads(json.dumps({"host_reduce": entries})))  # as read back from data_out
    assert [(on.plan.topology.reduce_in_host, off.plan.topology.reduce_in_host) for on, off in pairs] == [(True, False)] * 3
    got = fit(samples, collectives, host_reduce=pairs).topology(CPU)
    for term, value in HOST_REDUCE_TRUTH.items():
        assert getattr(got, term) == pytest.approx(value, rel=1e-3), term
    text = profile_yaml(got, {"host_reduce": entries, "machine_start": {}}, fit(samples, collectives, host_reduce=pairs), "test")
    assert "# host_reduce_* (the in-host reduction's CPU work) fitted on 3 layouts on 4 local ranks as 2 hosts" in text
    assert yaml.safe_load(text)["host_reduce_bwd_ns_per_byte"] == pytest.approx(1.5, rel=1e-5)


def test_data_without_shared_table_points_prices_shared_tables_as_one_feature():
    """fit_data on kernel rows as embshard-calibrate writes them: without points of a table several features look up
    (data of an older embshard-calibrate) the shared-table terms are the one-feature ones, as a profile without them reads;
    with such points they are fitted."""
    truth = replace(CPU, full_duplex=False, replicated_dp_lookup=True, **TRUE_TERMS)

    def rows(features: int) -> list[dict]:
        out = []
        for n, d, b, p in [(n, d, b, p) for n in (10_000, 200_000) for d in (16, 128) for b, p in ((64, 1.0), (512, 8.0), (2048, 30.0))]:
            point = KernelPoint("fbgemm", True, n, d, b, p, features)
            (perf,) = rank_perfs(point.plan().specs, replace(truth, world_size=1, local_world_size=1, batch_size_per_rank=b),
                                 point.plan().tables)
            out.append({"kind": "fbgemm", "pooled": True, "rows": n, "dim": d, "batch": b, "pooling": p, "features": features,
                        **{f"cpu_{ph}": getattr(perf, ph) for ph in PHASES}})
        return out

    older = fit_data({"device": "cpu", "kernels": [{k: v for k, v in r.items() if k != "features"} for r in rows(1)]}).theta
    assert older["lookup_bwd_ns_per_row"] == pytest.approx(400.0, rel=0.02)
    assert (older["lookup_bwd_shared_ns_per_row"], older["lookup_bwd_shared_ns_per_row_byte"]) == (older["lookup_bwd_ns_per_row"], 0.0)
    both = fit_data({"device": "cpu", "kernels": rows(1) + rows(4)}).theta
    assert (both["lookup_bwd_shared_ns_per_row"], both["lookup_bwd_shared_ns_per_row_byte"]) == pytest.approx((60.0, 0.3), rel=0.02)
