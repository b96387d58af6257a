"""Measure a machine and fit the planner's cost terms: the body of `embshard-calibrate`.

    from embshard.calibrate.calibrate import measure_all, fit_data, profile_yaml
    data = measure_all(cfg, "cpu")    # kernels, collectives and plans on local ranks
    result = fit_data(data)           # embshard.calibrate.fit.Fit
    text = profile_yaml(profile_topology(base, data, result), data, result, command)

Three sources of measurements, each the time of a rank (CPU time on cpu, synchronized wall
time on cuda; see embshard.calibrate.device): kernel microbenchmarks
(embshard.calibrate.kernels), collectives (gloo on cpu, nccl on cuda;
embshard.calibrate.collectives) and random layouts of generated workloads run on 2 and 4
ranks (the runtime's own routing and assembly work), and random row-wise layouts on 4 ranks as 2 hosts
x 2, each with and without the in-host reduction (its own CPU work), and random data-parallel layouts there, each
all-reduced hierarchically and with one ring (the hierarchy's own CPU work). embshard.calibrate.fit fits every term
of the planner's cost model on the data it explains. On cuda, world sizes above the number
of GPUs are skipped (nccl runs one rank per GPU); with no collective measured (one GPU), the
profile keeps the device's datasheet communication bandwidth and says so.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from embshard.calibrate import collectives, kernels
from embshard.calibrate.device import BACKENDS, DEVICES, local_ranks_available
from embshard.calibrate.fit import BANDWIDTHS, TERMS, Fit, Sample, dp_allreduce_bytes, fit
from embshard.calibrate.measure import PHASES, measure_plans
from embshard.machine import cpu_model
from embshard.planner.plan import ShardingPlan
from embshard.topology import CALIBRATED_TERMS, DEVICE_DEFAULTS, PHASE_FACTORS, SHARED_TABLE_TERMS, Topology

HOST_REDUCE_RANKS = 4  # the in-host reduction's layouts: 2 hosts x 2 ranks
GROUP_KEYS = {
    "topology": {"world_size": int, "local_world_size": int, "hbm_gib": float, "batch_size_per_rank": int, "reserved_fraction": float},
    "kernels": {"dims": list, "rows": list, "batches": list, "poolings": list, "sequence": bool, "dp_max_rows": int,
                "max_table_elements": int, "shared_features": int, "allreduce_ranks": int, "steps": int, "warmup": int},
    "collectives": {"world_sizes": list, "sizes_bytes": list, "reps": int, "warmup": int},
    "plans": {"world_sizes": list, "num_plans": int, "num_tables": int, "seed": int, "max_rows": int, "max_pooling": float,
              "sequence_fraction": float, "steps": int, "warmup": int, "host_reduce_plans": int,
              "dp_hier_plans": int},
}
NON_NEGATIVE = ("warmup", "seed", "host_reduce_plans", "dp_hier_plans", "shared_features")  # integer keys that may be 0
TOP_KEYS = ("profile", "device", "out_dir", "data_out", "from_data", "timeout_s", *GROUP_KEYS)


def validate(cfg: Mapping[str, Any]) -> None:
    """ValueError naming the key and what it takes, for anything embshard-calibrate cannot use."""
    unknown = sorted(set(cfg) - set(TOP_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; allowed keys are {list(TOP_KEYS)}")
    profile = cfg.get("profile")
    if not isinstance(profile, str) or not profile or not profile.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"profile: must be a name of letters, digits, '_' and '-' (the file out_dir/<profile>.yaml), got {profile!r}")
    if profile in ("cpu", "gpu"):
        raise ValueError(f"profile: {profile!r} is a shipped datasheet topology; choose another name, e.g. {profile}_measured")
    if cfg.get("device") not in DEVICES:
        raise ValueError(f"device: must be one of {list(DEVICES)} (auto: cuda where torch sees a GPU), got {cfg.get('device')!r}")
    timeout = cfg.get("timeout_s")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout_s: must be a positive number of seconds, got {timeout!r}")
    for group, keys in GROUP_KEYS.items():
        raw = cfg.get(group)
        if not isinstance(raw, Mapping):
            raise ValueError(f"{group}: expected a mapping with keys {list(keys)}")
        bad = sorted(set(raw) - set(keys))
        if bad:
            raise ValueError(f"{group}: unknown key(s) {bad}; allowed keys are {list(keys)}")
        for key, kind in keys.items():
            if key not in raw:
                raise ValueError(f"{group}.{key}: missing")
            v, where = raw[key], f"{group}.{key}"
            if kind is bool:
                if not isinstance(v, bool):
                    raise ValueError(f"{where}: must be true or false, got {v!r}")
            elif kind is list:
                if not isinstance(v, list) or not v or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0 for x in v):
                    raise ValueError(f"{where}: must be a non-empty list of positive numbers, got {v!r}")
            elif kind is int:
                if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key in NON_NEGATIVE else 1):
                    raise ValueError(f"{where}: must be a {'non-negative' if key in NON_NEGATIVE else 'positive'} integer, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{where}: must be a number >= 0, got {v!r}")
    for group in ("collectives", "plans"):
        sizes = cfg[group]["world_sizes"]
        if any(not isinstance(w, int) or w < 2 for w in sizes):
            raise ValueError(f"{group}.world_sizes: ranks per run must be whole numbers >= 2, got {sizes}")
    if cfg["plans"]["sequence_fraction"] > 1:
        raise ValueError(f"plans.sequence_fraction: must be in [0, 1], got {cfg['plans']['sequence_fraction']!r}")
    base_topology(cfg, "cpu")  # the profile's shape must be a valid topology


def base_topology(cfg: Mapping[str, Any], device: str) -> Topology:
    return Topology.from_dict({**cfg["topology"], "device": device}, "topology")


def calibration_plans(pcfg: Mapping[str, Any], world_size: int, batch_size: int, device: str = "cpu") -> list[ShardingPlan]:
    """Random runnable layouts of generated workloads (seeds from pcfg['seed'])."""
    from embshard.calibrate.synthetic import bench_tables, random_plan  # imports torch

    # data-parallel tables in the cheaper mode per table; replicated look-ups where a placement records none
    topo = Topology(world_size=world_size, local_world_size=world_size, hbm_gib=16, batch_size_per_rank=batch_size,
                    device=device, replicated_dp_lookup=True)
    out = []
    for i in range(pcfg["num_plans"]):
        seed = pcfg["seed"] + 100 * world_size + i
        specs = bench_tables(pcfg["num_tables"], seed, pcfg["max_rows"], pcfg["max_pooling"], pcfg["sequence_fraction"])
        out.append(random_plan(specs, topo, seed))
    return out


def machine(device: str = "cpu") -> dict[str, Any]:
    """CPU model, cores, (on cuda) the GPU's name and count, load and date of the measurement."""
    out = {"cpu": cpu_model(), "cores": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()],
           "date": datetime.datetime.now().isoformat(timespec="seconds")}
    if device == "cuda":
        import torch

        out.update(gpu=torch.cuda.get_device_name(0), num_gpus=torch.cuda.device_count())
    return out


