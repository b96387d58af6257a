"""The console scripts of pyproject.toml: `--version`, else the app's main().

    embshard-plan --version      # embshard-plan 0.1.0

An app whose install layer is missing (e.g. embshard-train without torch) ends with exit
status 2 and one line naming what to install, not an import traceback.
"""

from __future__ import annotations

import importlib
import sys

from embshard import __version__
from embshard.cli import fail
from embshard.extras import MissingExtra

APPS = {
    "embshard-plan": "embshard.plan_cli",
    "embshard-calibrate": "embshard.calibrate.cli",
    "embshard-train": "embshard.train.main",
    "embshard-serve": "embshard.serving.serve_cli",
    "embshard-export": "embshard.serving.export_cli",
    "embshard-stats": "embshard.stats.cli",
}


def run(prog: str) -> None:
    """Print the version for ``--version``, else import the app (lazily: its layer may be missing) and run it."""
    if "--version" in sys.argv[1:]:
        print(f"{prog} {__version__}")
        return
    try:
        importlib.import_module(APPS[prog]).main()
    except MissingExtra as e:
        fail(prog, str(e))


def plan() -> None:
    run("embshard-plan")


def calibrate() -> None:
    run("embshard-calibrate")


def train() -> None:
    run("embshard-train")


def serve() -> None:
    run("embshard-serve")


def export() -> None:
    run("embshard-export")


def stats() -> None:
    run("embshard-stats")
