"""Settings of the data sources (frozen values; Hydra's schemas for configs/data/ derive from them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence, Union

from hydra.core.config_store import ConfigStore

from embshard.schema import schema_of


@dataclass(frozen=True)
class SyntheticConfig:
    seed: int = 0
    id_skew: float = 1.1  # Zipf exponent of id frequencies; 0 = uniform
    signal: float = 2.0  # std of the planted logit; 0 = no signal
    positive_rate: float = 0.25  # about this share of labels is 1

    def __post_init__(self) -> None:
        if self.id_skew < 0:
            raise ValueError(f"data.id_skew: must be >= 0 (0 = uniform ids), got {self.id_skew}")
        if self.signal < 0:
            raise ValueError(f"data.signal: must be >= 0, got {self.signal}")
        if not 0 < self.positive_rate < 1:
            raise ValueError(f"data.positive_rate: must be in (0, 1), got {self.positive_rate}")


@dataclass(frozen=True)
class CriteoTsvConfig:
    train_files: tuple[str, ...] = ()
    eval_files: tuple[str, ...] = ()
    strict: bool = False  # stop at the first malformed line instead of counting and skipping it


@dataclass(frozen=True)
class CriteoNpyConfig:
    dir: str = ""
    train_days: tuple[int, ...] = (0,)
    eval_days: tuple[int, ...] = ()
    strict: bool = False  # stop at the first malformed row instead of counting and skipping it


DataConfig = Union[SyntheticConfig, CriteoTsvConfig, CriteoNpyConfig]


def check_files(files: Sequence[str], key: str) -> None:
    """Every entry of the list ``key`` (data.train_files, data.eval_files) is a file this process can read."""
    for i, path in enumerate(files):
        if os.path.isdir(path):
            raise ValueError(f"{key}[{i}]: {path} is a directory, not a Criteo day file; list the files in it, "
                             f"e.g. {key}=[{os.path.join(path, 'day_0')}]")
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise ValueError(f"{key}[{i}]: cannot read Criteo file {path} ({e.strerror}); check the path") from None


DATA_SCHEMAS = {"synthetic": SyntheticConfig, "criteo_tsv": CriteoTsvConfig, "criteo_npy": CriteoNpyConfig}


def register_data_schemas() -> None:
    """The typed schemas the data/ options start from (embshard/configs/data/NAME.yaml: /schema/data/NAME)."""
    cs = ConfigStore.instance()
    for name, cls in DATA_SCHEMAS.items():
        cs.store(group="schema/data", name=name, node=schema_of(cls))
