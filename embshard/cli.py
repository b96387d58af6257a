"""Shared by embshard's Hydra apps: their config folder, and one readable line for bad input.

    from embshard.cli import fail, run_hydra_app

    def main() -> None:
        run_hydra_app("embshard-plan", hydra_main)   # hydra_main: the @hydra.main function

Bad input ends with exit status 2 and ``PROG: error: ...`` on one stderr line, no traceback.
Hydra prints its own config errors (unknown option, bad override, unreadable YAML) over
several lines; `run_hydra_app` makes Hydra raise them instead and ends them the same way,
unless the user set HYDRA_FULL_ERROR=1 to see Hydra's tracebacks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, NoReturn

import yaml
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

EXIT_BAD_INPUT = 2
CONFIG_DIR = str(Path(__file__).resolve().parent / "configs")  # package data: embshard/configs/


def fail(prog: str, message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Exit with status ``code`` (2: bad input) and the message on one stderr line (Hydra's messages span several)."""
    one_line = " ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"{prog}: error: {one_line}", file=sys.stderr, flush=True)
    sys.exit(code)


def run_hydra_app(prog: str, hydra_main: Callable[[], None]) -> None:
    """Run a @hydra.main function; Hydra's config errors end as `fail(prog, ...)`."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the user asked for Hydra's tracebacks
        hydra_main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises its config errors instead of printing them
    try:
        hydra_main()
    except (HydraException, OmegaConfBaseException, yaml.YAMLError, OSError) as e:  # includes unreadable config files
        message = str(e).split("Config search path:")[0]  # the search path listing is noise here
        if e.__cause__ is not None:  # "Error merging override x=y" says what, its cause says why
            message += ": " + str(e.__cause__).split("\n    full_key")[0]
        fail(prog, message)
    finally:
        del os.environ["HYDRA_FULL_ERROR"]
