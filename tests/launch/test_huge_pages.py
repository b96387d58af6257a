"""embshard, imported before torch, backs torch's large CPU tensors with huge pages (embshard/__init__.py): a
256 MiB tensor allocated afresh faults in a few hundred pages, not 65,536; THP_MEM_ALLOC_ENABLE=0 keeps torch's
default. Each case in a fresh interpreter (torch reads the variable once)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import os, resource, embshard, torch
torch.ones(1 << 26)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.ones(1 << 26)
print(os.environ.get("THP_MEM_ALLOC_ENABLE"), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES = (1 << 28) // 4096
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def probe(**env) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    value, faults = out.stdout.split()
    return value, int(faults)


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="the kernel gives no transparent huge pages")
def test_large_tensors_fault_in_huge_pages():
    value, faults = probe()
    assert value == "1" and faults < PAGES // 20, faults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page faults counted by getrusage on Linux")
def test_the_users_choice_is_kept():
    value, faults = probe(THP_MEM_ALLOC_ENABLE="0")
    assert value == "0" and faults > PAGES // 2, faults  # torch's default: every 4 KiB page faults in afresh
