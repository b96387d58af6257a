"""The command line and environment a Hydra app (`embshard-train`, `embshard-serve`) gives the
local ranks it starts: this job's overrides, its output folder, the user's config dirs."""

from __future__ import annotations

import os

from hydra.core.hydra_config import HydraConfig

USER_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR")  # the apps set it for Hydra; ranks get the user's value


def child_args() -> list[str]:
    """The command line of a rank: this job's overrides, its output folder, the user's config dirs."""
    hc = HydraConfig.get()
    args = [f"--config-dir={s.path}" for s in hc.runtime.config_sources if s.provider == "command-line"]
    return [*args, *hc.overrides.task, f"hydra.run.dir={hc.runtime.output_dir}"]


def user_env() -> dict[str, str]:
    """This process's environment as the user gave it (the apps set HYDRA_FULL_ERROR for Hydra)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    if USER_FULL_ERROR is not None:
        env["HYDRA_FULL_ERROR"] = USER_FULL_ERROR
    return env
