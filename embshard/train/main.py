"""embshard-train: train DLRM on tables placed by the planner, from one Hydra command.

    embshard-train launcher.nproc=2                      # 2 local CPU ranks, synthetic data
    embshard-train model=dcnv2 optim.dense.learning_rate=0.02 steps=500
    embshard-train --multirun optim.sparse.learning_rate=0.02,0.05
    torchrun --nproc-per-node 8 -m embshard.train topology=train_gpu data=criteo_npy data.dir=...

The first process composes and checks the config, then either runs as the only rank,
starts ``launcher.nproc`` local ranks, or (under torchrun) is one rank itself. Outputs go
to ``out_dir``: config.yaml, plan.json/png, metrics.jsonl, curves.png, checkpoints/.
Bad input ends with exit status 2 and one line, ``embshard-train: error: ...``; a rank
that loses the group (a peer died) exits with status 1 and says so.
"""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from embshard import cli
from embshard.tables_option import with_tables_file
from embshard.train import config
from embshard.cli import under_torchrun
from embshard.launch.child import child_args, user_env
from embshard.launch.launcher import check_ranks, launch, torchrun_ranks

PROG = "embshard-train"
config.register()


def fail(message: str, code: int = cli.EXIT_BAD_INPUT) -> NoReturn:
    """Exit with the message on one stderr line (Hydra's and torch's messages span several)."""
    cli.fail(PROG, message, code)


@hydra.main(version_base="1.3", config_path=cli.CONFIG_DIR, config_name="train")
def hydra_main(cfg: DictConfig) -> None:
    try:
        settings = config.settings_from_config(cfg)
        settings.out_dir.mkdir(parents=True, exist_ok=True)
    except (ValueError, OmegaConfBaseException) as e:  # every process finds it: printed once
        cli.fail_config(PROG, str(e))
    except OSError as e:
        cli.fail_config(PROG, f"out_dir={settings.out_dir}: cannot create it ({e.strerror}); choose a writable folder")
    if not under_torchrun() and settings.launcher.nproc > 1:
        try:
            check_ranks(settings.topology, settings.launcher.nproc, settings.launcher.nproc)
        except ValueError as e:
            fail(str(e))
        code = launch(settings.launcher, child_args(), user_env())
        if code:
            sys.exit(code)
        return
    if under_torchrun():  # every rank finds a topology that disagrees with the ranks torchrun started: printed once per host
        try:
            check_ranks(settings.topology, *torchrun_ranks())
        except ValueError as e:
            cli.fail_config(PROG, str(e))
    from embshard.train.run import run_rank  # torch and friends: only in the processes that train

    run_rank(settings, OmegaConf.to_yaml(cfg, resolve=True), fail)


def main() -> None:
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)  # a torchrec import-time notice
    try:
        sys.argv = with_tables_file(sys.argv)
    except ValueError as e:
        fail(str(e))
    cli.run_hydra_app(PROG, hydra_main)


if __name__ == "__main__":
    main()
