"""Cluster topology: ranks, hosts, memory per rank and bandwidths (with units).

Bandwidths are in GB/s (10^9 bytes per second), named ``*_gb_per_s``. Defaults describe an
8-GPU H100/H200-class host: effective HBM bandwidth for random row gathers, NVLink between
ranks of a host, and one 400 Gb/s NIC per rank across hosts. ``device: cpu`` defaults
describe gloo over loopback/TCP on host memory.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

GIB = 1024**3

# Defaults by device. Effective numbers, not datasheet peaks: a row gather reaches well
# under peak HBM bandwidth, and all-to-all reaches well under NVLink/IB line rate.
DEVICE_DEFAULTS: dict[str, dict[str, float]] = {
    "cuda": {"hbm_gb_per_s": 1500.0, "intra_host_gb_per_s": 150.0, "inter_host_gb_per_s": 25.0},
    "cpu": {"hbm_gb_per_s": 10.0, "intra_host_gb_per_s": 2.0, "inter_host_gb_per_s": 1.0},
}


@dataclass(frozen=True)
class Topology:
    """What the planner needs to know about the cluster.

    world_size: number of ranks; local_world_size: ranks per host (world_size must be a
    multiple). hbm_gib: memory per rank in GiB (host memory for device=cpu).
    reserved_fraction: share of each rank's memory kept for dense parameters, their
    optimizer state and activations; embedding shards may use the rest.
    batch_size_per_rank: training samples per rank per step.
    Bandwidths left at 0 take the device's defaults (see DEVICE_DEFAULTS).
    """

    world_size: int
    local_world_size: int = 8
    hbm_gib: float = 80.0
    batch_size_per_rank: int = 512
    device: str = "cuda"
    reserved_fraction: float = 0.1
    hbm_gb_per_s: float = 0.0
    intra_host_gb_per_s: float = 0.0
    inter_host_gb_per_s: float = 0.0

    def __post_init__(self) -> None:
        for key in ("hbm_gib", "reserved_fraction", "hbm_gb_per_s", "intra_host_gb_per_s", "inter_host_gb_per_s"):
            object.__setattr__(self, key, float(getattr(self, key)))
        for key, value in DEVICE_DEFAULTS.get(self.device, {}).items():
            if getattr(self, key) == 0.0:
                object.__setattr__(self, key, value)

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    def host_of(self, rank: int) -> int:
        return rank // self.local_world_size

    def host_ranks(self, host: int) -> range:
        return range(host * self.local_world_size, (host + 1) * self.local_world_size)

    @property
    def rank_memory_bytes(self) -> int:
        return int(self.hbm_gib * GIB)

    @property
    def reserved_bytes(self) -> int:
        return int(self.rank_memory_bytes * self.reserved_fraction)

    @property
    def shard_memory_cap_bytes(self) -> int:
        """Bytes per rank available to embedding shards and their buffers."""
        return self.rank_memory_bytes - self.reserved_bytes

    @property
    def global_batch_size(self) -> int:
        return self.batch_size_per_rank * self.world_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "topology") -> "Topology":
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed keys are {sorted(known)}")
        if "world_size" not in raw:
            raise ValueError(f"{where}.world_size: missing; set the number of ranks, e.g. topology.world_size=8")
        ints = ("world_size", "local_world_size", "batch_size_per_rank")
        for key in ints:
            if key in raw:
                v = raw[key]
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise ValueError(f"{where}.{key}: must be a positive integer, got {v!r}")
        for key in ("hbm_gib", "hbm_gb_per_s", "intra_host_gb_per_s", "inter_host_gb_per_s"):
            if key in raw:
                v = raw[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (key == "hbm_gib" and v == 0):
                    raise ValueError(f"{where}.{key}: must be a positive number, got {v!r}")
        frac = raw.get("reserved_fraction", 0.1)
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac < 1:
            raise ValueError(f"{where}.reserved_fraction: must be in [0, 1), got {frac!r}")
        device = raw.get("device", "cuda")
        if device not in DEVICE_DEFAULTS:
            raise ValueError(f"{where}.device: must be one of {sorted(DEVICE_DEFAULTS)}, got {device!r}")
        world, local = raw["world_size"], raw.get("local_world_size", min(8, raw["world_size"]))
        if world % local:
            raise ValueError(
                f"{where}.world_size: {world} is not a multiple of local_world_size {local}; "
                f"use a whole number of hosts, e.g. world_size={max(local, world - world % local)}"
            )
        return cls(**{**raw, "local_world_size": local})
