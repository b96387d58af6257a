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
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, Optional

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from embshard.cli import fail, run_hydra_app
from embshard.serving.batching import BatchingConfig
from embshard.serving.server import ServerConfig
from embshard.train.launcher import LauncherConfig, launch, under_torchrun
from embshard.train.main import CONFIG_DIR, child_args, user_env
from embshard.train.schema import schema_of, value_of

EXIT_FAILED = 1  # a rank lost the group (bad input: embshard.cli.EXIT_BAD_INPUT)
PROG = "embshard-serve"


@dataclass(frozen=True)
class ExportOptions:
    """How ``checkpoint=`` is exported before serving (embshard-export's options of the same names)."""

    out: str = ""  # the artifact folder ("" = ``<checkpoint>/serving_artifact``, replaced at each start)
    dtype: str = "fp32"  # every table's serving dtype: fp32 | fp16 | int8 ...
    table_dtypes: Dict[str, str] = field(default_factory=dict)  # ... except these (table -> dtype)


@dataclass
class ServeConfig:
    artifact: Optional[str] = None  # an embshard-export folder
    checkpoint: Optional[str] = None  # or an embshard-train out_dir: exported first (export.*)
    export: schema_of(ExportOptions) = field(default_factory=schema_of(ExportOptions))  # type: ignore[valid-type]
    server: schema_of(ServerConfig) = field(default_factory=schema_of(ServerConfig))  # type: ignore[valid-type]
    batching: schema_of(BatchingConfig) = field(default_factory=schema_of(BatchingConfig))  # type: ignore[valid-type]
    launcher: schema_of(LauncherConfig) = field(default_factory=schema_of(LauncherConfig))  # type: ignore[valid-type]


ConfigStore.instance().store(name="serve_schema", node=ServeConfig)


@dataclass(frozen=True)
class ServeSettings:
    artifact: Path | None
    checkpoint: Path | None
    export: ExportOptions
    server: ServerConfig
    batching: BatchingConfig
    launcher: LauncherConfig


def settings_from_config(cfg: DictConfig) -> ServeSettings:
    """Validate the composed config; ValueError names the key and how to fix it."""
    obj = OmegaConf.to_object(cfg)
    s = ServeSettings(artifact=Path(obj.artifact) if obj.artifact else None,
                      checkpoint=Path(obj.checkpoint) if obj.checkpoint else None, export=value_of(obj.export),
                      server=value_of(obj.server),
                      batching=value_of(obj.batching), launcher=value_of(obj.launcher))
    if (s.artifact is None) == (s.checkpoint is None):
        raise ValueError("artifact / checkpoint: give exactly one (artifact=DIR from embshard-export, or "
                         "checkpoint=DIR, an embshard-train out_dir)")
    source, path = ("artifact", s.artifact) if s.artifact is not None else ("checkpoint", s.checkpoint)
    if not path.is_dir():
        raise ValueError(f"{source}: {path} is not a folder; give the folder embshard-"
                         f"{'export' if source == 'artifact' else 'train'} wrote")
    positive = {"server.max_request_samples": s.server.max_request_samples, "server.max_body_bytes":
                s.server.max_body_bytes, "server.request_timeout_ms": s.server.request_timeout_ms,
                "server.heartbeat_ms": s.server.heartbeat_ms, "batching.max_batch_size": s.batching.max_batch_size,
                "launcher.nproc": s.launcher.nproc, "launcher.collective_timeout_s": s.launcher.collective_timeout_s}
    for key, value in positive.items():
        if not value > 0:
            raise ValueError(f"{key}: must be positive, got {value}")
    if s.batching.max_wait_ms < 0 or s.server.shutdown_timeout_s < 0:
        raise ValueError("batching.max_wait_ms and server.shutdown_timeout_s: must be >= 0")
    if not 0 <= s.server.port <= 65535:
        raise ValueError(f"server.port: {s.server.port} is not a port; use 1..65535, or 0 for any free port")
    if s.server.heartbeat_ms >= s.launcher.collective_timeout_s * 1000 / 2:
        raise ValueError(f"server.heartbeat_ms: {s.server.heartbeat_ms:g} ms, not well under launcher."
                         f"collective_timeout_s={s.launcher.collective_timeout_s:g} s; idle ranks would time out. "
                         "Lower the heartbeat or raise the timeout")
    return s


def export_checkpoint(settings: ServeSettings) -> ServeSettings:
    """Export ``settings.checkpoint`` for ``launcher.nproc`` ranks; the settings with that artifact to serve."""
    if under_torchrun():
        fail(PROG, "checkpoint: under torchrun, export first (embshard-export checkpoint=DIR out=ART world_size=N) and "
             "start the ranks with artifact=ART")
    from embshard.serving.export import ExportSettings, export  # torch: only when exporting

    options = settings.export
    out = Path(options.out) if options.out else settings.checkpoint / "serving_artifact"
    try:
        artifact = export(ExportSettings(checkpoint=settings.checkpoint, out=out, world_size=settings.launcher.nproc,
                                         dtype=options.dtype, table_dtypes=options.table_dtypes,
                                         overwrite=not options.out))
    except ValueError as e:
        fail(PROG, f"checkpoint={settings.checkpoint}: {e}")
    print(f"{PROG}: exported {settings.checkpoint} to {artifact} ({settings.launcher.nproc} rank(s))", flush=True)
    return replace(settings, artifact=artifact, checkpoint=None)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="serve")
def hydra_main(cfg: DictConfig) -> None:
    try:
        settings = settings_from_config(cfg)
    except (ValueError, OmegaConfBaseException) as e:
        fail(PROG, str(e))
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

    run_rank(settings)


def main() -> None:
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)  # a torchrec import-time notice
    run_hydra_app(PROG, hydra_main)


if __name__ == "__main__":
    main()