def runnable_world_sizes(sizes: Sequence[int], device: str, what: str, log) -> list[int]:
    """The world sizes this machine can run (on cuda: one GPU per rank); logs the others."""
    ok = [w for w in sizes if local_ranks_available(device, w)]
    if len(ok) < len(sizes):
        log(f"{what}: skipping world sizes {[w for w in sizes if w not in ok]}: nccl runs one rank per GPU and this machine has fewer")
    return ok


def comm_note(data: Mapping[str, Any]) -> str | None:
    """Why communication keeps the datasheet terms (None when collectives were measured)."""
    if data.get("collectives"):
        return None
    device = data.get("device", "cpu")
    return (f"communication not measured (no collectives ran: one {device} rank): intra_host_gb_per_s keeps the {device} datasheet "
            f"{DEVICE_DEFAULTS[device]['intra_host_gb_per_s']:g} GB/s and collective_ms 0")


def measure_all(cfg: Mapping[str, Any], device: str, log=print) -> dict[str, Any]:
    """Run every enabled measurement on ``device`` (cpu: gloo ranks; cuda: nccl ranks, one GPU each);
    returns the data file's content."""
    kc, cc, pc = cfg["kernels"], cfg["collectives"], cfg["plans"]
    data: dict[str, Any] = {"device": device, "machine_start": machine(device),
                            "config": {k: cfg[k] for k in ("topology", "kernels", "collectives", "plans")}}
    t0 = time.perf_counter()
    ar_ranks = (runnable_world_sizes([kc["allreduce_ranks"]], device, "allreduce-mode kernel points", log) or [1])[0]
    points = kernels.grid(kc["dims"], kc["rows"], kc["batches"], kc["poolings"], kc["sequence"], kc["dp_max_rows"], kc["max_table_elements"],
                         kc["shared_features"], ar_ranks)
    log(f"kernels: {len(points)} points on 1 {device} rank ({BACKENDS[device]}), the allreduce mode's on {ar_ranks}")
    data["kernels"] = kernels.run(points, kc["steps"], kc["warmup"], cfg["timeout_s"], device)
    sizes = runnable_world_sizes(cc["world_sizes"], device, "collectives", log)
    log(f"collectives: {len(cc['sizes_bytes'])} sizes on {sizes} ranks")
    data["collectives"] = collectives.run(sizes, cc["sizes_bytes"], cc["reps"], cc["warmup"], cfg["timeout_s"], device)
    data["plans"] = []
    for W in runnable_world_sizes(pc["world_sizes"], device, "plans", log):
        plans = calibration_plans(pc, W, cfg["topology"]["batch_size_per_rank"], device)
        log(f"plans: {len(plans)} random layouts on {W} ranks")
        for p, m in zip(plans, measure_plans(plans, steps=pc["steps"], warmup=pc["warmup"], timeout_s=cfg["timeout_s"], device=device)):
            data["plans"].append({"plan": p.to_dict(), "cpu_ms": [r.cpu_ms for r in m.ranks], "wall_ms": [r.wall_ms for r in m.ranks],
                                  "step_wall_ms": m.step_wall_ms})
    data["host_reduce"] = measure_host_reduce(pc, cfg["topology"]["batch_size_per_rank"], device, cfg["timeout_s"], log)
    data["dp_hier"] = measure_dp_hier(pc, cfg["topology"]["batch_size_per_rank"], device, cfg["timeout_s"], log)
    data["machine_end"] = machine(device)
    data["measure_s"] = time.perf_counter() - t0
    return data


