"""embshard-calibrate: measure this machine and write a topology profile for the planner.

    embshard-calibrate profile=mine                               # ~10 min on 2 cores: outputs/calibrate/topology/mine.yaml
    embshard-plan --config-dir outputs/calibrate topology=mine tables=dlrm_150   # plan with measured costs
    embshard-calibrate profile=mine from_data=outputs/calibrate/mine.json   # refit only
    embshard-calibrate profile=h200 device=cuda topology.world_size=8 topology.local_world_size=8 topology.hbm_gib=139
    torchrun --nnodes 2 --nproc-per-node 1 --node-rank H ... -m embshard.calibrate.cli profile=two_hosts  # + inter-host terms

A Hydra app over embshard/configs/calibrate.yaml. Measures FBGEMM lookups forward and backward over
dims, pooling factors, rows and batch sizes; all-to-all and all-reduce over message and
world sizes; and random layouts of generated workloads on 2 and 4 local ranks (device=cpu:
gloo ranks; device=cuda: nccl ranks, one GPU each, world sizes above the GPU count skipped;
device=auto: cuda where torch sees a GPU); under torchrun on several hosts also the
collectives between hosts (embshard.calibrate.hosts: inter-host bandwidth and latency); fits the
planner's per-phase cost terms (embshard.calibrate.fit) and writes
out_dir/<profile>.yaml (a topology group folder, default outputs/calibrate/topology: the
installed package's own configs are not written) and the raw measurements (data_out). Bad input ends with
exit status 2 and one line on stderr, ``embshard-calibrate: error: ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from embshard.calibrate.calibrate import (base_topology, comm_note, fit_data, measure_all, profile_topology, profile_yaml, read_data,
                                          validate, write_data, write_profile)
from embshard.calibrate.device import BACKENDS, resolve_device
from embshard.calibrate.hosts import measure_across_hosts
from embshard.cli import CONFIG_DIR, fail, run_hydra_app, under_torchrun

PROG = "embshard-calibrate"


def run(cfg: dict) -> Path | None:
    validate(cfg)
    command = " ".join([PROG, *sys.argv[1:]])
    if cfg.get("from_data"):
        data = read_data(cfg["from_data"])
        print(f"refitting {cfg['from_data']} (measured on {data.get('device', 'cpu')}; the device option is not used)", flush=True)
    else:
        device = resolve_device(cfg["device"])
        across = measure_across_hosts(cfg, device, log=lambda m: print(m, flush=True)) if under_torchrun() else []
        if across is None:  # a torchrun rank other than 0: its part is done
            return None
        print(f"measuring on {device} ({BACKENDS[device]})", flush=True)
        data = measure_all(cfg, device, log=lambda m: print(m, flush=True))
        data["collectives"].extend(across)
        write_data(data, cfg["data_out"])
        print(f"wrote measurements to {cfg['data_out']}", flush=True)
    result = fit_data(data)
    topology = profile_topology(base_topology(cfg, data.get("device", "cpu")), data, result)
    path = write_profile(profile_yaml(topology, data, result, command), cfg)
    for src, e in sorted(result.errors.items()):
        print(f"fit {src}: median error {e['median']:.1%}, p90 {e['p90']:.1%} over {e['n']}", flush=True)
    if comm_note(data):
        print(comm_note(data), flush=True)
    use = f"--config-dir {path.parent.parent} topology" if path.parent.name == "topology" else \
        "(move it into DIR/topology/) --config-dir DIR topology"
    print(f"wrote {path}; plan with: embshard-plan {use}={cfg['profile']}", flush=True)
    return path


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="calibrate")
def hydra_main(cfg: DictConfig) -> None:
    try:
        run(OmegaConf.to_container(cfg, resolve=True))
    except (ValueError, OmegaConfBaseException) as e:
        fail(PROG, str(e))
    except RuntimeError as e:  # a spawned rank failed: say which and why, on one line
        fail(PROG, f"measurement failed: {e}")


def main() -> None:
    run_hydra_app(PROG, hydra_main)


if __name__ == "__main__":
    main()
