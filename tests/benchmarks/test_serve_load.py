"""benchmarks/serve_load.py's results header: which malloc the servers ran (the reference's and embshard's alike)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _args(malloc: str) -> argparse.Namespace:
    return argparse.Namespace(split_fraction=0.75, samples_per_request=4, duration_s=4.0, repeats=3, malloc=malloc)


def test_the_results_name_the_servers_malloc(load_benchmark):
    serve_load, local_ranks = load_benchmark("serve_load"), load_benchmark("local_ranks")
    kept = serve_load.markdown([], _args("kept"), Path("run"))
    assert f"every server's processes: glibc malloc keeping freed memory (GLIBC_TUNABLES={local_ranks.MALLOC_TUNABLES}" in kept
    default = serve_load.markdown([], _args("default"), Path("run"))
    assert "every server's processes: glibc malloc at its default settings." in default
