"""One rank of a training run: join the group, train, turn failures into one readable line (one per job)."""

from __future__ import annotations

import warnings
from typing import Callable

import torch.distributed as dist
from rich.console import Console

from embshard.launch import distributed, report
from embshard.train.config import TrainSettings
from embshard.train.checkpoint import CheckpointError
from embshard.launch.distributed import LOST_GROUP, SharedError, lost_group
from embshard.launch.lost_ranks import Peers


def run_rank(settings: TrainSettings, config_yaml: str, fail: Callable[..., None]) -> None:
    # The runtime's headers gather with all_gather_into_tensor (at start, and where batch sizes differ), which torch
    # 2.13 flags as deprecated.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor` is deprecated.*", category=FutureWarning)
    # torchmetrics 1.0's gather of uneven shards (the eval set's last batches) indexes in a way torch 2.13 flags.
    warnings.filterwarnings("ignore", message="Using a non-tuple sequence for multidimensional indexing",
                            category=UserWarning, module="torchmetrics")
    ctx = peers = None
    failure = None  # (message, exit status, whether it is the loss of a peer)
    try:
        ctx = distributed.start(settings.topology, settings.launcher.collective_timeout_s, with_group=not settings.unsharded)
        peers = Peers.open(ctx) if ctx.world_size > 1 else None
        console = (Console() if Console().is_terminal else Console(width=160)) if ctx.is_main else None
        from embshard.train.trainer import Trainer

        trainer = Trainer(settings, ctx, console)  # plans, builds, resumes: refusals come before any output
        if ctx.is_main:
            settings.out_dir.mkdir(parents=True, exist_ok=True)
            (settings.out_dir / "config.yaml").write_text(config_yaml)
        trainer.train()
    except SharedError as e:  # the same message on every rank
        failure = (str(e), 2, False)
    except ValueError as e:
        failure = (f"{report.rank_prefix(ctx)}{e}", 2, False)
    except CheckpointError as e:
        failure = (str(e), 1, False)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except (dist.DistError, RuntimeError) as e:
        if not lost_group(e):
            raise
        lost = f"; {peers.report()}" if peers is not None else ""  # which hosts and ranks stopped answering
        failure = (f"{report.rank_prefix(ctx)}{LOST_GROUP}{lost} ({str(e).splitlines()[0][:200]})", 1, True)
    finally:
        if peers is not None:
            peers.close()
        if failure is None and ctx is not None:
            distributed.stop(ctx)
    if failure is not None:
        report.exit_failed(ctx, *failure, fail)
