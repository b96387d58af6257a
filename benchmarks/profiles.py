"""The topology a benchmark prices its plans on: a shipped profile of embshard/configs/topology
(cpu_gloo_measured: this machine's `embshard-calibrate`), or "none" for the datasheet terms."""

from __future__ import annotations

from pathlib import Path

import yaml

from embshard.cli import CONFIG_DIR
from embshard.topology import Topology


def profile_topology(profile: str, **shape) -> Topology:
    """The profile's terms on ``shape`` (world_size, local_world_size, batch_size_per_rank, hbm_gib, ...)."""
    if profile == "none":
        return Topology(**{"device": "cpu", **shape})
    raw = yaml.safe_load((Path(CONFIG_DIR) / "topology" / f"{profile}.yaml").read_text())
    return Topology.from_dict({**raw, **shape})


def profile_sentence(profile: str) -> str:
    """How a results file says which terms priced its plans."""
    if profile == "none":
        return "datasheet terms (`--profile none`)"
    return f"the calibrated profile `embshard/configs/topology/{profile}.yaml` (this machine's `embshard-calibrate`)"
