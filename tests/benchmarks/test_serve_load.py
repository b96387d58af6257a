"""benchmarks/serve_load.py's results header: the machine, the commit, the load before and after, and which malloc the
servers ran (the reference's and embshard's alike)."""

from __future__ import annotations

import argparse
from pathlib import Path

from embshard.machine import cpu_model


def _args(malloc: str) -> argparse.Namespace:
    return argparse.Namespace(split_fraction=0.75, samples_per_request=4, duration_s=4.0, repeats=3, malloc=malloc)


def _markdown(serve_load, malloc: str) -> str:
    return serve_load.markdown([], _args(malloc), Path("run"), "abc1234", ("0.50 0.40 0.30", "1.50 1.40 1.30"))


def test_the_results_name_the_servers_malloc(load_benchmark):
    serve_load, local_ranks = load_benchmark("serve_load"), load_benchmark("local_ranks")
    kept = _markdown(serve_load, "kept")
    assert f"every server's processes: glibc malloc keeping freed memory (GLIBC_TUNABLES={local_ranks.MALLOC_TUNABLES}" in kept
    assert "every server's processes: glibc malloc at its default settings." in _markdown(serve_load, "default")


def test_the_results_name_the_machine_commit_and_load(load_benchmark):
    header = _markdown(load_benchmark("serve_load"), "kept")
    assert f"Machine: {cpu_model()}, " in header and "Commit: abc1234." in header
    assert "Load average (1, 5, 15 min) before / after the run: 0.50 0.40 0.30 / 1.50 1.40 1.30." in header
