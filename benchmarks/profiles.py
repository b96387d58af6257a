"""The topology a benchmark prices its plans on: a shipped profile of embshard/configs/topology
(cpu_gloo_measured: `embshard-calibrate` on one machine, named in its header), or "none" for the datasheet terms."""

from __future__ import annotations

from pathlib import Path

import yaml

from embshard.cli import CONFIG_DIR
from embshard.machine import cpu_model
from embshard.topology import Topology


def profile_topology(profile: str, **shape) -> Topology:
    """The profile's terms on ``shape`` (world_size, local_world_size, batch_size_per_rank, hbm_gib, ...)."""
    if profile == "none":
        return Topology(**{"device": "cpu", **shape})
    raw = yaml.safe_load(_path(profile).read_text())
    return Topology.from_dict({**raw, **shape})


def profile_sentence(profile: str) -> str:
    """How a results file says which terms priced its plans."""
    if profile == "none":
        return "datasheet terms (`--profile none`)"
    header = _path(profile).read_text().splitlines()[0]
    prefix = "# Measured cost profile: "
    measured_on = header[len(prefix):].split(",")[0] if header.startswith(prefix) else "an unnamed machine"
    here = cpu_model()
    where = "this machine" if measured_on == here else f"not this machine ({here})"
    return f"the calibrated profile `embshard/configs/topology/{profile}.yaml` (`embshard-calibrate` on {measured_on}: {where})"


def _path(profile: str) -> Path:
    return Path(CONFIG_DIR) / "topology" / f"{profile}.yaml"
