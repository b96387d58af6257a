"""One rank of a training run: join the group, train, turn failures into one readable line."""

from __future__ import annotations

import warnings
from typing import Callable

import torch.distributed as dist
from rich.console import Console

from embshard.train import distributed
from embshard.train.config import TrainSettings
from embshard.train.checkpoint import CheckpointError
from embshard.train.distributed import LOST_GROUP, SharedError, lost_group
from embshard.train.lost_ranks import Peers


def run_rank(settings: TrainSettings, config_yaml: str, fail: Callable[..., None]) -> None:
    # The runtime's header gather uses all_gather_into_tensor, which torch 2.13 flags as deprecated.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor` is deprecated.*", category=FutureWarning)
    ctx = peers = None
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
    except SharedError as e:
        if ctx is None or ctx.is_main:
            fail(str(e))
        raise SystemExit(2) from None
    except ValueError as e:
        prefix = f"rank {ctx.rank}: " if ctx is not None and ctx.world_size > 1 else ""
        fail(prefix + str(e))
    except CheckpointError as e:
        fail(str(e), code=1)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except (dist.DistError, RuntimeError) as e:
        if not lost_group(e):
            raise
        rank = ctx.rank if ctx is not None else "?"
        lost = f"; {peers.report()}" if peers is not None else ""
        fail(f"rank {rank}: {LOST_GROUP}{lost} ({str(e).splitlines()[0][:200]})", code=1)
    finally:
        if peers is not None:
            peers.close()
        if ctx is not None:
            distributed.stop(ctx)