def _two_hosts(batch_size: int, device: str, **kwargs) -> Topology:
    """The topology of the pairs' layouts: HOST_REDUCE_RANKS ranks as 2 hosts (run on local ranks)."""
    return Topology(world_size=HOST_REDUCE_RANKS, local_world_size=HOST_REDUCE_RANKS // 2, hbm_gib=16,
                    batch_size_per_rank=batch_size, device=device, **kwargs)


def host_reduce_plans(pcfg: Mapping[str, Any], batch_size: int, device: str = "cpu") -> list[ShardingPlan]:
    """Random layouts where the in-host reduction has work (synthetic.host_reduce_plan), on 4 ranks as 2 hosts x 2."""
    from embshard.calibrate.synthetic import bench_tables, host_reduce_plan  # imports torch

    topo = _two_hosts(batch_size, device, replicated_dp_lookup=True)
    seeds = [pcfg["seed"] + 7_000 + i for i in range(pcfg["host_reduce_plans"])]
    return [host_reduce_plan(bench_tables(pcfg["num_tables"], s, pcfg["max_rows"], pcfg["max_pooling"]), topo, s) for s in seeds]


def measure_host_reduce(pcfg: Mapping[str, Any], batch_size: int, device: str, timeout_s: float, log) -> list[dict[str, Any]]:
    """Each host_reduce_plans layout run on local ranks with the in-host reduction and with reduce_in_host off: what the
    reduction's own CPU work costs (on one host the 'other host' is local ranks; fit.host_reduce_fit)."""
    return _measure_pairs(pcfg["host_reduce_plans"], lambda: host_reduce_plans(pcfg, batch_size, device), "in-host reduction",
                          "random layouts on {ranks} ranks as 2 hosts, with and without it", pcfg, device, timeout_s, log)


