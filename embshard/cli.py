"""Shared by embshard's Hydra apps: their config folder, and one readable line for bad input.

    from embshard.cli import fail, run_hydra_app

    def main() -> None:
        run_hydra_app("embshard-plan", hydra_main)   # hydra_main: the @hydra.main function

Bad input ends with exit status 2 and ``PROG: error: ...`` on one stderr line, no traceback.
Hydra prints its own config errors (unknown option, bad override, unreadable YAML, a config
file that is not UTF-8 text) over several lines; `run_hydra_app` makes Hydra raise them instead
and ends them the same way, unless the user set HYDRA_FULL_ERROR=1 to see Hydra's tracebacks.
Under torchrun every process reads the config and finds the same errors: `fail_config` has the
first process of each host print them, once.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Callable, NoReturn

import yaml
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

EXIT_BAD_INPUT = 2
QUIET_RANK_WAIT_S = 10.0  # how long a quiet torchrun process waits for its host's first to report (see fail_config)
CONFIG_DIR = str(Path(__file__).resolve().parent / "configs")  # package data: embshard/configs/
RANK_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what torchrun (or any rank launcher) sets


def under_torchrun() -> bool:
    """This process is one rank of a job started by torchrun (its rank variables are set)."""
    return all(k in os.environ for k in RANK_ENV)


def fail(prog: str, message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Exit with status ``code`` (2: bad input) and the message on one stderr line (Hydra's messages span several)."""
    one_line = " ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"{prog}: error: {one_line}", file=sys.stderr, flush=True)
    sys.exit(code)


def fail_config(prog: str, message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """`fail` for an error in the config, which every process of a torchrun job finds alike: the first process of
    each host (LOCAL_RANK 0) prints it. The others wait up to QUIET_RANK_WAIT_S before they exit, as torchrun stops
    all processes when one exits (a quiet one exiting first could stop the one that would print); one still running
    by then prints the error itself."""
    if under_torchrun() and os.environ.get("LOCAL_RANK", os.environ["RANK"]) != "0":
        time.sleep(QUIET_RANK_WAIT_S)
    fail(prog, message, code)


def run_hydra_app(prog: str, hydra_main: Callable[[], None]) -> None:
    """Run a @hydra.main function; Hydra's config errors end as `fail_config(prog, ...)`."""
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
        fail_config(prog, message)
    except UnicodeDecodeError as e:  # Hydra reads config files as UTF-8 text
        where = _file_being_read(e.__traceback__) or "a config file"
        fail_config(prog, f"{where}: not UTF-8 text ({e.reason} at byte {e.start}); config files are YAML in UTF-8: "
                          "check that tables=NAME (or --config-dir) names the file you meant")
    finally:
        del os.environ["HYDRA_FULL_ERROR"]


def _file_being_read(tb: TracebackType | None) -> str | None:
    """The config file Hydra was reading where ``tb`` ends (its FileConfigSource's ``full_path``), if any."""
    path = None
    while tb is not None:
        path = tb.tb_frame.f_locals.get("full_path", path)
        tb = tb.tb_next
    return path if isinstance(path, str) else None
