"""embshard-export: write a serving artifact from an embshard-train run (Hydra app, configs/export.yaml).

    embshard-export checkpoint=outputs/train/RUN out=artifacts/RUN world_size=2 split=true dtype=int8

Bad input (missing or corrupt checkpoint, unknown table or dtype, a plan that does not fit)
ends with exit status 2 and one line, ``embshard-export: error: ...``; nothing is left at ``out``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from embshard.cli import CONFIG_DIR, fail, run_hydra_app
from embshard.serving.config import num_ranks

PROG = "embshard-export"


@dataclass
class ExportConfig:
    """Typed schema of configs/export.yaml: a typo or a wrong type fails at start with the key named."""

    checkpoint: str = MISSING
    out: str = MISSING
    world_size: int = 2
    dtype: str = "fp32"
    table_dtypes: Dict[str, str] = field(default_factory=dict)
    hbm_gib: float = 16.0
    batch_size_per_rank: int = 512
    time_budget_s: float = 2.0
    overwrite: bool = False
    split: bool = False
    constraints: Dict[str, Any] = field(default_factory=dict)  # checked by Constraints.from_dict, which names the key


ConfigStore.instance().store(name="export_schema", node=ExportConfig)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="export")
def hydra_main(cfg: DictConfig) -> None:
    try:
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        from embshard.serving.export import ExportSettings, export  # torch: only once the config is good

        settings = ExportSettings(**{**raw, "checkpoint": Path(raw["checkpoint"]), "out": Path(raw["out"])})
        out = export(settings)
    except (ValueError, OmegaConfBaseException) as e:
        fail(PROG, str(e))
    print(f"wrote {out} ({num_ranks(settings.world_size, 'serving rank')})", flush=True)


def main() -> None:
    run_hydra_app(PROG, hydra_main)


if __name__ == "__main__":
    main()