def dp_hier_plans(pcfg: Mapping[str, Any], batch_size: int, device: str = "cpu") -> list[ShardingPlan]:
    """Random data-parallel layouts (synthetic.dp_hier_plan) on 4 ranks as 2 hosts x 2, all-reduced hierarchically:
    the runtime asks the plan's topology (datasheet terms), which prices the hierarchy below the ring."""
    from embshard.calibrate.synthetic import bench_tables, dp_hier_plan  # imports torch
    from embshard.planner.cost.allreduce import hierarchical_allreduce

    topo = _two_hosts(batch_size, device)
    seeds = [pcfg["seed"] + 8_000 + i for i in range(pcfg["dp_hier_plans"])]
    plans = [dp_hier_plan(bench_tables(pcfg["num_tables"], s, pcfg["max_rows"], pcfg["max_pooling"]), topo, s) for s in seeds]
    assert all(hierarchical_allreduce(sum(dp_allreduce_bytes(p)), p.topology) for p in plans)
    return plans


def measure_dp_hier(pcfg: Mapping[str, Any], batch_size: int, device: str, timeout_s: float, log) -> list[dict[str, Any]]:
    """Each dp_hier_plans layout run on local ranks all-reduced hierarchically and with reduce_in_host off (one ring):
    what the hierarchy's own CPU work costs (fit.dp_hier_fit)."""
    return _measure_pairs(pcfg["dp_hier_plans"], lambda: dp_hier_plans(pcfg, batch_size, device), "hierarchical all-reduce",
                          "data-parallel layouts on {ranks} ranks as 2 hosts, hierarchical and ring", pcfg, device, timeout_s, log)


def _measure_pairs(count: int, make_plans, what: str, description: str, pcfg: Mapping[str, Any], device: str,
                   timeout_s: float, log) -> list[dict[str, Any]]:
    """count layouts from make_plans(), each measured as is and flat (`_with_and_without`); [] where none is
    asked for or HOST_REDUCE_RANKS local ranks cannot run."""
    if not count or not runnable_world_sizes([HOST_REDUCE_RANKS], device, what, log):
        return []
    on = make_plans()
    log(f"{what}: {len(on)} " + description.format(ranks=HOST_REDUCE_RANKS))
    return _with_and_without(on, pcfg, timeout_s, device)


def _with_and_without(on: Sequence[ShardingPlan], pcfg: Mapping[str, Any], timeout_s: float, device: str) -> list[dict[str, Any]]:
    """Each plan measured as is and with flat collectives: data-file entries."""
    measured = measure_plans([*on, *map(flat, on)], steps=pcfg["steps"], warmup=pcfg["warmup"], timeout_s=timeout_s, device=device)
    return [{"plan": p.to_dict(), "cpu_ms": [r.cpu_ms for r in m_on.ranks], "cpu_ms_flat": [r.cpu_ms for r in m_off.ranks]}
            for p, m_on, m_off in zip(on, measured[:len(on)], measured[len(on):])]


def flat(p: ShardingPlan) -> ShardingPlan:
    """The plan with flat collectives (``topology.reduce_in_host`` off)."""
    return replace(p, topology=replace(p.topology, reduce_in_host=False))


def host_reduce_pairs(data: Mapping[str, Any], key: str = "host_reduce") -> list[tuple[Sample, Sample]]:
    """(with, without the in-host reduction / hierarchy) samples of each measured ``key`` layout ("host_reduce", "dp_hier")."""
    out = []
    for entry in data.get(key, []):
        p = ShardingPlan.from_dict(entry["plan"])
        out.append((Sample(p, tuple(entry["cpu_ms"]), key), Sample(flat(p), tuple(entry["cpu_ms_flat"]), key)))
    return out


def samples_of(data: Mapping[str, Any]) -> list[Sample]:
    out = []
    for r in data.get("kernels", []):
        point = kernels.KernelPoint(r["kind"], r["pooled"], r["rows"], r["dim"], r["batch"], r["pooling"], r.get("features", 1),
                                    r.get("ranks", 1))
        out.append(Sample(point.plan(), ({p: r[f"cpu_{p}"] for p in PHASES},), "kernels"))
    for entry in data.get("plans", []):
        out.append(Sample(ShardingPlan.from_dict(entry["plan"]), tuple(entry["cpu_ms"]), "plans"))
    return out


