"""embshard-serve: serve a DLRM artifact over HTTP from N ranks, each holding its shards.

    embshard-serve artifact=outputs/export/ART launcher.nproc=2 server.port=8080
    embshard-serve checkpoint=outputs/train/RUN launcher.nproc=2       # export first, then serve
    torchrun --nproc-per-node 2 -m embshard.serving.serve_cli artifact=ART

The first process checks the config, exports a checkpoint if given one (into out_dir/artifact),
then runs as the only rank or starts ``launcher.nproc`` local ranks (under torchrun it is
one rank itself). Every rank loads its shards with `Predictor.load`; rank 0 hosts the HTTP
server (embshard/serving/server.py) and sends each batch to the others (workers.py). SIGTERM
or Ctrl-C stops all ranks. Bad input ends with exit status 2 and one line,
``embshard-serve: error: ...``.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import hydra
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from embshard.cli import CONFIG_DIR, fail, fail_config, run_hydra_app
from embshard.serving.config import PROG, ServeSettings, num_ranks, register, settings_from_config
from embshard.cli import under_torchrun
from embshard.launch.launcher import launch
from embshard.launch.child import child_args, user_env

register()


def export_checkpoint(settings: ServeSettings) -> ServeSettings:
    """Export ``settings.checkpoint`` for ``launcher.nproc`` ranks; the settings with that artifact to serve."""
    if under_torchrun():
        fail_config(PROG, "checkpoint: under torchrun, export first (embshard-export checkpoint=DIR out=ART world_size=N) and "
             "start the ranks with artifact=ART")
    from embshard.serving.export import ExportSettings, export  # torch: only when exporting

    options = settings.export
    out = Path(options.out) if options.out else settings.checkpoint / "serving_artifact"
    try:
        artifact = export(ExportSettings(checkpoint=settings.checkpoint, out=out, world_size=settings.launcher.nproc,
                                         dtype=options.dtype, table_dtypes=options.table_dtypes, split=options.split,
                                         overwrite=not options.out))
    except ValueError as e:
        fail(PROG, f"checkpoint={settings.checkpoint}: {e}")
    print(f"{PROG}: exported {settings.checkpoint} to {artifact} ({num_ranks(settings.launcher.nproc)})", flush=True)
    return replace(settings, artifact=artifact, checkpoint=None)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="serve")
def hydra_main(cfg: DictConfig) -> None:
    try:
        settings = settings_from_config(cfg)
    except (ValueError, OmegaConfBaseException) as e:  # every process finds it: printed once
        fail_config(PROG, str(e))
    args = child_args()
    if settings.checkpoint is not None:
        settings = export_checkpoint(settings)
        args = [a for a in args if not a.startswith(("checkpoint=", "export."))] + [f"artifact={settings.artifact}"]
    if not under_torchrun() and settings.launcher.nproc > 1:
        code = launch(settings.launcher, args, user_env(), module="embshard.serving.serve_cli", prog=PROG)
        if code:
            sys.exit(code)
        return
    from embshard.serving.rank import run_rank  # torch and friends: only in the processes that serve

    try:
        run_rank(settings)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a rank is done: skip the interpreter's teardown of torch (seconds on a busy machine)


def main() -> None:
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)  # a torchrec import-time notice
    run_hydra_app(PROG, hydra_main)


if __name__ == "__main__":
    main()
