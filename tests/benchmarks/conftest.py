"""Loading a benchmark script (benchmarks/ is not a package) as a module, for tests of its helpers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    """benchmarks/<name>.py, imported under that name (benchmarks/ on sys.path, as when it runs: it imports its
    neighbours, which then are the modules this loads)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_benchmark():
    """The loader: ``load_benchmark("planner_scale")`` is benchmarks/planner_scale.py as a module."""
    return _load
