"""embshard-serve's configuration: Hydra schema (type-checked at start) and the frozen settings.

`ServeConfig` is the structured-config schema behind configs/serve.yaml; each component owns
its frozen config (`ServerConfig`, `BatchingConfig`, the launcher's `LauncherConfig`).
`settings_from_config` validates the composed config into `ServeSettings`. Light imports
only: the launching process never loads torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from embshard.launch.launcher import LauncherConfig
from embshard.schema import schema_of, value_of

PROG = "embshard-serve"
EXIT_FAILED = 1  # a rank lost the group (bad input: embshard.cli.EXIT_BAD_INPUT)


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP front end (embshard/serving/server.py)."""

    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port (printed, and written to port_file)
    port_file: Optional[str] = None  # write the port here once listening (for scripts and tests)
    max_request_samples: int = 1024  # more samples (or lookup ids) in one request: 413
    max_bag_ids: int = 16384  # more ids in one sample's feature: 413
    max_request_ids: int = 1 << 20  # more ids in one /predict: 413
    max_body_bytes: int = 64 << 20  # larger bodies: 413
    read_timeout_ms: float = 10000.0  # a request's headers, then its body, must arrive within this (else 408 / closed)
    request_timeout_ms: float = 5000.0  # a request not answered by then gets 503
    heartbeat_ms: float = 1000.0  # idle ranks hear from rank 0 this often (well under the collective timeout)
    shutdown_timeout_s: float = 10.0  # on SIGTERM, requests in flight get this long to finish
    debug_delay: bool = False  # accept the X-Embshard-Debug-Delay-Ms header (the last rank sleeps; tests of 503)


@dataclass(frozen=True)
class BatchingConfig:
    """How requests are grouped before they go to the ranks (embshard/serving/batching.py)."""

    max_batch_size: int = 256  # samples (predict) or ids (lookup) per batch
    max_wait_ms: float = 2.0  # how long a batch's first request waits for more


@dataclass(frozen=True)
class ExportOptions:
    """How ``checkpoint=`` is exported before serving (embshard-export's options of the same names)."""

    out: str = ""  # the artifact folder ("" = ``<checkpoint>/serving_artifact`` for a run folder, replaced at each start)
    dtype: str = "fp32"  # every table's serving dtype: fp32 | fp16 | int8 ...
    table_dtypes: Dict[str, str] = field(default_factory=dict)  # ... except these (table -> dtype)
    split: bool = False  # no table replicated: every rank holds only its shards


@dataclass
class ServeConfig:
    artifact: Optional[str] = None  # an embshard-export folder
    checkpoint: Optional[str] = None  # or an embshard-train out_dir: exported first (export.*)
    export: schema_of(ExportOptions) = field(default_factory=schema_of(ExportOptions))  # type: ignore[valid-type]
    server: schema_of(ServerConfig) = field(default_factory=schema_of(ServerConfig))  # type: ignore[valid-type]
    batching: schema_of(BatchingConfig) = field(default_factory=schema_of(BatchingConfig))  # type: ignore[valid-type]
    launcher: schema_of(LauncherConfig) = field(default_factory=schema_of(LauncherConfig))  # type: ignore[valid-type]


def register() -> None:
    ConfigStore.instance().store(name="serve_schema", node=ServeConfig)


@dataclass(frozen=True)
class ServeSettings:
    artifact: Path | None
    checkpoint: Path | None
    export: ExportOptions
    server: ServerConfig
    batching: BatchingConfig
    launcher: LauncherConfig


def num_ranks(n: int, noun: str = "rank") -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def settings_from_config(cfg: DictConfig) -> ServeSettings:
    """Validate the composed config; ValueError names the key and how to fix it."""
    obj = OmegaConf.to_object(cfg)
    s = ServeSettings(artifact=Path(obj.artifact) if obj.artifact else None,
                      checkpoint=Path(obj.checkpoint) if obj.checkpoint else None, export=value_of(obj.export),
                      server=value_of(obj.server), batching=value_of(obj.batching), launcher=value_of(obj.launcher))
    if (s.artifact is None) == (s.checkpoint is None):
        raise ValueError("artifact / checkpoint: give exactly one (artifact=DIR from embshard-export, or "
                         "checkpoint=DIR, an embshard-train out_dir)")
    source, path = ("artifact", s.artifact) if s.artifact is not None else ("checkpoint", s.checkpoint)
    if not path.is_dir():
        raise ValueError(f"{source}: {path} is not a folder; give the folder embshard-"
                         f"{'export' if source == 'artifact' else 'train'} wrote")
    if s.checkpoint is not None and not s.export.out and not (s.checkpoint / "config.yaml").is_file():
        raise ValueError(f"export.out: checkpoint={s.checkpoint} is not a run folder (no config.yaml), so the artifact "
                         "has no default place; give export.out=DIR, or checkpoint= the run's out_dir")
    positive = {"server.max_request_samples": s.server.max_request_samples, "server.max_bag_ids": s.server.max_bag_ids,
                "server.max_request_ids": s.server.max_request_ids, "server.max_body_bytes": s.server.max_body_bytes,
                "server.read_timeout_ms": s.server.read_timeout_ms,
                "server.request_timeout_ms": s.server.request_timeout_ms,
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