def fit_data(data: Mapping[str, Any]) -> Fit:
    """Fit every term; without measured collectives, communication keeps the device's datasheet
    bandwidth and no per-collective latency (comm_note); without allreduce-mode kernel points (data
    measured by an older embshard-calibrate), dp_dense_gb_per_s keeps the device's default; without shared-table kernel points
    (likewise), a table several features look up is priced as one of one feature (SHARED_TABLE_TERMS as `Topology.from_dict`
    reads a profile without them). Where collectives crossed hosts, the host's
    terms are fitted first without them (as a one-host calibration would), then held while the
    inter-host bandwidth and latency are fitted on the rows between hosts: the two apart."""
    result = _fit_terms(data)
    if any(r.get("features", 1) > 1 for r in data.get("kernels", [])):
        return result
    per_row, per_byte = SHARED_TABLE_TERMS
    return replace(result, theta={**result.theta, per_row: result.theta["lookup_bwd_ns_per_row"], per_byte: 0.0})


def _fit_terms(data: Mapping[str, Any]) -> Fit:
    """fit_data's fit, before the shared-table terms of older data are filled in."""
    device = data.get("device", "cpu")
    collectives = data.get("collectives", [])
    fixed = {} if collectives else {
        "intra_host_gb_per_s": 1.0 / (DEVICE_DEFAULTS[device]["intra_host_gb_per_s"] * 1e6), "collective_ms": 0.0}
    one_host = {"inter_host_gb_per_s": 1.0 / (DEVICE_DEFAULTS[device]["inter_host_gb_per_s"] * 1e6), "inter_host_collective_ms": 0.0}
    if not any(r["kind"] == "allreduce" for r in data.get("kernels", [])):  # measured before the allreduce points
        fixed["dp_dense_gb_per_s"] = 1.0 / (DEVICE_DEFAULTS[device]["dp_dense_gb_per_s"] * 1e6)
    samples, pairs, hier = samples_of(data), host_reduce_pairs(data), host_reduce_pairs(data, "dp_hier")
    if not crossed_hosts(data):
        return fit(samples, collectives, {**fixed, **one_host}, pairs, hier)
    in_host = [r for r in collectives if r.get("local_world_size", r["world_size"]) >= r["world_size"]]
    host = fit(samples, in_host, {**fixed, **one_host}, pairs, hier).theta
    return fit(samples, collectives, {t: v for t, v in host.items() if t not in one_host})


def crossed_hosts(data: Mapping[str, Any]) -> int:
    """How many hosts the measured collectives spanned (0: none crossed a host; embshard.calibrate.hosts)."""
    return max((r["world_size"] for r in data.get("collectives", []) if r.get("local_world_size", r["world_size"]) < r["world_size"]),
               default=0)


def profile_topology(base: Topology, data: Mapping[str, Any], result: Fit) -> Topology:
    """The fitted topology on ``base``'s shape; without measured collectives, the base's duplex model too."""
    topology = result.topology(base)
    return topology if data.get("collectives") else replace(topology, full_duplex=base.full_duplex)


