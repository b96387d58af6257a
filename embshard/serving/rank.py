"""One rank of embshard-serve: join the group, load the shards, then serve (rank 0) or follow.

Ranks other than 0 ignore SIGTERM/SIGINT: they stop when rank 0 sends STOP (it does on
those signals), or when the group breaks because rank 0 is gone. When another rank is gone,
rank 0 names it and how it ended, as the local launcher saw it (`reported_exits`), in its
log and in /healthz. An error is printed by the first rank to find it (launch/report.py), once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import warnings
from functools import partial
from typing import Callable, TypeVar

import torch.distributed as dist

from embshard.cli import EXIT_BAD_INPUT, fail
from embshard.serving.batching import Batcher, GroupBroken
from embshard.serving.config import EXIT_FAILED, PROG, ServeSettings
from embshard.serving.metrics import ServingMetrics
from embshard.serving.predictor import ArtifactError, Predictor
from embshard.serving.server import build_app, serve
from embshard.serving.workers import RankWorker
from embshard.topology import Topology
from embshard.launch import distributed, report
from embshard.launch.distributed import LOST_GROUP, lost_group
from embshard.cli import under_torchrun
from embshard.launch.launcher import reported_exits

LAUNCHER_NOTICE_S = 2.0  # how long rank 0 waits for the launcher to report a rank it lost
T = TypeVar("T")


def run_rank(settings: ServeSettings) -> None:
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor` is deprecated.*", category=FutureWarning)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else 1
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if under_torchrun() else 1
    ctx = None
    failure = None  # (message, exit status, whether it is the loss of a peer)
    serving = False  # rank 0 serves: the others stop when it stops them, or it finds them gone
    try:
        ctx = distributed.start(Topology(world_size=world, local_world_size=local_world, device="cpu"),
                                settings.launcher.collective_timeout_s)
        if not ctx.is_main:
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_IGN)
        worker = RankWorker(Predictor.load(settings.artifact, ctx.pg), ctx.pg)
        memory = worker.gather_memory()
        if ctx.is_main:
            serving = True
            broken = asyncio.run(serve_rank0(worker, memory, settings))
            if broken is not None:
                failure = (broken, EXIT_FAILED, False)
        else:
            worker.follow()
    except ArtifactError as e:  # raised on every rank with the same message
        failure = (str(e), EXIT_BAD_INPUT, False)
    except ValueError as e:
        failure = (report.rank_prefix(ctx) + str(e), EXIT_BAD_INPUT, False)
    except (dist.DistError, RuntimeError) as e:
        if not lost_group(e):
            raise
        failure = (f"{report.rank_prefix(ctx)}{LOST_GROUP.split(';')[0]} ({str(e).splitlines()[0][:200]})",
                   EXIT_FAILED, True)
    finally:
        if failure is None and ctx is not None:
            distributed.stop(ctx)
    if failure is not None:  # only the first rank to fail prints
        report.exit_failed(ctx, *failure, fail=partial(fail, PROG), linger=not serving)


async def serve_rank0(worker: RankWorker, memory: list[dict[str, int]], settings: ServeSettings) -> str | None:
    """Rank 0: the HTTP server until SIGTERM/SIGINT; why the group broke, if it did."""
    metrics = ServingMetrics(memory, queue_depth=lambda: batcher.queue_depth())
    batcher = Batcher(naming_lost_ranks(worker.run_batch), naming_lost_ranks(worker.heartbeat),
                      naming_lost_ranks(worker.stop), settings.batching, settings.server.heartbeat_ms, metrics)
    app = build_app(worker.predictor.schema, batcher, metrics, settings.server)
    await serve(app, batcher, settings.server, worker.world_size)
    return batcher.broken


def naming_lost_ranks(exchange: Callable[..., T]) -> Callable[..., T]:
    """``exchange``, whose failure for a lost rank becomes a `GroupBroken` naming the rank and how it ended
    (when the local launcher reports it; otherwise the failure as it was)."""
    def run(*args) -> T:
        try:
            return exchange(*args)
        except (dist.DistError, RuntimeError) as e:
            reasons = reported_exits(LAUNCHER_NOTICE_S) if lost_group(e) else []
            if not reasons:
                raise
            raise GroupBroken(f"{'; '.join(reasons)}, so the ranks cannot serve; restart {PROG}") from e
    return run
