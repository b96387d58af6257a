"""Loading a benchmark script (benchmarks/ is not a package) as a module, for tests of its helpers."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    """benchmarks/<name>.py, imported under that name."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_benchmark():
    """The loader: ``load_benchmark("planner_scale")`` is benchmarks/planner_scale.py as a module."""
    return _load