def profile_yaml(topology: Topology, data: Mapping[str, Any], result: Fit, command: str) -> str:
    """The profile file: the topology with its fitted terms, and how it was measured."""
    m0, m1 = data.get("machine_start", {}), data.get("machine_end", {})
    if data.get("device", "cpu") == "cuda":
        where = [f"# Measured cost profile: {m0.get('gpu', '?')} ({m0.get('num_gpus', '?')} GPU(s) on the host; nccl, one rank per GPU), "
                 f"host {m0.get('cpu', '?')}, {m0.get('cores', '?')} cores.",
                 "# Times are wall-clock time per rank, read after torch.cuda.synchronize() (CPU time would count only kernel launches)."]
    else:
        where = [f"# Measured cost profile: {m0.get('cpu', '?')}, {m0.get('cores', '?')} cores, no GPU; gloo on CPU, one torch thread per rank.",
                 "# Times are CPU time per rank (its process's user + system time, gloo's threads included):",
                 "# a rank's work on a core of its own. Sends and receives both cost CPU: full_duplex is false."]
    note = comm_note(data)
    lines = [
        where[0],
        f"# Written by `{command}` on {m1.get('date', m0.get('date', '?'))}",
        f"# (load average {m0.get('load_avg')} at start, {m1.get('load_avg')} at end; measuring took {data.get('measure_s', 0):.0f} s).",
        *where[1:],
        *([f"# {note}."] if note else []),
        *([] if data.get("plans") else ["# per-phase factors are 1: no multi-rank plan was measured."]),
        "# Fit (relative error of per-rank step time): "
        + "; ".join(f"{src} median {e['median']:.1%}, p90 {e['p90']:.1%} (n={e['n']})" for src, e in sorted(result.errors.items())) + ".",
        f"# host_reduce_* (the in-host reduction's CPU work) fitted on {len(data['host_reduce'])} layouts on {HOST_REDUCE_RANKS} local ranks "
        "as 2 hosts, each run with and without it." if data.get("host_reduce") else
        "# host_reduce_* are 0: no layout was measured with and without the in-host reduction (plans.host_reduce_plans).",
        f"# dp_hier_* (the hierarchical all-reduce's CPU work) fitted on {len(data['dp_hier'])} data-parallel layouts on {HOST_REDUCE_RANKS} "
        "local ranks as 2 hosts, each all-reduced hierarchically and with one ring." if data.get("dp_hier") else
        "# dp_hier_* are 0: no layout was all-reduced hierarchically and with one ring (plans.dp_hier_plans).",
        f"# inter_host_gb_per_s and inter_host_collective_ms fitted on {crossed_hosts(data)} hosts (wall time of collectives between "
        "them; inter-host latency per peer = collective_ms + inter_host_collective_ms)." if crossed_hosts(data) else
        f"# inter_host_gb_per_s is not measured on one host (the {data.get('device', 'cpu')} default; run under torchrun on "
        "several hosts to fit it). See embshard/planner/cost/perf.py.",
    ]
    values = asdict(topology)  # every field (to_dict leaves out unused ones)
    for key in ("world_size", "local_world_size", "hbm_gib", "batch_size_per_rank", "device", "reserved_fraction"):
        lines.append(f"{key}: {values[key]}")
    for key in BANDWIDTHS:
        lines.append(f"{key}: {_num(values[key])}")
    lines.append(f"full_duplex: {'true' if values['full_duplex'] else 'false'}")
    lines.append("replicated_dp_lookup: true")
    for key in CALIBRATED_TERMS:
        lines.append(f"{key}: {_num(values[key])}")
    lines.append("# per-phase factors: whole steps on 2 and 4 ranks relative to the microbenchmarks")
    for key in PHASE_FACTORS:
        lines.append(f"{key}: {_num(values[key])}")
    assert set(TERMS) <= set(values)
    return "\n".join(lines) + "\n"


def _num(x: float) -> str:
    """6 significant digits that YAML reads back as a float (1e+06 would be a string)."""
    return yaml.safe_dump(float(f"{x:.6g}")).splitlines()[0]


def write_profile(text: str, cfg: Mapping[str, Any]) -> Path:
    """Write ``out_dir/<profile>.yaml``; out_dir is a topology group folder (DIR/topology for ``--config-dir DIR``)."""
    if not isinstance(cfg.get("out_dir"), str) or not cfg["out_dir"]:
        raise ValueError(f"out_dir: must be a folder, got {cfg.get('out_dir')!r}; e.g. out_dir=my_configs/topology")
    out_dir = Path(cfg["out_dir"])
    path = out_dir / f"{cfg['profile']}.yaml"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise ValueError(f"out_dir={out_dir}: cannot write the profile ({e.strerror or e}); choose a writable folder") from None
    return path


def write_data(data: Mapping[str, Any], path: str | Path) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    except OSError as e:
        raise ValueError(f"data_out={path}: cannot write the measurements ({e.strerror or e})") from None


def read_data(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"from_data={path}: cannot read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"from_data={path}: not a JSON measurement file ({e})") from None
    if not isinstance(data, dict) or not ({"kernels", "collectives", "plans"} & set(data)):
        raise ValueError(f"from_data={path}: not an embshard-calibrate measurement file (no kernels/collectives/plans)")
    return data
